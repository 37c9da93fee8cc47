"""The planner service: turns jobs, failures and nodes into a whole-cluster allocation
(docs/design.md §4), one active instance under a lease.

The model it plans with is the library :mod:`unicron.planning`; this package wires it to the
cluster:

- :mod:`.settings` — ``UNICRON_PLANNER_*``: the cluster preset, models, fairness and quotas;
- :mod:`.calibration`, :mod:`.feedback` — step times, downtimes and failures → Redis;
- :mod:`.publish`, :mod:`.service` — lease, bus and Redis wiring, debounce, reconcile.
"""
