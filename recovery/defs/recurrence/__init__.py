"""Recurrence gates: the guarded backfill launcher."""
