"""Convergence verification: after a repair is published, ongoing ingestion and late arrivals
must keep the target equal to the source; each check records, per partition over time, drift,
the changes still pending after the watermark, and the watermark with where it comes from."""

from recovery.lib.convergence.result import ConvergenceResult, PartitionDrift
from recovery.lib.convergence.verify import drift_history, verify_convergence

__all__ = ["ConvergenceResult", "PartitionDrift", "drift_history", "verify_convergence"]
