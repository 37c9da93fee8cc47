"""Worker-side runtime behind the public training API :mod:`unicron.train`: the elastic rank
(regroup, hand-off, partial-step reuse, the sample ledger), the one definition of a step,
checkpoints, the agent channel, step telemetry (phases, compute time), exception
classification, fault drills, and the built-in GPT trainer written on that API
(:mod:`unicron.trainer.gpt`, started by the agent as ``python -m unicron.trainer.worker``).
"""
