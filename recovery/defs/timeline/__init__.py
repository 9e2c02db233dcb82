"""Runbook step 1: the incident timeline, rebuilt from the control plane and Dagster's event log."""
