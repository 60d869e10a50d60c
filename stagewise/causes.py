"""The causes of idle time in plain words: what each one means, and one sentence per gap a student reads first.

``explain`` finds each gap's cause (``explain.CAUSES``) and words it in the exact terms (the chain of
ops, the stage's durations). This module says the same in words: ``MEANING`` is what a cause means in
general (the workshop's legend and Teach), ``plain(gap, timeline)`` is one sentence about this gap
(the workshop's Why it waits and ``stagewise explain`` print it before the exact line). A cause that
``explain`` adds gets its words here too (tests/test_causes.py holds the two lists together).

>>> from stagewise.schedules import generate
>>> from stagewise.simulate import simulate
>>> from stagewise.explain import explain
>>> tl = simulate(generate("1f1b", 4, 8))
>>> plain(explain(tl)[0], tl)
"rank 0 waits for micro-batch 0's gradient: it comes back only after micro-batch 0 has gone through \
every later stage (the pipeline is still filling)"
"""

from __future__ import annotations

from .actions import Pair
from .explain import KEYS, SLICE_INPUTS

#: cause -> (a short label, what it means in one sentence)
MEANING = {
    "fill": ("the pipeline fills", "a rank has nothing to do yet: the first micro-batches have not reached it, "
             "or their gradients have not come back"),
    "drain": ("the pipeline drains", "a rank has no forward left to run, so nothing fills its wait for the last "
              "gradients, or it has finished and waits for the step to end"),
    "slow stage": ("a slower stage", "a stage slower than the others sets the pace: its neighbours wait for it"),
    "link": ("a message in flight", "a rank waits for a result that is ready on another rank but still travelling "
             "over the link"),
    "order": ("the order of the programs", "a rank waits on another that is busy with other work its program runs "
              "first"),
    "collective": ("a collective in flight", "a rank waits for a gather of its weights, or the step waits for a "
                   "gradient reduction or all-reduce, still in flight on the network"),
}

_KIND = {"F": "forward", "B": "backward", "I": "input gradient", "W": "weight gradient"}


def label(cause: str) -> str:
    """The cause's short label ('the pipeline fills')."""
    return MEANING[cause][0]


def meaning(cause: str) -> str:
    """What the cause means, in one sentence."""
    return MEANING[cause][1]


def op_words(op, stages: bool = True, slices: int = 1) -> str:
    """An op as a student reads it: "micro-batch 4's forward (stage 7)", an F&B pair by its two halves; with
    sequence slices "micro-batch 2 slice 0's forward (stage 7)".

    >>> from stagewise.actions import parse
    >>> op_words(parse("(7F4;0B0)OVERLAP_F_B"))
    "micro-batch 4's forward and micro-batch 0's backward as one F&B pair (stages 7 and 0)"
    """
    if type(op) is Pair:
        f, b = op
        where = f" (stages {f.stage} and {b.stage})" if stages else ""
        return (f"micro-batch {unit_words(f.mb, slices)}'s forward and micro-batch {unit_words(b.mb, slices)}'s "
                f"backward as one F&B pair{where}")
    where = f" (stage {op.stage})" if stages else ""
    return f"micro-batch {unit_words(op.mb, slices)}'s {_KIND[op.kind]}{where}"


def unit_words(mb: int, slices: int = 1) -> str:
    """A unit after "micro-batch": "4", or with slices "2 slice 0".

    >>> unit_words(5, 2)
    '2 slice 1'
    """
    return str(mb) if slices == 1 else "%d slice %d" % divmod(mb, slices)


