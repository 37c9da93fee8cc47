"""Plans with the real models: the CPU demo, GPU clusters, calibration, and explanations."""

from __future__ import annotations

from collections import Counter

import pytest
from unicron.planning import clusters
from unicron.planning.api import Calibration, Objective, TransitionKind
from unicron.planning.planning import (
    UNCALIBRATED,
    PlanDraft,
    needs_publish,
    plan_cluster,
    run_time,
    snapshot,
)
from unicron.shared.contracts.models import (
    Job,
    JobSpec,
    JobState,
    ModelConfig,
    NodeRecord,
    NodeState,
    PlanAction,
    WorkerRecord,
    WorkerState,
)
from unicron.shared.contracts.plans import JobAllocation, Plan

from tests.planning.defaults import default_objective

NOW = 10_000.0
CPU = default_objective(clusters.CPU)
A100 = default_objective(clusters.A100)
A100_LAUNCH_S = clusters.A100.launch_s
GPT_1B = ModelConfig(n_layer=24, n_head=16, d_model=2048, seq_len=2048, vocab=51200)
GPT_7B = ModelConfig(n_layer=32, n_head=32, d_model=4096, seq_len=2048, vocab=51200)
GPT_13B = ModelConfig(n_layer=40, n_head=40, d_model=5120, seq_len=2048, vocab=51200)


def nodes(count: int, slots: int = 8) -> list[NodeRecord]:
    return [NodeRecord(id=f"node-{i}", slots=slots, last_heartbeat=NOW) for i in range(count)]


def job(
    job_id: str,
    lo: int,
    hi: int,
    model: ModelConfig | None = None,
    ranks: tuple[str, ...] = (),
    weight: float = 1.0,
    batch: int = 512,
) -> Job:
    small = model is None
    spec = JobSpec(
        name=job_id, min_workers=lo, max_workers=hi, weight=weight,
        global_batch=8 if small else batch, micro_batch=2 if small else 1,
        model=model or ModelConfig(),
    )  # fmt: skip
    workers = [
        WorkerRecord(rank=r, node_id=n, state=WorkerState.RUNNING) for r, n in enumerate(ranks)
    ]
    state = JobState.RUNNING if ranks else JobState.PENDING
    return Job(
        id=job_id, name=job_id, spec=spec, state=state, generation=1 if ranks else 0,
        world_size=len(ranks), workers=workers, submitted_at=NOW - 100 + int(job_id[-1]),
    )  # fmt: skip


def plan(
    cluster: list[NodeRecord],
    jobs: list[Job],
    objective: Objective,
    calibration: Calibration = UNCALIBRATED,
) -> PlanDraft:
    return plan_cluster(snapshot(cluster, jobs, NOW, calibration), objective)


def by_job(draft: PlanDraft) -> dict[str, JobAllocation]:
    return {a.job_id: a for a in draft.allocations}


def ran(draft: PlanDraft, jobs: list[Job]) -> list[Job]:
    """Every placed job running where the plan put it."""
    out = []
    for j in jobs:
        ranks = by_job(draft)[j.id].nodes
        workers = [
            WorkerRecord(rank=r, node_id=n, state=WorkerState.RUNNING) for r, n in enumerate(ranks)
        ]
        update = {"state": JobState.RUNNING, "generation": 1, "world_size": len(ranks)}
        out.append(j.model_copy(update={**update, "workers": workers}) if ranks else j)
    return out


def test_cpu_demo_both_jobs_of_max_two_run_on_four_slots() -> None:
    cluster = nodes(2, slots=2)
    got = by_job(plan(cluster, [job("job-1", 1, 2), job("job-2", 1, 2)], CPU))
    assert [(a.action, a.workers) for a in got.values()] == [(PlanAction.START, 2)] * 2
    assert got["job-1"].nodes == ["node-0"] * 2 and got["job-2"].nodes == ["node-1"] * 2
    assert got["job-1"].config is not None and got["job-1"].config.dp == 2
    alone = by_job(plan(cluster, [job("job-1", 1, 4)], CPU))["job-1"]
    assert alone.workers == 4  # the model says 4 workers are fastest for 4 micro-batches
    boxed = by_job(plan(cluster, [job("job-1", 3, 3)], CPU))["job-1"]
    assert boxed.workers == 3  # min and max are hard, even where 2 would be faster


def test_an_unchanged_gpu_cluster_replans_to_nothing() -> None:
    cluster = nodes(8)
    jobs = [job("job-1", 8, 32, GPT_1B), job("job-2", 8, 64, GPT_7B, weight=2.0),
            job("job-3", 16, 64, GPT_13B), job("job-4", 8, 16, GPT_1B, weight=0.5)]  # fmt: skip
    first = plan(cluster, jobs, A100)
    assert sum(a.workers for a in first.allocations) <= 64
    again = plan(cluster, ran(first, jobs), A100)
    assert all(a.action in (PlanAction.KEEP, PlanAction.WAIT) for a in again.allocations)
    assert [a.nodes for a in again.allocations] == [a.nodes for a in first.allocations]
    assert not needs_publish(again, Plan(allocations=first.allocations))


