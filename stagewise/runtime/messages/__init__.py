"""Cross-rank messages: ``p2p`` sends and receives the activations and gradients of a rank's lowered SENDs and
RECVs, posts receives in the sender's order (deadlock-free by construction) and checks each message's
structure, shapes and dtypes against the first of its step.

May import: the core, `stagewise.lowering`, `stagewise.runtime.resilience`, `stagewise.runtime.stages`, `torch`.
"""
