"""A generation's communicator, per backend, and the collectives the trainer runs on it.

Every generation of a job has a fresh group, formed through the agent's store under the
generation's prefix (docs/design.md §5). How a rank joins, leaves and breaks a group depends
on the backend, and that is all this module decides (``BACKENDS``):

- **gloo**: a generation is torch's default group (``init_process_group``), and leaving
  destroys it: its connections close when it is freed, which frees peers still waiting on this
  rank, and torch.distributed's default group keeps meaning "this generation" for user code.
- **nccl** (measured on an H200, docs/gpu-probe.md): a rank blocked in a collective on a dead
  peer stays blocked whatever ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` says, so the control plane's
  regroup directive makes the channel's thread *abort* the communicator (:func:`abort`), which
  frees the blocked thread in ~0.1 s and keeps the CUDA context and the model on the device;
  the next collective raises "NCCL communicator was aborted", a peer failure. Destroying a
  group after that hangs, so an aborted group is only dropped, and every later generation is a
  ``ProcessGroupNCCL`` built directly on the generation's store prefix, outside c10d's registry.
  Error handling is off (``TORCH_NCCL_ASYNC_ERROR_HANDLING=0``) so that the watchdog never tears
  the process down first. A communicator whose init waits for a peer that never comes cannot
  be aborted (the probe's abort hung): the park timeout ends that rank instead.

Because a directly built group is not registered with c10d, the trainer's collectives go
through the group object's own methods here, never through torch.distributed's module
functions, which want a registered group; gloo's groups take the same path, so the CPU tests
run the code an NCCL job runs.
"""

from __future__ import annotations

import gc
import os
import pickle
import weakref
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

# torch re-exports the stores from its C extension without listing them for type checkers.
from torch.distributed import PrefixStore, TCPStore  # type: ignore[attr-defined]
from unicron.shared.contracts.workerchannel import WorkerLaunch
from unicron.shared.logging import get_logger

log = get_logger(component="unicron.trainer.comm")
NCCL_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
_aborted: weakref.WeakSet[dist.ProcessGroup] = weakref.WeakSet()


def join(
    launch: WorkerLaunch, backend: str, store_timeout_s: float, timeout_s: float
) -> dist.ProcessGroup:
    """Form ``launch``'s generation's group through the agent's store."""
    rendezvous = launch.rendezvous
    store = TCPStore(
        rendezvous.host, rendezvous.port, is_master=False,
        timeout=timedelta(seconds=store_timeout_s),
    )  # fmt: skip
    prefixed = PrefixStore(rendezvous.prefix, store)
    timeout = timedelta(seconds=timeout_s)
    if backend == "nccl":
        os.environ.setdefault(NCCL_ERROR_HANDLING, "0")  # read when a communicator is made
        if dist.is_initialized():  # an earlier generation's default group, aborted or not
            return direct_group(backend, prefixed, launch.rank, launch.world_size, timeout)
    dist.init_process_group(
        backend=backend, store=prefixed, rank=launch.rank, world_size=launch.world_size,
        timeout=timeout,
    )  # fmt: skip
    group = dist.group.WORLD
    assert group is not None  # init_process_group just created it
    return group


def direct_group(
    backend: str, store: Any, rank: int, world: int, timeout: timedelta
) -> dist.ProcessGroup:
    """A group built on ``store`` outside c10d's registry (the seam CPU tests take with gloo)."""
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        group: Any = dist.ProcessGroupNCCL(store, rank, world, options)
    else:
        group = dist.ProcessGroupGloo(store, rank, world, timeout)
    return group  # type: ignore[no-any-return]


def leave(take: Callable[[], dist.ProcessGroup | None], backend: str) -> None:
    """Let go of this rank's group. ``take`` hands it over and drops the caller's references:
    a group passed as an argument would stay referenced by the caller's frame until this
    returns, so gloo could not free it here (that free closes its connections, which frees the
    peers still waiting on this rank) and every regroup paid a ``gc.collect`` (~0.17 s at the
    regroup, bench/recover.py) for nothing."""
    group = take()
    if backend == "nccl":
        if group is not None:
            abort(group)  # never destroy: after an abort that hangs (docs/gpu-probe.md)
        return
    if not dist.is_initialized():
        return
    alive = weakref.ref(group) if group is not None else None
    del group
    dist.destroy_process_group()
    if alive is not None and alive() is not None:
        gc.collect()  # a reference cycle still holds it: slow (~0.1 s), so only then
    if alive is not None and alive() is not None:
        log.warning("old process group still referenced; peers wait for its timeout")


def abort(group: dist.ProcessGroup) -> None:
    """Abort an NCCL group's communicators from any thread, once; a collective blocked on them
    in another thread raises. Never raises itself: it runs on the channel's reader thread."""
    if group in _aborted:
        return
    _aborted.add(group)
    try:
        backend: Any = group
        if isinstance(group, dist.ProcessGroup):
            backend = group._get_backend(torch.device("cuda"))
        backend.abort()
    except Exception as exc:
        log.warning("communicator abort failed", error=repr(exc))


def all_reduce_sum(tensor: torch.Tensor, group: dist.ProcessGroup) -> None:
    options = dist.AllreduceOptions()
    options.reduceOp = dist.ReduceOp(dist.ReduceOp.SUM)
    group.allreduce([tensor], options).wait()


def all_gather_object(obj: object, group: dist.ProcessGroup, device: torch.device) -> list[Any]:
    """Every rank's ``obj``, in rank order (pickled, as torch.distributed does)."""
    data = _to_tensor(obj, device)
    size = torch.tensor([data.numel()], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(group.size())]
    group.allgather([sizes], [size]).wait()
    longest = max(int(s.item()) for s in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[: data.numel()] = data
    gathered = [torch.empty_like(padded) for _ in sizes]
    group.allgather([gathered], [padded]).wait()
    return [_from_tensor(t[: int(s.item())]) for t, s in zip(gathered, sizes, strict=True)]


def broadcast_object(obj: object, src: int, group: dist.ProcessGroup, device: torch.device) -> Any:
    """``src``'s ``obj`` on every rank (what others pass is ignored)."""
    mine = group.rank() == src
    data = _to_tensor(obj, device) if mine else torch.empty(0, dtype=torch.uint8, device=device)
    size = torch.tensor([data.numel()], dtype=torch.int64, device=device)
    broadcast(size, src, group)
    if not mine:
        data = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    broadcast(data, src, group)
    return obj if mine else _from_tensor(data)


def broadcast(tensor: torch.Tensor, src: int, group: dist.ProcessGroup) -> None:
    options = dist.BroadcastOptions()
    options.rootRank, options.rootTensor = src, 0
    group.broadcast([tensor], options).wait()


def _to_tensor(obj: object, device: torch.device) -> torch.Tensor:
    return torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8).to(device)


def _from_tensor(tensor: torch.Tensor) -> Any:
    return pickle.loads(tensor.cpu().numpy().tobytes())
