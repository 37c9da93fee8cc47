"""Data order and the data-parallel partition: what makes resizing and resuming lossless."""

from __future__ import annotations

import pytest
import torch
from unicron.trainer.data import micro_batch
from unicron.trainer.parallel import micro_batches_for

from tests.trainer.harness import TINY


def test_micro_batch_is_a_pure_function_of_seed_step_and_index() -> None:
    first = micro_batch(3, 5, 2, 4, TINY)
    # Other draws in between must not shift what (3, 5, 2) yields.
    micro_batch(3, 5, 1, 4, TINY)
    micro_batch(9, 1, 0, 4, TINY)
    again = micro_batch(3, 5, 2, 4, TINY)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])

    inputs, targets = first
    assert inputs.shape == targets.shape == (4, TINY.seq_len)
    assert inputs.dtype == torch.int64
    assert int(inputs.min()) >= 0 and int(inputs.max()) < TINY.vocab
    # Targets are the next tokens of the same sequence.
    assert torch.equal(inputs[:, 1:], targets[:, :-1])

    for other in [(4, 5, 2), (3, 6, 2), (3, 5, 3)]:
        assert not torch.equal(micro_batch(*other, 4, TINY)[0], inputs), other


def test_sequences_follow_a_sparse_chain() -> None:
    # Learnable structure: each token is followed by only a handful of distinct tokens.
    inputs, targets = micro_batch(0, 1, 0, 64, TINY)
    followers: dict[int, set[int]] = {}
    for a, b in zip(inputs.flatten().tolist(), targets.flatten().tolist(), strict=True):
        followers.setdefault(a, set()).add(b)
    assert max(len(seen) for seen in followers.values()) <= 4


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("total", [1, 4, 5, 12])
def test_partition_covers_every_micro_batch_exactly_once(world: int, total: int) -> None:
    taken = [i for rank in range(world) for i in micro_batches_for(rank, world, total)]
    assert sorted(taken) == list(range(total))
    assert all(
        i % world == rank for rank in range(world) for i in micro_batches_for(rank, world, total)
    )


def test_partition_refuses_a_rank_outside_the_world() -> None:
    with pytest.raises(ValueError):
        micro_batches_for(2, 2, 8)
