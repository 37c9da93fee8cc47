"""Cluster simulator: replays failure traces on a simulated GPU cluster under several recovery
policies (Unicron and the paper's baselines) and scores each by accumulated WAF (docs/design.md §4).

Modules, one concept each:

- :mod:`.inputs` — cluster and job files (JSON), validated with the line of each error;
- :mod:`.trace` — failure traces: CSV loading, and generation from the paper's failure mix;
- :mod:`.events` — the discrete-event queue;
- :mod:`.workload` — jobs as the planner sees them (shape, demand) and their throughput;
- :mod:`.cluster` — nodes, their health and which job holds which slots;
- :mod:`.state` — the simulation a policy acts on: jobs' allocations, downtime, accrual;
- :mod:`.policies` — one module per recovery policy, and their registry;
- :mod:`.metrics` — timelines and the summary (each job's waiting among it);
- :mod:`.fairness` — the planner's policies against starvation compared on one scenario;
- :mod:`.plots` — WAF over time and GPUs per job (PNG);
- :mod:`.runner` — the event loop that ties them together.
"""
