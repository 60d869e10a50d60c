"""The planner: profile a model, split its layers, and pick the fastest schedule that fits."""
