"""Interleaved 1F1B, Megatron-LM virtual stages (Narayanan et al. 2021).

Rank r holds v chunks: stages ``r, r + p, ..., r + (v-1) p`` (round-robin).
Every rank walks the same forward order, Megatron's *schedule table*: micro-
batches in groups of N = ``microbatch_group_size_per_vp_stage``, each group
through chunk 0, then chunk 1, ...; the last group takes what is left. The
backward order is the same table with the chunks reversed. Megatron accepts
any N in [p, m] whose last group is empty or holds at least p micro-batches
(a shorter one deadlocks: its chunks turn over before the warmup covers
them); we take the smallest such N, which is p when p divides m, so any
m >= p works.

The bubble shrinks to (1/v)(p-1)/m of the ideal time, at the price of v times
the point-to-point messages.
"""

from __future__ import annotations

from ..actions import Action, new
from ..schedule import Schedule, make


def schedule_table(microbatches: int, chunks: int, group: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) in forward order, as Megatron's ``get_schedule_table``."""
    table = []
    for lo in range(0, microbatches, group):
        hi = min(lo + group, microbatches)
        table += [(mb, c) for c in range(chunks) for mb in range(lo, hi)]
    return table


def group_size(ranks: int, microbatches: int) -> int:
    """Smallest valid ``microbatch_group_size_per_vp_stage`` (Megatron's rule)."""
    for n in range(ranks, microbatches):
        last = microbatches % n
        if last == 0 or last >= ranks:
            return n
    return max(ranks, microbatches)  # one group


def num_warmup_microbatches(ranks: int, rank: int, chunks: int, group: int, total: int) -> int:
    """Forwards before the first backward (Megatron's ``get_pp_rank_microbatches``)."""
    if chunks == 1:
        warmup = ranks - rank - 1  # plain 1F1B
    else:
        # the first backward of the last chunk comes back 2 hops per rank later
        warmup = (ranks - rank - 1) * 2 + (chunks - 1) * group
    return min(warmup, total)


def interleaved_1f1b(ranks: int, microbatches: int, chunks: int = 2) -> Schedule:
    p, m, v = ranks, microbatches, chunks
    group = group_size(p, m) if v > 1 else p  # microbatch_group_size_per_vp_stage
    table = schedule_table(m, v, group)
    total = m * v  # stage-visits per rank
    programs = []
    for r in range(p):
        forwards = [new(Action, ("F", c * p + r, mb)) for mb, c in table]
        backwards = [new(Action, ("B", (v - 1 - c) * p + r, mb)) for mb, c in table]
        warmup = num_warmup_microbatches(p, r, v, group, total)
        steady = total - warmup
        prog = forwards[:warmup]  # warmup
        for f, b in zip(forwards[warmup:], backwards[:steady]):  # steady 1F1B
            prog += (f, b)
        prog += backwards[steady:]  # cooldown
        programs.append(prog)
    placement = [s % p for s in range(p * v)]
    return make("interleaved-1f1b", programs, placement, m)
