"""Versioned repair: a new generation rebuilt from a fixed source snapshot, concurrent
ingestion replayed from the delta log, gated, and published by one pointer move."""
