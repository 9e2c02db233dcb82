"""The incident: its file, its draft from a failed backfill, how far it has got, the runbook's phases."""
