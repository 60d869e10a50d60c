"""launching."""
