"""Containment: fence the failed generation, stop the Dagster work that produced it, watch for more.

``contain_backfill`` (jobs.py) is the runbook's first rule, stop further writes;
the fencing sensor (sensors.py) keeps it true afterwards.
"""
