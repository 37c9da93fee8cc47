"""The planner's pure model: jobs, nodes and measurements in, a whole-cluster plan out.

A library, not a service: no Redis, no NATS, no process lifecycle, and callers pass the time.
The planner service (``unicron.services.planner``) feeds it records read from Redis and publishes
what it returns; the simulator (``simulator``) feeds it simulated clusters, so both plan with the
same code (docs/design.md §4, §8). Layers, from the vocabulary up:

- :mod:`.api` — the inputs, the pluggable models' protocols (throughput, transition cost) and
  the values they exchange;
- :mod:`.spec`, :mod:`.clusters` — model shapes, cluster descriptions and their presets;
- :mod:`.perf` — the Megatron-style performance model and its cached configuration search;
- :mod:`.throughput`, :mod:`.costs` — T(t, x) and D_trans(t, x_old → x) behind the protocols;
- :mod:`.calibration` — the exported calibration record ↔ what the models consume;
- :mod:`.objective` — the reward G(t, x) of each job for each unit count;
- :mod:`.dp` — the dynamic programme over jobs and units, and its alternatives (numpy);
- :mod:`.quotas` — the DP under per-tenant quotas (a group knapsack), alternatives included;
- :mod:`.fairness`, :mod:`.allocation` — the policy against starvation (waf, aging,
  guaranteed_min) and the quotas, applied around the DP;
- :mod:`.placement` — worker counts → a node per rank, TP groups within a node;
- :mod:`.explain` — per job: the terms of its G and the best alternatives that lost;
- :mod:`.waiting` — why a job gets no workers (capacity, quota, minimum, marginal value);
- :mod:`.planning` — job and node records → inputs → explained plan draft.

Nothing here imports ``unicron.services``.
"""
