"""Expert-parallel all-to-all beside compute: what each op pays, and what of it is hidden.

A rank has two resources, its compute and its communication. An MoE layer's
forward is attention (compute), dispatch (all-to-all), the experts (compute),
combine (all-to-all); its backward retraces it (combine's gradient, the
experts', dispatch's gradient, attention's). Within one micro-batch each step
needs the one before, so a plain F, B or I pays its compute and then its
all-to-all (drawn as one block at the end of the op: per layer they alternate).
W has no all-to-all.

An F&B pair (DualPipe's overlapped forward and backward of two micro-batches)
runs the two halves' components interleaved, each all-to-all while the other
half computes, with the backward's weight-gradient part free to fill (the
DeepSeek-V3 report's Figure 4: "both all-to-all and PP communication can be
fully hidden"). Its time is what no interleaving can beat:

    max(c_F + c_B,  a_F + a_B,  c_F + a_F,  a_B + c_I)

the compute stream, the communication stream, the forward's own chain, and the
backward's chain without its weight part (c_I, the input-gradient compute;
c_B = c_I + c_W). The compute stream waits for the rest: exposed = time - c_F - c_B.
With no all-to-all this is c_F + c_B, the sum of the halves, exactly as before;
with a_F = c_F and a_B = c_B it is c_F + c_B again: at 1:1 everything is hidden.

``comm_lanes`` lays each rank's all-to-alls out on its own lane (a ``Comm`` per
action that has one): a plain op's at its end; in a pair the backward's at the
start and the forward's at the end, so they never overlap (when they fill the
pair, the pair is communication-bound and they abut). The exposed part of a
pair is split between its halves in proportion to their all-to-all.
"""

from __future__ import annotations

from collections import namedtuple

from .actions import Pair
from .costs import StageCosts


class Comm(namedtuple("Comm", ("op", "action", "start", "end", "exposed", "kind"), defaults=("a2a",))):
    """One action's all-to-all on its rank's communication lane (hundreds of thousands for big schedules).

    ``op``: position of the op it belongs to in the rank's program; ``action``: whose all-to-all; ``start``,
    ``end``; ``exposed``: seconds of it during which the rank computes nothing (waits for it); ``kind``: what it
    is, "a2a" (an action's expert all-to-all, the default), or a lowered communication action's kind
    (``comm_actions``: SEND_F, UNSHARD, REDUCE_GRAD, ...; ``action`` is then that CommAction).
    """

    __slots__ = ()


def pair_time(c_f: float, a_f: float, c_b: float, a_b: float, c_i: float) -> float:
    """Duration of an F&B pair: forward compute ``c_f`` and all-to-all ``a_f``, backward compute ``c_b``
    (of which ``c_i`` is the input-gradient part) and all-to-all ``a_b``.

    >>> pair_time(1, 1, 2, 2, 1)  # 1:1, backward twice the forward: all hidden
    3
    >>> pair_time(1, 2, 2, 4, 1)  # 1:2: the all-to-all stream sets the pace
    6
    """
    return max(c_f + c_b, a_f + a_b, c_f + a_f, a_b + c_i)


def pair_parts(op: Pair, sc: StageCosts) -> tuple[float, float, float, float, float]:
    """(c_f, a_f, c_b, a_b, c_i) of a pair under ``sc``."""
    fa, ba = op
    c_b = sc.compute(ba.kind, ba.stage, ba.mb)
    c_i = c_b if ba.kind == "I" else min(c_b, sc.i[ba.stage] * sc.time_factor(ba.mb))  # a full B's chain: its I
    return sc.compute("F", fa.stage, fa.mb), sc.comm("F", fa.stage, fa.mb), c_b, sc.comm(ba.kind, ba.stage, ba.mb), c_i


def comm_lanes(schedule, sc: StageCosts, starts, ends) -> tuple[tuple[Comm, ...], ...] | None:
    """Per rank, the ``Comm`` of every action with an all-to-all, in program order; None without any."""
    if sc.a2a_f is None:
        return None
    out = []
    for r, prog in enumerate(schedule.programs):
        lane: list[Comm] = []
        for k, (op, s, e) in enumerate(zip(prog, starts[r], ends[r])):
            if type(op) is Pair:
                c_f, a_f, c_b, a_b, _ = pair_parts(op, sc)
                exposed = max(0.0, (e - s) - c_f - c_b)
                total = a_f + a_b
                if a_b > 0:
                    lane.append(Comm(k, op.backward, s, s + a_b, exposed * a_b / total))
                if a_f > 0:
                    lane.append(Comm(k, op.forward, e - a_f, e, exposed * a_f / total))
            else:
                a = sc.comm(op.kind, op.stage, op.mb)
                if a > 0:
                    lane.append(Comm(k, op, e - a, e, a))
        out.append(tuple(lane))
    return tuple(out)


def totals(comm: tuple[tuple[Comm, ...], ...] | None, ranks: int,
           kind: str = "a2a") -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(seconds, exposed seconds) per rank of the transfers of ``kind`` (default: the all-to-alls)."""
    if comm is None:
        return (0.0,) * ranks, (0.0,) * ranks
    return (tuple(sum(c.end - c.start for c in lane if c.kind == kind) for lane in comm),
            tuple(sum(c.exposed for c in lane if c.kind == kind) for lane in comm))


def kinds(comm: tuple[tuple[Comm, ...], ...] | None) -> list[str]:
    """The kinds of transfer in ``comm``, in order of first appearance."""
    return list(dict.fromkeys(c.kind for lane in comm or () for c in lane))
