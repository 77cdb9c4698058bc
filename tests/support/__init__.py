"""Helpers shared by tests: real components started for real (servers, processes, reference models)."""
