"""GPU probe: the facts that in-place regroup on NCCL needs, measured on a real GPU.

Unicron's in-place recovery (a survivor keeps its model on the device while the dead peer is
replaced and the group re-formed, docs/design.md §5) has only run on gloo/CPU. This standalone
package gathers what building the NCCL version needs to know, on whatever GPU machine it runs:

1. two NCCL ranks on one GPU (``NCCL_HOSTID`` per process) and the error without it;
2. what a survivor sees when its peer is SIGKILLed, per ``TORCH_NCCL_ASYNC_ERROR_HANDLING``;
3. which communicator-abort API unblocks a collective stuck on a dead peer, and how fast;
4. a fresh communicator in the same survivor process, model kept on the device, joined by a
   cold replacement process (its start-up phases timed);
5. the same joined by a warm spare (torch imported, no CUDA touched);
6. whether a non-blocking communicator init whose peer never comes can be aborted;
7. a real CUDA out-of-memory error's text, and that the process works on after it;
8. which NVML calls answer here (health counters, Xid events, recovery action);
9. a reference training-step time (~10 ms) to size recovery costs against.

Every scenario runs in its own fresh subprocesses under its own timeout, so a crash or hang in
one cannot spoil another; a failure is recorded with its text and the probe goes on. Only the
standard library, torch and (optionally) pynvml are used. ``--device cpu`` runs the control
flow on gloo (CUDA/NCCL/NVML-only scenarios are recorded as skipped) for a dry run without a
GPU. Output: one table row per scenario, then, last, one JSON line with everything recorded
(the same JSON goes to ``--out``). Results of one run on an H200 are in docs/gpu-probe.md.

    PYTHONUNBUFFERED=1 python3 -m bench.gpuprobe --device cuda --out /tmp/gpu_probe.json

Modules: ``__main__`` the command line, the scenario list and the table/JSON output;
``common`` what both sides share (records, events, exit); ``harness`` a child process as the
orchestrator sees it; ``probe`` the orchestrator's state and plumbing; ``worker`` a child's
entry point; ``torchops`` a child's device and group helpers; one module per scenario group:
``basics`` (s0, s1), ``member`` and ``peer_death`` (s2, s3), ``regroup`` (s4, s5),
``nonblocking`` (s6), ``oom_step`` (s7, s9), ``nvml`` (s8).
"""
