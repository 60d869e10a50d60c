"""HiGHS, the integer-program solver both exact searches use (the partitioner and the optimal order), and
the helpers both build their programs with."""

from __future__ import annotations

from .errors import PlanError


def linear(terms):
    """Sum of HiGHS expressions and numbers; coefficients that cancel to rounding noise are dropped
    (HiGHS refuses a row with a coefficient below 1e-9)."""
    total = None
    for t in terms:
        total = t if total is None else total + t
    if total is None:
        return 0.0
    if isinstance(total, (int, float)) or not hasattr(total, "simplify"):
        return total  # a number, or a single variable
    total = total.simplify()
    kept = [(i, v) for i, v in zip(total.idxs, total.vals) if abs(v) > 1e-12]
    total.idxs, total.vals = [i for i, _ in kept], [v for _, v in kept]
    return total


def quiet_highs(highspy):
    """A HiGHS instance with its banner (printed to the C stdout on creation) silenced."""
    import os
    import sys

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            hs = highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    hs.setOptionValue("output_flag", False)
    # one thread: twice as fast on these small programs, and the machine is shared; HiGHS keeps
    # one thread pool per process, so every instance here asks for the same count
    hs.setOptionValue("threads", 1)
    return hs


def highspy_module(purpose: str):
    """The highspy module, or a PlanError saying ``purpose`` needs it."""
    try:
        import highspy
    except ImportError:
        raise PlanError(f"{purpose} needs HiGHS: pip install 'stagewise[plan]'") from None
    return highspy
