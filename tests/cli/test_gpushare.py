"""One host's GPUs shared among the node agents ``unicron up`` and ``unicron demo`` start
(issue 21): each agent gets a share of its own and one slot per GPU of it, never a GPU another
agent has; fewer GPUs than agents run on the CPU and say so; a ``--slots`` the GPUs cannot give is
refused before anything starts. On CPU through the stack's seam: the host's devices as a list."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner
from unicron.cli import stack as stack_module
from unicron.cli.gpushare import GpuShare, GpuShareError, share_gpus
from unicron.cli.main import app
from unicron.cli.stack import Stack, StackConfig
from unicron.shared.procs import free_port


def test_each_agent_gets_a_share_of_its_own_and_a_slot_per_gpu_of_it() -> None:
    share = share_gpus(["0", "1", "2", "3", "4"], nodes=2, slots=None)
    assert share.envs == [
        {"CUDA_VISIBLE_DEVICES": "0,1,2", "UNICRON_SLOTS": "3"},
        {"CUDA_VISIBLE_DEVICES": "3,4", "UNICRON_SLOTS": "2"},
    ]
    assert share.note == "5 GPU(s) shared among 2 node agent(s): node-0: 0,1,2; node-1: 3,4"
    fewer = share_gpus(["GPU-aa", "GPU-bb", "GPU-cc", "GPU-dd"], nodes=2, slots=1)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in fewer.envs] == ["GPU-aa,GPU-bb", "GPU-cc,GPU-dd"]
    assert {e["UNICRON_SLOTS"] for e in fewer.envs} == {"1"}


def test_a_cpu_host_keeps_two_slots_an_agent_or_what_slots_says() -> None:
    assert share_gpus([], nodes=2, slots=None).envs == [{"UNICRON_SLOTS": "2"}] * 2
    assert share_gpus([], nodes=1, slots=5) == GpuShare([{"UNICRON_SLOTS": "5"}])


def test_fewer_gpus_than_agents_run_on_the_cpu_and_say_how_to_use_the_gpu() -> None:
    share = share_gpus(["0"], nodes=2, slots=None)
    assert share.envs == [{"CUDA_VISIBLE_DEVICES": "", "UNICRON_SLOTS": "2"}] * 2
    assert share.note is not None and "run on the CPU" in share.note and "--nodes 1" in share.note


def test_more_slots_than_an_agent_s_share_is_refused_with_the_reason() -> None:
    with pytest.raises(GpuShareError, match=r"--slots 3 is more than the 2 GPU\(s\) an agent"):
        share_gpus(["0", "1", "2", "3"], nodes=2, slots=3)


def test_unicron_up_refuses_slots_its_gpus_cannot_give_with_exit_2_and_starts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stack_module, "visible_devices", lambda: ["0", "1"])
    data = tmp_path / "up"
    result = CliRunner().invoke(
        app, ["up", "--nodes", "2", "--slots", "2", "--data-dir", str(data)]
    )
    assert result.exit_code == 2, result.output
    assert "--slots 2 is more than the 1 GPU(s) an agent gets" in " ".join(result.output.split())
    assert not (data / "nats").exists() and not (data / "redis").exists()


def agent_env(stack: Stack, node_id: str) -> dict[str, str]:
    """The environment the agent process runs with, as the kernel has it."""
    child = stack.children[f"agent-{node_id}"]
    assert child.process is not None
    raw = Path(f"/proc/{child.process.pid}/environ").read_bytes()
    pairs = (item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)
    return dict(pairs)


def test_the_stack_starts_each_agent_on_its_own_gpus(
    nats_url: str, redis_url: str, tmp_path: Path
) -> None:
    config = StackConfig(
        nodes=2, nats_url=nats_url, redis_url=redis_url, api_port=free_port(),
        data_dir=tmp_path / "stack", devices=["0", "1", "2"],
    )  # fmt: skip
    with Stack(config) as stack:  # start() returns once both nodes registered
        seen = {n: agent_env(stack, n) for n in ("node-0", "node-1")}
    assert [(e["CUDA_VISIBLE_DEVICES"], e["UNICRON_SLOTS"]) for e in seen.values()] == [
        ("0,1", "2"), ("2", "1"),
    ]  # fmt: skip
