"""Unicron: a self-healing workload manager for clusters that train large language models.

A training script imports only this package: :mod:`unicron.train` is the training API that
gives a user's own model, optimizer, loss and dataset in-band failure reports, in-place
regroup and exact partial-step reuse. The rest of the product lives in folders of the
repository that the build maps into this package (pyproject.toml, ``package-dir``): the folder
``shared/bus/bus.py`` is the module ``unicron.shared.bus.bus``, and none of them takes a
top-level name in a user's environment. CONTRIBUTING.md maps the folders to their concepts.
"""

__version__ = "0.2.0"
