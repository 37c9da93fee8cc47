"""Unicron's common package: the one home of message and state schemas, bus, state and settings."""