def test_a_running_job_keeps_its_size_when_growing_gains_less_than_it_costs() -> None:
    cluster = nodes(4)
    running = [job("job-1", 8, 32, GPT_7B, ranks=("node-0",) * 8 + ("node-1",) * 8)]
    # A failure every ~20 s somewhere among the 32 GPUs: the grow's downtime (launch, re-form,
    # state from a peer) would not be paid back before the next failure.
    often = Calibration(failure_rate_per_gpu_h=6.0)
    kept = by_job(plan(cluster, running, A100, often))["job-1"]
    assert (kept.action, kept.workers) == (PlanAction.KEEP, 16)
    assert kept.explanation is not None
    bigger = [alt for alt in kept.explanation.alternatives if alt.workers == 32]
    assert bigger and bigger[0].shortfall > 0 and bigger[0].predicted_throughput > 0
    # Failures rare (the Llama 3 rate): growing onto the free nodes pays.
    grown = by_job(plan(cluster, running, A100, Calibration(failure_rate_per_gpu_h=2e-5)))["job-1"]
    assert (grown.action, grown.workers) == (PlanAction.RESIZE, 32)
    assert grown.explanation is not None and grown.explanation.transition == "grow"
    assert grown.nodes[:16] == ["node-0"] * 8 + ["node-1"] * 8  # the running ranks stay put


def test_d_run_follows_the_failure_rate() -> None:
    draft = plan(
        nodes(4), [job("job-1", 8, 32, GPT_1B)], A100, Calibration(failure_rate_per_gpu_h=0.5)
    )
    assert draft.run_s == pytest.approx(run_time(0.5, 32)) == pytest.approx(225.0)


def test_every_job_is_explained_with_the_alternatives_that_lost() -> None:
    cluster = nodes(8)
    jobs = [job("job-1", 8, 32, GPT_7B), job("job-2", 8, 32, GPT_1B, weight=2.0)]
    draft = plan(cluster, jobs, A100)
    waf = 0.0
    for a in draft.allocations:
        why = a.explanation
        assert why is not None and a.config == why.new_config
        waf += why.predicted_waf
        assert why.new_workers == a.workers and why.old_workers == 0
        assert why.predicted_throughput == a.predicted_throughput > 0
        assert why.predicted_waf == pytest.approx(why.weight * why.predicted_throughput)
        assert why.transition == "start" and why.predicted_downtime_s == A100_LAUNCH_S
        assert a.config is not None and a.config.tp * a.config.pp * a.config.dp == a.workers
        rewards = [alt.plan_reward for alt in why.alternatives]
        assert rewards == sorted(rewards, reverse=True) and len(rewards) >= 2
        for alt in why.alternatives:
            assert alt.workers != a.workers
            assert alt.shortfall == pytest.approx(draft.expected_reward - alt.plan_reward)
    assert draft.expected_waf == pytest.approx(waf)


def test_tensor_parallel_ranks_share_a_node() -> None:
    cluster = nodes(4)
    # job-1 holds 4 GPUs of node-0, so a big job must skip that node's remaining half.
    small = job("job-1", 4, 4, GPT_1B, ranks=("node-0",) * 4)
    big = job("job-2", 24, 24, GPT_13B)
    got = by_job(plan(cluster, [small, big], A100))["job-2"]
    assert got.config is not None and got.config.tp > 1
    t = got.config.tp
    groups = [got.nodes[i : i + t] for i in range(0, len(got.nodes), t)]
    assert all(len(set(group)) == 1 for group in groups)
    assert all(count % t == 0 for count in Counter(got.nodes).values())


def test_a_job_measured_slower_gets_fewer_gpus() -> None:
    cluster = nodes(3)
    twins = [job("job-1", 8, 16, GPT_1B), job("job-2", 8, 16, GPT_1B)]
    even = by_job(plan(cluster, twins, A100))
    assert (even["job-1"].workers, even["job-2"].workers) == (16, 8)  # the earlier wins ties
    slow = Calibration(job_slowdown=(("job-1", 3.0),))
    calibrated = by_job(plan(cluster, twins, A100, slow))
    assert (calibrated["job-1"].workers, calibrated["job-2"].workers) == (8, 16)
    why = calibrated["job-1"].explanation
    assert why is not None and why.calibration == 3.0


def test_measured_downtime_factors_show_in_the_prediction() -> None:
    failed = job("job-1", 8, 8, GPT_1B, ranks=("node-0",) * 8)
    lost = [NodeRecord(id="node-0", slots=8, state=NodeState.LOST), *nodes(3)[1:]]
    plain = by_job(plan(lost, [failed], A100))["job-1"].explanation
    measured = Calibration(transition_factors=((TransitionKind.MIGRATE, 2.0),))
    slower = by_job(plan(lost, [failed], A100, measured))["job-1"].explanation
    assert plain is not None and slower is not None
    assert plain.transition == slower.transition == "migrate"
    assert slower.predicted_downtime_s == pytest.approx(2 * plain.predicted_downtime_s)
    assert slower.downtime_factor == 2.0


def test_quarantined_and_lost_nodes_get_nothing() -> None:
    cluster = nodes(4)
    cluster[1].state = NodeState.QUARANTINED
    cluster[2].state = NodeState.LOST
    draft = plan(cluster, [job("job-1", 8, 32, GPT_1B)], A100)
    assert set(by_job(draft)["job-1"].nodes) == {"node-0", "node-3"}
    assert draft.free_slots == 0
