"""The planner: turns jobs, failures and nodes into a whole-cluster allocation (docs/design.md §4).

Layers, from pure to wired:

- :mod:`.spec`, :mod:`.clusters` — model shapes, cluster descriptions and their presets;
- :mod:`.api` — the inputs and the pluggable models (throughput, transition cost);
- :mod:`.perf` — the Megatron-style performance model and its cached configuration search;
- :mod:`.throughput`, :mod:`.costs` — T(t, x) and D_trans(t, x_old → x) behind the protocols;
- :mod:`.objective` — the reward G(t, x) of each job for each unit count;
- :mod:`.dp` — the dynamic programme over jobs and units, and its alternatives (numpy);
- :mod:`.quotas` — the DP under per-tenant quotas (a group knapsack), alternatives included;
- :mod:`.fairness`, :mod:`.allocation` — the policy against starvation (waf, aging,
  guaranteed_min) and the quotas, applied around the DP;
- :mod:`.placement` — worker counts → a node per rank, TP groups within a node;
- :mod:`.explain` — per job: the terms of its G and the best alternatives that lost;
- :mod:`.waiting` — why a job gets no workers (capacity, quota, minimum, marginal value);
- :mod:`.planning` — Redis records → inputs → explained plan draft (pure);
- :mod:`.calibration`, :mod:`.feedback` — step times, downtimes and failures → Redis;
- :mod:`.publish`, :mod:`.service` — lease, bus and Redis wiring, debounce, reconcile.
"""
