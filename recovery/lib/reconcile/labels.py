"""The damage vocabulary: the one list of labels reconciliation gives a damaged key, in report order."""

from __future__ import annotations

DAMAGE_LABELS = (
    "duplicate",
    "out_of_order",
    "resurrected",
    "unexpected",
    "missing",
    "deleted",
    "mispartitioned",
    "overwritten",
    "stale",
    "incorrectly_transformed",
)
"""The kinds of damage a failed backfill leaves, each with its cause (the worked example's truth uses these)."""

LABELS = (*DAMAGE_LABELS, "unexplained")
"""Every label a reconciliation row can carry: a damage kind, or ``unexplained`` (a difference no cause fits)."""
