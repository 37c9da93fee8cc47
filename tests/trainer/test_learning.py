"""The reference GPT learns the synthetic data, and a bad loss never reaches the weights."""

from __future__ import annotations

import math

import pytest
import torch
from unicron.trainer.gpt import make_optimizer, train_step
from unicron.trainer.model import build_model
from unicron.trainer.parallel import NonFiniteLossError

from tests.trainer.harness import make_spec


def test_loss_goes_down_over_a_few_dozen_steps() -> None:
    spec = make_spec(steps=40)
    model = build_model(spec.model, spec.seed)
    optimizer = make_optimizer(model)
    losses = [train_step(model, optimizer, spec, s, 0, 1, None) for s in range(1, 41)]
    # An untrained model is near ln(vocab); learning the chain must take a clear bite out of it.
    assert losses[0] == pytest.approx(math.log(spec.model.vocab), rel=0.1)
    assert sum(losses[-5:]) / 5 < 0.8 * losses[0]


def test_same_seed_builds_the_same_model_and_another_seed_does_not() -> None:
    spec = make_spec()
    a, b = build_model(spec.model, 1), build_model(spec.model, 1)
    c = build_model(spec.model, 2)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.tok_emb.weight, c.tok_emb.weight)


def test_a_non_finite_loss_raises_and_leaves_the_weights_alone() -> None:
    spec = make_spec()
    model = build_model(spec.model, spec.seed)
    optimizer = make_optimizer(model)
    with torch.no_grad():
        model.ln_f.weight.fill_(float("nan"))
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(NonFiniteLossError):
        train_step(model, optimizer, spec, 1, 0, 1, None)
    after = [p.detach() for p in model.parameters()]
    torch.testing.assert_close(after, before, rtol=0, atol=0, equal_nan=True)
    assert not optimizer.state  # the optimizer never stepped
