"""Cluster presets: the node kinds the planner knows, by name (``UNICRON_PLANNER_CLUSTER``).

Figures are public vendor numbers or the measurement cited beside them; what a preset gets
wrong for one job, the online calibration corrects (``unicron.services.planner.calibration``).
Register another preset with ``CLUSTERS.register(name, ClusterSpec(...))``.
"""

from __future__ import annotations

from dataclasses import replace

from unicron.planning.spec import ClusterSpec, Registry

GB = 1e9

CLUSTERS: Registry[ClusterSpec] = Registry("cluster preset")

# DGX A100 80 GB: 312 TFLOP/s dense bf16; NVSwitch all-reduce bus bandwidth ≈ 230 GB/s
# (nccl-tests); 8 x 200 Gb/s HDR InfiniBand, one NIC per GPU (the Selene nodes of Narayanan
# et al. 2021).
A100 = CLUSTERS.register(
    "a100",
    ClusterSpec(
        name="a100",
        gpus_per_node=8,
        peak_flops=312e12,
        memory_bytes=80 * GB,
        intra_bw=230 * GB,
        inter_bw=23 * GB,
        intra_latency_s=10e-6,
        inter_latency_s=20e-6,
        efficiency=0.63,
        rows_half=64.0,
        width_half=64.0,
    ),
)

# DGX H100: 989 TFLOP/s dense bf16; NVLink 4 all-reduce bus bandwidth ≈ 450 GB/s; 8 x 400 Gb/s
# NDR. Large GEMMs sustain a smaller share of H100's peak than of A100's.
H100 = CLUSTERS.register(
    "h100",
    ClusterSpec(
        name="h100",
        gpus_per_node=8,
        peak_flops=989e12,
        memory_bytes=80 * GB,
        intra_bw=450 * GB,
        inter_bw=45 * GB,
        intra_latency_s=8e-6,
        inter_latency_s=15e-6,
        efficiency=0.5,
        rows_half=128.0,
        width_half=96.0,
    ),
)

# H800 (the paper's cluster): H100 compute with NVLink cut to 400 GB/s bidirectional;
# DeepSeek-V3 (2024, §3.2.2) measured 160 GB/s NVLink and 50 GB/s InfiniBand per GPU.
H800 = CLUSTERS.register("h800", replace(H100, name="h800", intra_bw=160 * GB, inter_bw=40 * GB))

# This machine: one slot is one CPU worker process of the reference trainer (fp32, gloo over
# loopback TCP). The reference trainer is data parallel only and runs the micro-batch it was
# submitted with, so the search is too. Transition constants are docs/design.md §5's measurements:
# a fresh Python + torch process needs about 1.7 s; a process group re-forms in about 20 ms; a
# warm spare takes a crashed rank's seat in about 80 ms (bench/recover.py: regroup phase p50
# 0.095 s, less the re-form).
CPU = CLUSTERS.register(
    "cpu",
    ClusterSpec(
        name="cpu",
        gpus_per_node=1,
        peak_flops=50e9,
        memory_bytes=4 * GB,
        intra_bw=1 * GB,
        inter_bw=1 * GB,
        intra_latency_s=200e-6,
        inter_latency_s=200e-6,
        efficiency=0.4,
        rows_half=16.0,
        width_half=16.0,
        act_bytes=4,
        recompute=False,
        max_tp=1,
        max_pp=1,
        tune_micro_batch=False,
        unit_slots=1,
        launch_s=1.7,
        spare_s=0.08,
        reform_s=0.02,
        reattempt_s=0.05,
        disk_bw=0.5 * GB,
    ),
)
