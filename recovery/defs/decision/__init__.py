"""Runbook step 7: rollback only to a complete prior state, otherwise a new repair generation."""
