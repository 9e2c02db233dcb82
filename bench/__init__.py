"""Benchmarks: figures that matter, measured the same way every time (see README)."""
