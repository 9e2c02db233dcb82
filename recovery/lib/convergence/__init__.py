"""Convergence verification: after a repair is published, ongoing ingestion and late arrivals
must keep the target equal to the source; each check records drift per partition over time."""

from recovery.lib.convergence.verify import ConvergenceResult, PartitionDrift, drift_history, verify_convergence

__all__ = ["ConvergenceResult", "PartitionDrift", "drift_history", "verify_convergence"]
