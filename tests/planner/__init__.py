"""Tests of the planner service."""
