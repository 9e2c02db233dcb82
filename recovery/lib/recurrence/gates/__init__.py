"""The guarded backfill's gates: invariants, anomaly, profile and values, and the value preview."""
