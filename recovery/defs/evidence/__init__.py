"""Runbook step 3: preserve the evidence, immutably and owner-only, before anything is cleaned."""
