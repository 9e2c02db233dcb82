"""The worked example: a transaction pipeline whose six-month backfill goes wrong.

It is a *user* of the package: it writes through the package's writer like any
pipeline would, and its bugs are the seed runbook's. Nothing in ``recovery.lib``
or ``recovery.defs`` imports from here.
"""
