"""Tests of the planner's pure model, the library ``unicron.planning``."""
