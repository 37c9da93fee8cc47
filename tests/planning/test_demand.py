"""One JobSpec → demand mapping: the planner, its calibration and the simulator see the same job
in a spec that gives only the defaults, and the defaults are JobSpec's own."""

from __future__ import annotations

import math
from dataclasses import replace

from unicron.planning.api import JobDemand
from unicron.planning.planning import job_view
from unicron.planning.spec import DEFAULT_SHAPE, ModelShape
from unicron.shared.contracts.models import Job, JobSpec, ModelConfig
from unicron.simulator.inputs import JobConfig
from unicron.simulator.workload import demand_of, shape_for

SPEC = JobSpec(name="small")


def test_a_pending_job_is_planned_with_the_demand_of_its_spec() -> None:
    job = Job(id="job-1", name="small", spec=SPEC)
    demand = job_view(job, set()).demand
    assert demand == JobDemand.of("job-1", SPEC)
    assert (demand.shape, demand.global_batch, demand.micro_batch, demand.checkpoint_every) == (
        ModelShape.of(ModelConfig()),
        SPEC.global_batch,
        SPEC.micro_batch,
        SPEC.checkpoint_every,
    )


def test_a_small_simulated_job_trains_what_a_spec_of_defaults_trains() -> None:
    config = JobConfig(
        name="small",
        params_b=0.01,
        weight=SPEC.weight,
        min_gpus=SPEC.min_workers,
        max_gpus=SPEC.max_workers,
    )
    assert demand_of(config) == JobDemand.of("small", SPEC)
    assert shape_for(config.params_b) == (DEFAULT_SHAPE, SPEC.global_batch, SPEC.micro_batch)
    # once its step time is known it checkpoints by its interval instead
    every = demand_of(config, iteration_s=60.0).checkpoint_every
    assert every == round(config.checkpoint_interval_s / 60.0)
    assert demand_of(config, iteration_s=math.nan) == demand_of(config)


def test_a_demand_given_no_batch_or_checkpoint_has_the_specs_defaults() -> None:
    bare = JobDemand("j", weight=1.0, min_workers=1, max_workers=4)
    assert replace(bare, shape=ModelShape.of(SPEC.model)) == JobDemand.of("j", SPEC)


def test_a_spec_that_sets_every_field_is_demanded_as_it_says() -> None:
    spec = JobSpec(
        name="big", weight=3.0, min_workers=2, max_workers=8, global_batch=64, micro_batch=2,
        checkpoint_every=7, model=ModelConfig(n_layer=2, n_head=2, d_model=64),
    )  # fmt: skip
    demand = JobDemand.of("job-2", spec)
    assert demand == JobDemand(
        job_id="job-2", weight=3.0, min_workers=2, max_workers=8,
        shape=ModelShape(n_layer=2, n_head=2, d_model=64, seq_len=64, vocab=256),
        global_batch=64, micro_batch=2, checkpoint_every=7,
    )  # fmt: skip
