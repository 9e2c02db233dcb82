"""Intake: from a failed Dagster backfill of a managed dataset to a draft incident."""
