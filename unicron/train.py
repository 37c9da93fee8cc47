"""The training API: a user's own model, optimizer, loss and data, healed by Unicron.

A plain PyTorch data-parallel script becomes a Unicron job with a few changed lines::

    import unicron.train

    run = unicron.train.init()                      # instead of init_process_group
    model = Net().to(run.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    run.wrap(model, optimizer)                      # instead of DDP(model); resumes the job
    for x, y in run.batches(dataset):               # instead of the DataLoader loop
        run.backward(F.cross_entropy(model(x), y))  # instead of loss.backward(); opt.step()

:func:`init` reads the ``WorkerLaunch`` its node agent put in ``UNICRON_WORKER_LAUNCH`` and
joins the job's process group (through the agent's store, not ``MASTER_ADDR``). Steps, global
and micro batch, checkpoint interval and seed come from the job spec (``run.spec``); it seeds
torch with the job seed. :meth:`Run.batches` yields this rank's micro-batches of steps
``1..spec.steps`` (see :mod:`unicron.trainer.sampling`); after a step's last micro-batch it
all-reduces the gradients, steps the optimizer (and scheduler), reports the step to the agent and
writes the checkpoint when due (one copy per node, and to ``UNICRON_CHECKPOINT_URL`` when set). In
between it heals: a lost peer parks this rank with its memory until the control plane re-forms
the group, a joiner takes the state from a live peer, and an interrupted step is completed
without losing or repeating a sample.

An exception that ends the script — raised by a step or in the loop body — is classified and
reported to the agent once, before the process exits 1 (an exception hook installed by
:func:`init`). Without ``UNICRON_WORKER_LAUNCH`` the script runs as one local process.
"""

from unicron.trainer.run import Run, init

__all__ = ["Run", "init"]
