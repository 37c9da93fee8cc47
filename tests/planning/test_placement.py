"""Placement: ranks stay where they are, new ranks pack tightly, no node is over-filled."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from unicron.planning.api import NodeView
from unicron.planning.placement import PlacementError, PlacementRequest, place

NODES = [NodeView("a", 2), NodeView("b", 2), NodeView("c", 4)]


def test_running_ranks_stay_where_they_are() -> None:
    requests = [
        PlacementRequest("new", 2),
        PlacementRequest("old", 3, ranks=("c", "a", "c")),
    ]
    placed = place(NODES, requests)
    assert placed["old"] == ["c", "a", "c"]  # kept, though "new" comes first
    assert placed["new"] == ["b", "b"]  # the only node its two ranks fit on together


def test_shrink_keeps_survivors_and_grow_stays_close() -> None:
    placed = place(
        NODES,
        [PlacementRequest("shrink", 1, ranks=("b", "a")), PlacementRequest("grow", 4, ("c",))],
    )
    assert placed["shrink"] == ["b"]
    assert placed["grow"] == ["c", "c", "c", "c"]


def test_packs_fill_a_node_before_the_next() -> None:
    placed = place(NODES, [PlacementRequest("big", 6), PlacementRequest("small", 2)])
    assert placed["big"] == ["c"] * 4 + ["a"] * 2
    assert placed["small"] == ["b", "b"]


def test_short_of_slots_is_an_error() -> None:
    with pytest.raises(PlacementError):
        place(NODES, [PlacementRequest("x", 9)])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 4), min_size=1, max_size=5),
    st.lists(st.tuples(st.integers(0, 6), st.lists(st.integers(0, 5), max_size=6)), max_size=5),
)
def test_never_over_allocates(slots: list[int], jobs: list[tuple[int, list[int]]]) -> None:
    """Even when the records claim more ranks on a node than it has (or unknown nodes)."""
    nodes = [NodeView(f"n{i}", s) for i, s in enumerate(slots)]
    capacity = sum(slots)
    requests, total = [], 0
    for i, (want, ranks) in enumerate(jobs):
        x = min(want, capacity - total)
        total += x
        requests.append(PlacementRequest(f"j{i}", x, tuple(f"n{r}" for r in ranks)))
    placed = place(nodes, requests)
    used = Counter(node for ranks in placed.values() for node in ranks)
    assert all(used[n.node_id] <= n.slots for n in nodes)
    assert set(used) <= {n.node_id for n in nodes}
    for request in requests:
        assert len(placed[request.job_id]) == request.workers
