"""Alerts: how the recovery tells people that something needs them (log, file or webhook)."""
