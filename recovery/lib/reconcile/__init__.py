"""Source-to-output reconciliation: classify every damaged key, find damaged partitions."""

from recovery.lib.reconcile.classify import LABELS, ReconcileInputs, reconcile
from recovery.lib.reconcile.summary import ReconciliationSummary

__all__ = ["LABELS", "ReconcileInputs", "ReconciliationSummary", "reconcile"]
