"""Local servers for ``unicron up``, the demo and the tests: embedded NATS (one or a cluster of
three) and Redis (alone, or a primary, a replica and Sentinels), and their credentials."""
