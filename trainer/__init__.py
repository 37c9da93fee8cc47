"""Worker-side runtime: the reference GPT trainer, its data, checkpoints, the agent channel,
step telemetry (phases, compute time), exception classification and fault drills.

The node agent starts ``python -m trainer.worker`` with a JSON ``WorkerLaunch`` in
``UNICRON_WORKER_LAUNCH``; everything else in this package serves that process.
"""
