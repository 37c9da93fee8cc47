"""Synthetic training data with learnable structure, generated in-process.

Sequences are walks on a sparse random Markov chain fixed by the job seed: every token has a
few likely successors, so a model can push its loss from ln(vocab) towards the chain's entropy.

The data order is a pure function of ``(seed, step, micro-batch index)``: whichever rank of
whichever world size asks for micro-batch ``i`` of step ``s`` gets the same tensors, so a
job can shrink, grow or resume without losing or repeating a sample (docs/design.md §5).
"""

from __future__ import annotations

import functools

import torch
from unicron.shared.contracts.models import ModelConfig

# Successors per token: few enough that the chain has structure worth learning.
BRANCHING = 4

_MASK64 = (1 << 64) - 1


def derive_seed(*parts: int) -> int:
    """Mix integers into one 63-bit seed (splitmix64), independent of Python's hash seed."""
    state = 0x9E3779B97F4A7C15
    for part in parts:
        state = (state ^ (part & _MASK64)) & _MASK64
        state = (state + 0x9E3779B97F4A7C15) & _MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        state = z ^ (z >> 31)
    # torch.Generator.manual_seed takes any 64-bit value, but a non-negative int63 is portable.
    return state >> 1


@functools.lru_cache(maxsize=8)
def markov_chain(seed: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The job's chain: ``successors[v]`` are the tokens that may follow ``v`` and
    ``cumulative[v]`` the cumulative probabilities of taking each of them."""
    gen = torch.Generator().manual_seed(derive_seed(seed, 0x436861696E))
    branching = min(BRANCHING, vocab)
    # Drawn with replacement: a repeated successor just merges two weights, and this stays
    # linear in the vocabulary where a permutation per token would be quadratic.
    successors = torch.randint(vocab, (vocab, branching), generator=gen)
    # Exponential weights normalised = Dirichlet(1): some successors clearly dominate.
    weights = -torch.log(torch.rand(vocab, branching, generator=gen, dtype=torch.float64))
    cumulative = torch.cumsum(weights / weights.sum(dim=1, keepdim=True), dim=1)
    cumulative[:, -1] = 1.0  # no sample may fall past the last successor through rounding
    return successors, cumulative


def micro_batch(
    seed: int, step: int, index: int, micro_batch: int, model_cfg: ModelConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Micro-batch ``index`` of ``step``: ``(inputs, targets)``, each ``(micro_batch, seq_len)``
    int64 on the CPU, with ``targets`` the inputs shifted by one token."""
    successors, cumulative = markov_chain(seed, model_cfg.vocab)
    gen = torch.Generator().manual_seed(derive_seed(seed, step, index))
    length = model_cfg.seq_len + 1
    tokens = torch.empty(micro_batch, length, dtype=torch.int64)
    tokens[:, 0] = torch.randint(model_cfg.vocab, (micro_batch,), generator=gen)
    draws = torch.rand(micro_batch, length - 1, generator=gen, dtype=torch.float64)
    for t in range(length - 1):
        current = tokens[:, t]
        # Index of the first successor whose cumulative probability exceeds the draw.
        choice = (draws[:, t : t + 1] >= cumulative[current]).sum(dim=1)
        tokens[:, t + 1] = successors[current, choice]
    return tokens[:, :-1].clone(), tokens[:, 1:].clone()


def chain_entropy(seed: int, vocab: int) -> float:
    """Mean per-token entropy of the chain in nats: the loss a perfect model approaches."""
    _, cumulative = markov_chain(seed, vocab)
    probs = torch.diff(cumulative, dim=1, prepend=torch.zeros(vocab, 1, dtype=torch.float64))
    return float(-(probs * torch.log(probs.clamp_min(1e-300))).sum(dim=1).mean())
