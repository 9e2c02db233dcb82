"""Dagster-free domain logic: spec, engine, control plane, writer, classification, reports."""
