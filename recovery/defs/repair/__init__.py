"""Versioned repair: plan, waves, gates, publish."""
