"""Dagster shapes, one folder per runbook phase; loaded by ``recovery.definitions``."""
