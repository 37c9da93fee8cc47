"""The trainer's collectives on a group outside torch's registry: what every NCCL generation
after the first is (trainer/comm.py), run here with gloo through the same calls, in two real
processes."""

from __future__ import annotations

import json
import weakref
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed import PrefixStore, TCPStore  # type: ignore[attr-defined]
from unicron.shared.procs import free_port
from unicron.trainer import comm, statecast


def _rank(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    store = TCPStore("127.0.0.1", port, 2, rank == 0, timeout=timedelta(seconds=30))
    # generation 1: torch's default group, as the first generation of any job
    dist.init_process_group("gloo", store=PrefixStore("g1", store), rank=rank, world_size=2)
    # generation 2: built directly, unregistered, as NCCL's later generations are
    group = comm.direct_group("gloo", PrefixStore("g2", store), rank, 2, timedelta(seconds=30))
    cpu = torch.device("cpu")
    grads = torch.full((4,), float(rank + 1))
    comm.all_reduce_sum(grads, group)
    holdings = comm.all_gather_object({"rank": rank, "step": 10 + rank}, group, cpu)
    state = {"w": torch.arange(3.0) * 7, "step": 11} if rank == 1 else None
    received = comm.broadcast_object(state, 1, group, cpu)
    sent = training_state()  # built alike on both ranks; only rank 1's is sent
    arrived = statecast.broadcast_state(sent if rank == 1 else None, 1, group, cpu)
    result = {
        "state_identical": same(arrived, sent),
        "grads": grads.tolist(), "holdings": holdings,
        "w": received["w"].tolist(), "step": received["step"],
        "registered_default_intact": dist.get_world_size() == 2,
    }  # fmt: skip
    Path(out, f"{rank}.json").write_text(json.dumps(result))


def training_state() -> dict[str, object]:
    """What a state transfer carries: tensors of several dtypes and shapes (a 0-d step, a bool
    mask that travels pickled), nested in dicts and lists, beside plain values."""
    gen = torch.Generator().manual_seed(3)
    return {
        "model": {"w": torch.randn(3, 4, generator=gen), "ids": torch.arange(5)},
        "optimizer": {
            "state": {0: {"step": torch.tensor(7.0), "exp_avg": torch.randn(4, generator=gen)}},
            "param_groups": [{"lr": 0.1, "params": [0]}],
        },
        "half": torch.randn(2, generator=gen).half(),
        "mask": torch.tensor([True, False]),
        "step": 11,
    }


def same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def test_collectives_run_on_a_group_torch_does_not_know(tmp_path: Path) -> None:
    mp.start_processes(_rank, args=(free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    results = [json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1)]
    for got in results:
        assert got["grads"] == [3.0] * 4  # the sum over both ranks
        assert got["holdings"] == [{"rank": 0, "step": 10}, {"rank": 1, "step": 11}]
        assert (got["w"], got["step"]) == ([0.0, 7.0, 14.0], 11)  # rank 1's state, everywhere
        assert got["registered_default_intact"]
        assert got["state_identical"]  # every tensor bit for bit, every value, every dtype


def test_an_nccl_group_is_aborted_once_and_never_destroyed_on_leaving(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After an abort, destroy_process_group hangs (docs/gpu-probe.md): leaving an NCCL group
    only aborts it, once, even when a directive aborted it already."""
    calls: list[str] = []

    class Backend:
        def abort(self) -> None:
            calls.append("abort")

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "destroy_process_group", lambda *a: calls.append("destroy"))
    group = Backend()
    comm.abort(group)  # type: ignore[arg-type]  # the directive, on the reader thread
    comm.leave(lambda: group, "nccl")  # type: ignore[arg-type,return-value]  # then the training thread leaves
    assert calls == ["abort"]
    comm.leave(lambda: None, "gloo")
    assert calls == ["abort", "destroy"]  # gloo's generations do end in a destroy


def test_leaving_a_gloo_group_frees_it_at_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A gloo group still referenced after its destroy keeps its connections, and the peers
    waiting on this rank, until a garbage collection: each regroup paid one (0.17 s of a
    0.42-s recovery in bench/recover.py) while the caller's frame held the group."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    held = {"group": dist.group.WORLD}
    alive = weakref.ref(held["group"])
    collections: list[int] = []
    monkeypatch.setattr(comm.gc, "collect", lambda *_: collections.append(1) or 0)
    comm.leave(lambda: held.pop("group"), "gloo")
    assert alive() is None and not dist.is_initialized()
    assert collections == []  # freed by the destroy itself, no collection needed
