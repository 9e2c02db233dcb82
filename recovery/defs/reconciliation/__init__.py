"""Runbook steps 4-5: source-to-output reconciliation by key and partition."""
