"""The hand-off plan and the regroup inbox, without processes: who sends the state, what is
kept, what is still to do — every micro-batch exactly once."""

from __future__ import annotations

from unicron.shared.contracts.messages import RegroupDirective, Rendezvous
from unicron.shared.contracts.workerchannel import WorkerEnv
from unicron.trainer.gpt import make_optimizer
from unicron.trainer.handoff import Holding, plan_handoff
from unicron.trainer.model import build_model
from unicron.trainer.regroup import RegroupInbox, is_peer_failure
from unicron.trainer.replica import Replica
from unicron.trainer.resume import fall_back_to_disk
from unicron.trainer.storage import CheckpointStore

from tests.trainer.harness import make_spec


def exactly_once(
    plan_kept: dict[int, list[int]], assigned: dict[int, list[int]], total: int
) -> bool:
    covered = [i for done in plan_kept.values() for i in done]
    covered += [i for todo in assigned.values() for i in todo]
    return sorted(covered) == list(range(total))


def test_survivors_keep_their_sums_and_the_joiner_sums_what_the_lost_rank_would_have() -> None:
    # World 4 lost rank 1 mid-step 5; the survivors summed their shares (8 micro-batches).
    holdings = [
        Holding(True, 5, [0, 4]),
        Holding(True, 5, [2, 6]),
        Holding(True, 5, [3]),  # interrupted after one of its two
        Holding(False, 1, [], requested_source=0),  # the joiner
    ]
    plan = plan_handoff(holdings, total=8)
    assert plan.target_step == 5 and plan.source == 0 and plan.receivers == {3}
    assert plan.kept == {0: [0, 4], 1: [2, 6], 2: [3]}
    # Each rank ends with the partial sum one rank of a run without faults has: the float
    # sums of the step are those of that run, not just its samples.
    assert plan.assigned == {0: [], 1: [], 2: [7], 3: [1, 5]}
    assert exactly_once(plan.kept, plan.assigned, 8)


def test_no_broadcast_when_every_rank_already_holds_the_state() -> None:
    plan = plan_handoff([Holding(True, 9, [0, 2]), Holding(True, 9, [])], total=4)
    assert plan.source is None and not plan.receivers
    assert plan.assigned == {0: [], 1: [1, 3]}


def test_a_survivor_that_changes_rank_keeps_its_share_and_the_joiner_takes_the_other() -> None:
    # Rank 0 of two died; the survivor, rank 1 until now, is rank 0 of the new group.
    plan = plan_handoff([Holding(True, 4, [1]), Holding(False, 1, [], 0)], total=6)
    assert plan.assigned == {0: [3, 5], 1: [0, 2, 4]}


def test_sums_kept_across_a_change_of_world_size_are_completed_round_robin() -> None:
    # Four ranks shrank to two mid-step: the kept shares straddle the new world's shares.
    plan = plan_handoff([Holding(True, 3, [0, 4]), Holding(True, 3, [2, 6])], total=8)
    assert plan.assigned == {0: [1, 5], 1: [3, 7]}
    assert exactly_once(plan.kept, plan.assigned, 8)


def test_a_rank_that_lags_a_completed_step_drops_its_sums_and_takes_the_state() -> None:
    holdings = [Holding(True, 7, [1]), Holding(True, 8, []), Holding(True, 8, [2])]
    plan = plan_handoff(holdings, total=4)
    assert plan.target_step == 8 and plan.source == 1 and plan.receivers == {0}
    assert plan.kept == {2: [2]}
    assert exactly_once(plan.kept, plan.assigned, 4)


def test_a_requested_source_that_lacks_the_state_is_passed_over() -> None:
    holdings = [Holding(False, 1, [], 0), Holding(True, 3, [], 0)]
    assert plan_handoff(holdings, total=2).source == 1


def test_joiners_alone_read_the_disk() -> None:
    plan = plan_handoff([Holding(False, 1), Holding(False, 1)], total=4)
    assert plan.from_disk and plan.assigned == {0: [0, 2], 1: [1, 3]}


def test_a_rank_without_state_and_no_checkpoint_starts_from_step_zero(tmp_path: object) -> None:
    spec = make_spec()
    model = build_model(spec.model, spec.seed)
    replica = Replica(model, make_optimizer(model), next_step=1, has_state=False)
    store = CheckpointStore(str(tmp_path))
    assert fall_back_to_disk(replica, store) == "none"
    assert replica.has_state and replica.next_step == 1
    assert fall_back_to_disk(replica, store) is None  # it has state now: kept


def directive(generation: int, job_id: str = "job-t") -> RegroupDirective:
    rendezvous = Rendezvous(host="h", port=1, prefix=f"g{generation}/")
    return RegroupDirective(
        job_id=job_id, generation=generation, rank=0, world_size=1, rendezvous=rendezvous
    )


def test_the_inbox_keeps_the_newest_directive_and_drops_stale_ones() -> None:
    inbox = RegroupInbox("job-t", generation=2)
    inbox.offer(directive(2))
    assert not inbox.pending()  # not newer than ours
    inbox.offer(directive(5, job_id="other"))
    assert not inbox.pending()
    inbox.offer(directive(4))
    inbox.offer(directive(3))  # older than the one waiting
    assert inbox.wait(0.0)
    taken = inbox.take()
    assert taken is not None and taken.directive.generation == 4
    assert inbox.generation == 4 and inbox.take() is None and not inbox.wait(0.01)


def test_only_failures_a_lost_peer_causes_park_a_worker() -> None:
    gloo = "[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:5321"
    assert is_peer_failure(RuntimeError(gloo))
    assert is_peer_failure(
        RuntimeError("Timed out waiting 300000ms for recv operation to complete")
    )
    assert not is_peer_failure(RuntimeError("CUDA error: an illegal memory access"))
    assert not is_peer_failure(FloatingPointError("non-finite loss nan at step 3"))


def test_an_unreadable_park_timeout_falls_back_to_the_default() -> None:
    def park_timeout(raw: str | None) -> float:
        environ = {} if raw is None else {"UNICRON_PARK_TIMEOUT_S": raw}
        return WorkerEnv.read(environ).park_timeout_s

    assert park_timeout("2.5") == 2.5
    assert park_timeout("-1") == 0.0
    assert park_timeout("soon") == park_timeout(None) == 60.0
