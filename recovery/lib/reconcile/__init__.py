"""Source-to-output reconciliation: classify every damaged key, find damaged partitions."""

from recovery.lib.reconcile.classify import ReconcileInputs, reconcile
from recovery.lib.reconcile.labels import DAMAGE_LABELS, LABELS
from recovery.lib.reconcile.summary import ReconciliationSummary

__all__ = ["DAMAGE_LABELS", "LABELS", "ReconcileInputs", "ReconciliationSummary", "reconcile"]
