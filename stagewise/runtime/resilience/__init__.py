"""resilience."""
