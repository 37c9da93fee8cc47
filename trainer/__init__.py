"""Worker-side runtime: the reference GPT trainer, its data, checkpoints and agent channel.

The node agent starts ``python -m trainer.worker`` with a JSON ``WorkerLaunch`` in
``UNICRON_WORKER_LAUNCH``; everything else in this package serves that process.
"""
