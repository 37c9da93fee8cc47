"""The performance model against published Megatron-LM throughput, and its configuration search.

Reference: Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM" (SC'21). Table 1 reports, for GPT models of 1.7B to 1T parameters
on 32 to 3072 A100s (seq 2048, vocab 51200), 135-163 TFLOP/s per GPU, 43-52% of the
312 TFLOP/s peak, counting FLOPs as their eq. 3 does (with activation recomputation). GPT-3
175B on 1024 A100s is quoted as ≈140 TFLOP/s per GPU, 44-52% of peak.
"""

from __future__ import annotations

import numpy as np
import pytest
from unicron.planning.api import JobDemand
from unicron.planning.clusters import A100, CLUSTERS, CPU
from unicron.planning.perf import Workload, best_configs, iteration_times, memory_per_gpu
from unicron.planning.spec import ModelShape
from unicron.planning.throughput import THROUGHPUT_MODELS, MegatronThroughput

SEQ, VOCAB = 2048, 51200
GPT3_175B = ModelShape(96, 96, 12288, SEQ, VOCAB)


def megatron_tflops(shape: ModelShape, batch: int, iteration_s: float, gpus: int) -> float:
    """Per-GPU TFLOP/s as Narayanan et al. count it (eq. 3: 96·B·s·l·h²·(1 + s/6h + V/16lh))."""
    s, layers, h, v = shape.seq_len, shape.n_layer, shape.d_model, shape.vocab
    flops = 96 * batch * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))
    return flops / iteration_s / gpus / 1e12


def test_gpt3_175b_on_1024_a100_lands_in_the_published_range() -> None:
    work = Workload(GPT3_175B, global_batch=1536, micro_batch=1)
    best = best_configs(work, A100, (1024,))
    tflops = megatron_tflops(GPT3_175B, 1536, float(best.iteration_s[0]), 1024)
    assert 0.44 * 312 <= tflops <= 0.52 * 312, f"{tflops:.1f} TFLOP/s per GPU"
    # The configuration is one Megatron would run: TP within a node, pipeline across nodes,
    # and the model state of a GPU fits in its 80 GB.
    tp, pp, dp = int(best.tp[0]), int(best.pp[0]), int(best.dp[0])
    assert tp * pp * dp == 1024 and 2 <= tp <= 8 and pp >= 8
    assert 16 * GPT3_175B.params / (tp * pp) < 80e9


# Table 1 rows: heads, hidden, layers, TP, PP, GPUs, batch, achieved TFLOP/s per GPU.
TABLE_1 = [
    (24, 2304, 24, 1, 1, 32, 512, 137),
    (32, 4096, 36, 4, 1, 128, 512, 142),
    (64, 8192, 48, 8, 2, 512, 1536, 138),
    (96, 12288, 80, 8, 8, 1536, 2304, 148),
    (128, 20480, 105, 8, 35, 2520, 2520, 163),
]


@pytest.mark.parametrize(("heads", "hidden", "layers", "tp", "pp", "gpus", "batch", "ref"), TABLE_1)
def test_paper_configurations_within_15_percent_of_table_1(
    heads: int, hidden: int, layers: int, tp: int, pp: int, gpus: int, batch: int, ref: float
) -> None:
    shape = ModelShape(layers, heads, hidden, SEQ, VOCAB)
    work = Workload(shape, batch, micro_batch=1)
    step = float(iteration_times(work, A100, *map(np.array, (gpus, tp, pp, 1))))
    assert megatron_tflops(shape, batch, step, gpus) == pytest.approx(ref, rel=0.15)


def test_too_small_a_slice_runs_nothing_and_more_gpus_run_faster() -> None:
    work = Workload(GPT3_175B, global_batch=1536, micro_batch=1)
    best = best_configs(work, A100, (8, 64, 256, 1024))
    assert not np.isfinite(best.iteration_s[0])  # 175B's state alone is 2.8 TB
    assert best.tp[0] == 0 and best.dp[0] == 0
    assert np.all(np.diff(best.iteration_s[1:]) < 0)
    # Whatever was chosen fits the memory limit.
    fits = memory_per_gpu(work, A100, best.tp[1:], best.pp[1:], best.micro_batch[1:], best.pp[1:])
    assert np.all(fits <= A100.memory_bytes * A100.memory_headroom)


def test_tensor_parallelism_stays_in_a_node_and_divides_the_heads() -> None:
    shape = ModelShape(40, 40, 5120, SEQ, VOCAB)  # 40 heads: TP 8 would split a head
    best = best_configs(Workload(shape, 1024, 1), A100, tuple(range(8, 1025, 8)))
    assert set(best.tp.tolist()) <= {1, 2, 4}


def test_cpu_preset_is_data_parallel_with_the_submitted_micro_batch() -> None:
    """4 micro-batches dealt round robin: 3 workers take 2 rounds, like 2 workers do."""
    model = MegatronThroughput(CPU)
    demand = JobDemand("j", 1.0, 1, 4, global_batch=8, micro_batch=2)
    curve = model.curve(demand, np.arange(5))
    assert curve.flops[0] == 0
    assert curve.flops[4] > curve.flops[2] > curve.flops[3] > curve.flops[1] > 0
    assert (curve.tp[1:] == 1).all() and (curve.pp[1:] == 1).all()
    assert (curve.dp[1:] == np.arange(1, 5)).all() and (curve.micro_batch[1:] == 2).all()


def test_calibration_slows_the_job_down_uniformly() -> None:
    model = MegatronThroughput(CPU)
    demand = JobDemand("j", 1.0, 1, 4, global_batch=8, micro_batch=2)
    slow = JobDemand("j", 1.0, 1, 4, global_batch=8, micro_batch=2, slowdown=2.0)
    workers = np.arange(1, 5)
    ratio = model.curve(demand, workers).flops / model.curve(slow, workers).flops
    assert ratio == pytest.approx(np.full(4, 2.0))


def test_backends_are_looked_up_by_name() -> None:
    assert CLUSTERS.get("h800").gpus_per_node == 8
    assert set(CLUSTERS) == {"a100", "cpu", "h100", "h800"}
    assert isinstance(THROUGHPUT_MODELS.get("megatron")(A100), MegatronThroughput)
    with pytest.raises(KeyError, match="known: a100, cpu, h100, h800"):
        CLUSTERS.get("tpu")
