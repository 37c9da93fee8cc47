"""The planner: turns jobs, failures and nodes into a whole-cluster allocation (DESIGN.md §4).

Layers, from pure to wired:

- :mod:`.api` — the inputs and the pluggable models (throughput, transition cost);
- :mod:`.throughput`, :mod:`.costs` — today's implementations of those models;
- :mod:`.objective` — the reward G(t, x) of each job for each worker count;
- :mod:`.dp` — the dynamic programme over jobs and slot units (numpy, no I/O);
- :mod:`.placement` — worker counts → a node per rank;
- :mod:`.planning` — Redis records → inputs → plan draft (pure);
- :mod:`.service` — bus and Redis wiring, debounce, periodic reconcile.
"""
