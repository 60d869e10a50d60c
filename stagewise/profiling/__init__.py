"""Measuring for the planner, on the runtime (so above it, the planner and hf):
``measure`` (a model layer by layer: F, B, I, W, bytes), ``link`` (the
point-to-point link between two local ranks), ``step_overhead`` (what a step costs outside the layers) and
``verify`` (``plan --verify``: the top configurations run, predicted next to measured). It rebuilds the
model a profile names, an HF one included.

May import: the core, `stagewise.schedules`, `stagewise.plan`, `stagewise.hf`, `stagewise.runtime`, `torch`."""
