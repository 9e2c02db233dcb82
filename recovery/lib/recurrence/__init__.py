"""Recurrence gates: every future backfill of a managed dataset runs through one guarded launcher.

The launcher previews the scope without writing, refuses without approvals or past
capacity, records a manifest before its first write, builds the backfill in its own
generation (its own physical namespace and fencing token, seeded with the published
rows outside the range), runs invariant and anomaly gates on the new generation, and
publishes by the same atomic pointer move as a repair only when every gate passed.
The prior generation is kept until convergence verification passes.
"""
