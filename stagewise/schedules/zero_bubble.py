"""Zero Bubble ZB-H1 and ZB-H2 (Qi et al., ICLR 2024, arXiv:2401.10241).

The backward is split into I (input gradient, on the critical path) and W
(weight gradient, free to move). Both handcrafted schedules share one shape
per rank r: ``warmup`` forwards, then a steady ``I [W] F`` cycle, a cooldown
of ``I [W]``, and the W's still owed. The first ``delay`` cycles skip their W;
the W's put off that way fill the bubbles at the end.

- ZB-H1: 1F1B's warmup (plus its first steady F), W put off by r. Peak memory
  p activations on every rank, idle (p-1)(F+B-2W): a third of 1F1B's when
  F = I = W.
- ZB-H2: 2(p-r)-1 warmup forwards fill the wait for the first gradient, W put
  off by 2r fills the tail: a parallelogram with no idle inside each rank's
  span (the paper drops the step-end synchronisation to close the staircase),
  at 2p-1 activations.
"""

from __future__ import annotations

from ..actions import Action, run
from ..schedule import Schedule, make


def zb_h1(ranks: int, microbatches: int, chunks: int = 1) -> Schedule:
    p, m = ranks, microbatches
    programs = [split_program(r, m, warmup=p - r, delay=r) for r in range(p)]
    return make("zb-h1", programs, range(p), m)


def zb_h2(ranks: int, microbatches: int, chunks: int = 1) -> Schedule:
    p, m = ranks, microbatches
    programs = [split_program(r, m, warmup=2 * (p - r) - 1, delay=2 * r) for r in range(p)]
    return make("zb-h2", programs, range(p), m)


def split_program(stage: int, m: int, *, warmup: int, delay: int, backwards=None) -> list[Action]:
    """F x warmup, (I [W] F) while forwards remain, (I [W]) for the rest, then the W's owed. ``backwards``: the
    order of the units' I and W (default the forwards'; Seq1F1B's slices run theirs reversed in a micro-batch)."""
    warmup = min(warmup, m)
    back = range(m) if backwards is None else backwards
    fwd = run("F", stage, range(m))
    inp = run("I", stage, back)
    wgt = run("W", stage, back)
    prog = fwd[:warmup]  # warmup
    w = 0  # W's done so far; the i-th I (1-based) is followed by a W once i > delay
    for i in range(m):  # steady (I W F) while forwards remain, then cooldown (I W)
        prog.append(inp[i])
        if i >= delay:
            prog.append(wgt[w])
            w += 1
        if warmup + i < m:
            prog.append(fwd[warmup + i])
    prog += wgt[w:]  # the W's put off fill the tail
    return prog
