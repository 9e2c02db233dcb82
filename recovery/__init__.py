"""backfill-recovery: recover from a failed data backfill as one governed, verifiable workflow."""

__version__ = "0.1.0"
