"""Cross-rank messages: ``p2p`` derives every activation and gradient a rank sends and receives from the
programs, posts receives in the sender's order (deadlock-free by construction) and checks each message's
structure, shapes and dtypes against the first of its step.

May import: the core, `stagewise.lowering`, `stagewise.runtime.resilience`, `stagewise.runtime.stages`, `torch`.
"""
