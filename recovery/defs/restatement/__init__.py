"""Runbook step 11: restate every downstream consumer from the published repair, keep the originals."""
