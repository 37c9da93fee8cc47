"""Unicron: a self-healing workload manager for clusters that train large language models.

A training script imports only this package: :mod:`unicron.train` is the training API that
gives a user's own model, optimizer, loss and dataset in-band failure reports, in-place
regroup and exact partial-step reuse. The rest of the product lives in subpackages that are
folders of the repository (``shared``, ``planning``, ``services``, ``trainer``, ``cli``,
``simulator``) and are installed here, under ``unicron``, so none of them takes a top-level name
in a user's environment; see docs/design.md, "Layout".
"""

__version__ = "0.2.0"