def plain(gap, timeline) -> str:
    """One sentence about ``gap`` (an ``explain.Gap`` of ``timeline``) in plain words, without op codes."""
    progs, k = timeline.schedule.programs, timeline.schedule.slices
    many = timeline.schedule.stages > timeline.schedule.ranks  # several stages a rank: name the stage
    r = gap.rank

    def op(at):
        return progs[at.rank][at.pos]

    if gap.cause == "collective" and gap.comm is not None:
        from .comm_actions import describe

        c, q, start, end = gap.comm
        t0 = timeline.origin
        whose = "" if q == r else f" on rank {q}"
        now = "has finished its part of the step and " if gap.before is None else ""
        return (f"rank {r} {now}waits for {describe(c, q)}{whose}: it is still on the network (from "
                f"{start - t0:.4g} to {end - t0:.4g})")
    if gap.before is None:
        return f"rank {r} has finished its part of the step and waits for the other ranks to finish (the pipeline drains)"
    waiting = op(gap.before)
    if not gap.chain:
        return (f"rank {r} started {op_words(waiting, many, k)} later than it could: what it needs was already there "
                "(time spent between ops, not a dependency)")
    first = gap.chain[0]
    if first.what in SLICE_INPUTS:  # a neighbour slice on its own stage (a measured timeline's late start)
        j, i = waiting.mb % k, op(first.waits_for).mb % k
        return (f"rank {r}: slice {j} of micro-batch {waiting.mb // k} waits for slice {i}'s "
                + ("forward on this stage: its keys and values" if first.what == KEYS else
                   "backward on this stage: the gradients of its keys and values"))
    mb = unit_words(_mb(waiting, first.what), k)
    if gap.cause == "fill":
        if first.what == "activation":
            return f"rank {r} has nothing to do yet: micro-batch {mb} has not reached it (the pipeline is filling)"
        return (f"rank {r} waits for micro-batch {mb}'s gradient: it comes back only after micro-batch {mb} has gone "
                "through every later stage (the pipeline is still filling)")
    if gap.cause == "drain":
        return (f"rank {r} has no forward left to run, so it can only wait for micro-batch {mb}'s gradient to come "
                f"back from rank {first.waits_for.rank} (the pipeline drains)")
    if gap.cause == "link":
        if first.in_flight >= gap.length - 1e-9 * max(1.0, gap.end):  # the whole gap is the message
            return (f"rank {r} waits for a message: micro-batch {mb}'s {first.what} is ready on rank "
                    f"{first.waits_for.rank} but still on its way over the link")
        return (f"rank {r} waits for micro-batch {mb}'s {first.what}, held up by messages between ranks on its way: "
                "with free links most of this wait would go")
    if gap.cause == "slow stage":
        slow = _slowest(gap, timeline)
        if slow is None:
            return f"rank {r} waits on a slower stage: the slowest stage sets the pace"
        kind, stage, took, fast = slow
        return (f"rank {r} waits on a slow stage: stage {stage}'s {_KIND[kind]} takes {took:.4g} where the fastest "
                f"stage's takes {fast:.4g}, and the slowest stage sets the pace")
    blocker = gap.blocker
    if gap.cause == "order" and blocker is not None:
        return (f"rank {r} waits for micro-batch {mb}'s {first.what} from rank {first.waits_for.rank}: it is late "
                f"because rank {blocker.rank} ran {op_words(op(blocker), many, k)} first, as its program orders")
    return f"rank {r} waits: {meaning(gap.cause)}"


def _mb(op, what: str) -> int:
    """The micro-batch the waiting op waits on: a pair's forward half waits for an activation, its backward half
    for a gradient."""
    if type(op) is Pair:
        return op.forward.mb if what == "activation" else op.backward.mb
    return op.mb


def _slowest(gap, timeline) -> tuple[str, int, float, float] | None:
    """(kind, stage, its time, the fastest time of its kind) of the op on the gap's chain (or the one keeping its rank busy) that is slowest against the
    fastest op of its kind, from the timeline's times alone."""
    progs = timeline.schedule.programs
    fastest: dict[str, float] = {}
    for r, prog in enumerate(progs):
        for k, op in enumerate(prog):
            if type(op) is not Pair:
                took = timeline.ends[r][k] - timeline.starts[r][k]
                fastest[op.kind] = min(took, fastest.get(op.kind, took))
    best, ratio = None, 1.0 + 1e-9
    for at in [s.waits_for for s in gap.chain] + ([gap.blocker] if gap.blocker else []):
        op = progs[at.rank][at.pos]
        if type(op) is Pair or not fastest.get(op.kind):
            continue
        took = timeline.ends[at.rank][at.pos] - timeline.starts[at.rank][at.pos]
        if took / fastest[op.kind] > ratio:
            best, ratio = (op.kind, op.stage, took, fastest[op.kind]), took / fastest[op.kind]
    return best


def gap_json(gap, timeline) -> dict:
    """``explain.gap_dict`` with the plain sentence and the cause's label and meaning."""
    from .explain import gap_dict

    return {**gap_dict(gap, timeline), "plain": plain(gap, timeline), "label": label(gap.cause),
            "meaning": meaning(gap.cause)}


def lines(gap, timeline) -> tuple[str, str]:
    """(the plain sentence, the exact line) of a gap, each after the gap's "rank r idle a..b (n): " head."""
    head = gap.text[: gap.text.index("): ") + 3]
    return head + plain(gap, timeline), gap.text[len(head):]


__all__ = ["MEANING", "label", "meaning", "op_words", "plain", "gap_json", "lines"]
