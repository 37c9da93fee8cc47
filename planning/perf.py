"""The performance model: iteration time of a GPT under (TP, PP, DP, micro-batch) on a cluster,
and the best such configuration for every worker count, vectorised and cached.

Per micro-batch and pipeline stage (Narayanan et al. 2021, "Efficient Large-Scale Language
Model Training on GPU Clusters Using Megatron-LM", §3):

- compute: the stage's layers (plus the logits on the last stage) at ``efficiency`` of peak,
  forward repeated once more under full recomputation;
- tensor parallelism: 4 all-reduces per layer (6 with recomputation) of the micro-batch's
  activations, inside a node;
- pipeline parallelism: one activation forward and one gradient back per stage boundary.

A step runs the 1F1B schedule: (m + p - 1) micro-batch slots with m = ceil(B / (b·d)) per
replica (the reference trainer deals micro-batches round robin, so d need not divide B/b), then
one all-reduce of the fp32 gradients across the d replicas. A configuration is feasible when
weights, optimizer state and the activations in flight fit ``memory_headroom`` of a GPU.

The search over all (t, p, b) for all worker counts at once is one broadcast numpy expression;
its result depends only on (shape, batch, cluster, worker counts) and is cached, so planning
many jobs of the few shapes a cluster trains costs one search per shape, once per process.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from unicron.planning.api import FloatArray, IntArray
from unicron.planning.spec import ClusterSpec, ModelShape

MAX_MICRO_BATCH = 32  # beyond this a bigger micro-batch buys no GEMM efficiency, only memory


@dataclass(frozen=True)
class Workload:
    """What a job trains, as far as its speed is concerned."""

    shape: ModelShape
    global_batch: int  # sequences per optimizer step
    micro_batch: int  # as submitted; the search may pick another where the cluster allows

    @property
    def tokens_per_step(self) -> float:
        return float(self.global_batch * self.shape.seq_len)


@dataclass(frozen=True)
class BestConfigs:
    """The fastest feasible configuration for each worker count (0s and inf where none fits)."""

    workers: IntArray
    iteration_s: FloatArray
    tp: IntArray
    pp: IntArray
    dp: IntArray
    micro_batch: IntArray


def candidates(work: Workload, cluster: ClusterSpec) -> tuple[IntArray, IntArray, IntArray]:
    """Tensor degrees (powers of two within a node that divide the heads), pipeline degrees
    (divisors of the layers) and micro-batches (powers of two dividing the batch)."""
    shape = work.shape
    top_tp = min(cluster.max_tp, cluster.gpus_per_node)
    tps = [t for t in (1, 2, 4, 8, 16) if t <= top_tp and shape.n_head % t == 0]
    pps = [p for p in range(1, min(shape.n_layer, cluster.max_pp) + 1) if shape.n_layer % p == 0]
    if cluster.tune_micro_batch:
        top_mb = min(work.global_batch, MAX_MICRO_BATCH)
        mbs = [b for b in (1, 2, 4, 8, 16, 32) if b <= top_mb and work.global_batch % b == 0]
    else:
        mbs = [work.micro_batch]
    return (np.array(tps, np.int64), np.array(pps, np.int64), np.array(mbs, np.int64))


def _all_reduce(ranks: IntArray, size: FloatArray, bw: float, latency: float) -> FloatArray:
    """Ring all-reduce: 2(k-1)/k of the buffer over the link plus 2(k-1) latencies."""
    k = ranks.astype(np.float64)
    return np.where(k > 1, 2 * (k - 1) / np.maximum(k, 1) * size / bw + 2 * (k - 1) * latency, 0)


def iteration_times(
    work: Workload, cluster: ClusterSpec, x: IntArray, t: IntArray, p: IntArray, b: IntArray
) -> FloatArray:
    """Seconds per optimizer step for broadcastable arrays of (workers, TP, PP, micro-batch);
    inf where the configuration does not tile the workers or does not fit in memory."""
    s, h, layers = work.shape.seq_len, work.shape.d_model, work.shape.n_layer
    valid = (x % (t * p) == 0) & (x > 0)
    d = np.maximum(x // (t * p), 1)
    m = -(-work.global_batch // (b * d))  # micro-batches per replica, ceil
    rows = (b * s).astype(np.float64)
    width = h / t
    eff = cluster.efficiency * rows / (rows + cluster.rows_half)
    eff = eff * width / (width + cluster.width_half)
    per_stage = layers / p
    recompute = 4.0 / 3.0 if cluster.recompute else 1.0
    stage_flops = rows * (per_stage * work.shape.layer_flops_per_token * recompute)
    stage_flops = (stage_flops + rows * work.shape.logit_flops_per_token) / t
    compute = stage_flops / (cluster.peak_flops * eff)
    act = rows * h * cluster.act_bytes
    tp_comm = (
        per_stage
        * (6 if cluster.recompute else 4)
        * _all_reduce(t, act, cluster.intra_bw, cluster.intra_latency_s)
    )
    cross = t * p > cluster.gpus_per_node
    pp_bw = np.where(cross, cluster.inter_bw, cluster.intra_bw)
    pp_comm = np.where(p > 1, 2 * (act / t / pp_bw + cluster.inter_latency_s), 0.0)
    pipeline = (m + p - 1) * (compute + tp_comm + pp_comm)
    spans_nodes = x > cluster.gpus_per_node
    dp_bw = np.where(spans_nodes, cluster.inter_bw, cluster.intra_bw)
    lat = np.where(spans_nodes, cluster.inter_latency_s, cluster.intra_latency_s)
    grads = work.shape.params / (t * p) * cluster.grad_bytes
    data = _all_reduce(d, grads, 1.0, 0.0) / dp_bw + np.where(d > 1, 2 * (d - 1) * lat, 0.0)
    fits = memory_per_gpu(work, cluster, t, p, b, np.minimum(m, p)) <= (
        cluster.memory_bytes * cluster.memory_headroom
    )
    result: FloatArray = np.where(valid & fits, pipeline + data, np.inf)
    return result


def memory_per_gpu(
    work: Workload, cluster: ClusterSpec, t: IntArray, p: IntArray, b: IntArray, flight: IntArray
) -> FloatArray:
    """Bytes on the busiest GPU (the first stage): model state, plus the activations of the
    ``flight`` micro-batches in flight (Korthikanti et al. 2022: s·b·h·(10 + 24/t + 5·a·s/(h·t))
    bytes per layer in fp16), plus the logits of one micro-batch."""
    shape = work.shape
    s, h, a = shape.seq_len, shape.d_model, shape.n_head
    state = cluster.state_bytes * shape.params / (t * p)
    rows = (b * s).astype(np.float64)
    scale = cluster.act_bytes / 2
    layer = rows * h * (10 + 24 / t + 5 * a * s / (h * t)) * scale
    per_stage = shape.n_layer / p
    if cluster.recompute:  # only each layer's input is kept; one layer is live at a time
        acts = per_stage * flight * rows * h * cluster.act_bytes + layer
    else:
        acts = per_stage * flight * layer
    logits = rows * shape.vocab * 4 / t
    total: FloatArray = state + acts + logits
    return total


@lru_cache(maxsize=1024)
def best_configs(work: Workload, cluster: ClusterSpec, workers: tuple[int, ...]) -> BestConfigs:
    """The fastest feasible configuration for each worker count in ``workers`` (cached)."""
    tps, pps, mbs = candidates(work, cluster)
    x = np.array(workers, dtype=np.int64)[:, None, None, None]
    t, p, b = tps[None, :, None, None], pps[None, None, :, None], mbs[None, None, None, :]
    times = iteration_times(work, cluster, x, t, p, b).reshape(len(workers), -1)
    best = times.argmin(axis=1)
    it = times[np.arange(len(workers)), best]
    ti, pi, bi = np.unravel_index(best, (tps.size, pps.size, mbs.size))
    none = ~np.isfinite(it)
    tp = np.where(none, 0, tps[ti])
    pp = np.where(none, 0, pps[pi])
    xs = np.array(workers, dtype=np.int64)
    dp = np.where(none, 0, xs // np.maximum(tp * pp, 1))
    configs = BestConfigs(xs, it, tp, pp, dp, np.where(none, 0, mbs[bi]))
    for array in (configs.workers, it, tp, pp, dp, configs.micro_batch):
        array.setflags(write=False)  # shared by every job of this shape: never mutate
    return configs


def achieved_flops(work: Workload, iteration_s: FloatArray) -> FloatArray:
    """Model FLOP/s (what WAF counts) at these iteration times; 0 where nothing runs."""
    done = work.tokens_per_step * work.shape.flops_per_token
    with np.errstate(divide="ignore"):
        flops: FloatArray = np.where(np.isfinite(iteration_s), done / iteration_s, 0.0)
    return flops
