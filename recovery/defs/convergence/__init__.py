"""Runbook step 12: verify that ongoing ingestion and late arrivals converge after the repair."""
