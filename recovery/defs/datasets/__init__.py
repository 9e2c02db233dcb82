"""More datasets in the same code location (``RECOVERY_SPECS``), each under its own key prefix and group."""
