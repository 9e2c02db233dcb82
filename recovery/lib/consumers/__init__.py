"""Downstream consumers (SQL and Dagster assets), their outputs, and the damage's impact on them."""
