"""ZB-V, zero bubble in a V (Qi et al., NeurIPS 2024, arXiv:2405.15362).

The model is cut into 2p stages; rank r holds stage r (chunk 0, on the way
down) and stage 2p-1-r (chunk 1, on the way back up), so rank 0 holds both the
first and the last stage. Backward is split into I and W. With t_F = t_I = t_W
the handcrafted order leaves no idle inside any rank's span (on a shared step
end only the fill remains: p-1 half-stage forwards, half of ZB-H1's) at the
peak memory of 1F1B (2p half-size chunks). The order is written for n = max(m, 2p-1) micro-batches, enough to
fill the V; with fewer, the actions of the micro-batches that do not exist are
dropped, which keeps every dependency (torch does the same).
"""

from __future__ import annotations

from itertools import chain

from ..actions import Action, run
from ..schedule import Schedule, make


def zb_v(ranks: int, microbatches: int, chunks: int = 2) -> Schedule:
    p, m = ranks, microbatches
    n = max(m, 2 * p - 1)
    programs = []
    for r in range(p):
        prog = _program(p, r, n)
        if n > m:
            prog = [a for a in prog if a.mb < m]
        programs.append(prog)
    placement = [s if s < p else 2 * p - 1 - s for s in range(2 * p)]
    return make("zb-v", programs, placement, m)


def _program(p: int, r: int, n: int) -> list[Action]:
    down, up = r, 2 * p - 1 - r  # chunk 0 and chunk 1 of rank r
    F0, I0, W0 = (run(k, down, range(n)) for k in "FIW")
    F1, I1, W1 = (run(k, up, range(n)) for k in "FIW")
    # warmup: fill the way down, turn at the bottom of the V, then F I W on the way up
    warmup_down = 2 * (p - r) - 1
    warmup_turn = r
    warmup_up = p - r  # until chunk 0's first gradient can arrive
    f0 = warmup_down + warmup_turn
    prog = F0[:warmup_down]
    prog += chain.from_iterable(zip(F1[:warmup_turn], F0[warmup_down:f0]))
    prog += chain.from_iterable(zip(F1[warmup_turn:p], I1[:warmup_up], W1[:warmup_up]))
    # steady: F0 I0 W0 F1 I1 W1 while chunk 0 has forwards left, then I0 W0 F1 I1 W1
    steady = n - p  # one chunk-1 forward each
    prog += chain.from_iterable(zip(F0[f0:], I0, W0, F1[p:], I1[warmup_up:], W1[warmup_up:]))
    k = n - f0  # steady cycles with a chunk-0 forward
    b1 = warmup_up + k
    prog += chain.from_iterable(zip(I0[k:steady], W0[k:], F1[p + k:], I1[b1:], W1[b1:]))
    # cooldown: the input gradients drain, then the W's they leave behind
    b0, b1 = steady, n - r
    cooldown_both = r
    cooldown_down = p - r
    prog += chain.from_iterable(zip(I0[b0:b0 + cooldown_both], I1[b1:]))
    prog += chain.from_iterable(zip(I0[b0 + cooldown_both:], W0[b0:b0 + cooldown_down]))
    prog += W1[b1:]
    prog += W0[b0 + cooldown_down:]
    return prog
