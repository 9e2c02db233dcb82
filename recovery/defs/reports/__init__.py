"""Runbook "Done": the incident timeline, reconciliation and recovery reports, as files and as UI metadata."""
