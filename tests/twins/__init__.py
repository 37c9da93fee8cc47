"""The in-memory twins of the bus and the store, for unit tests only (never installed)."""
