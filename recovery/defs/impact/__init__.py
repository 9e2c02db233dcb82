"""Runbook step 6: trace the damage to every downstream consumer."""
