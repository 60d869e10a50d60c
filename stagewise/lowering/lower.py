"""``lower(schedule, parallelism, options)``: every rank's compute program with the communication it performs.

The rules, each in one place here and in rules.py (the runtime's executor walks these programs as they are,
runtime/execution/program.py and executor.py):

- **sends and receives**: an F sends its output on when the next stage of its lane is on another rank
  (``SEND_F``), a B or I sends its input gradient back (``SEND_B``); each send follows its op. A receive
  (``RECV_F``/``RECV_B``) comes before the op that needs it, together with every earlier message of the same
  sender not yet received: receives from one sender are posted in that sender's order (NCCL's FIFO per
  pair; what the runtime's message plan does).
- **headers** (``LoweringOptions.headers``): a message whose shapes the receiver does not know yet is preceded,
  on the same channel and in the same order, by its header (``SEND_F_HDR`` right before its ``SEND_F``,
  ``RECV_F_HDR`` right before its ``RECV_F``; ``_B_HDR`` for a gradient): the first message of each boundary
  on each channel (``first``), or every message (``every``: micro-batches of different shapes). The shapes
  never travel in an exchange of their own, whose order could differ from the data's (Megatron-LM #5100).
- **FSDP** (``fsdp`` > 1): a stage's ``UNSHARD`` (all-gather) is issued one stage ahead: at the first forward
  of the stage whose first forward comes before its own (the program's first stage: at its first op),
  ahead of that op's receives; its ``REDUCE_GRAD`` (reduce-scatter, with ``dp`` > 1 then an all-reduce over
  dp: HSDP) and ``RESHARD`` follow its last action. With ``reshard_after_forward`` every F, B, I and W of a
  sharded stage gathers it before and frees it after (FSDP's own per-layer rhythm): layer by layer where the
  stage's layers are known (``Sizes.layers``), the first one the op runs (a forward's first, a backward's
  last) ahead of it and each next one while the one before it computes, as FSDP2 prefetches one block ahead.
- **data parallel** (``dp`` > 1): ``REDUCE_GRAD`` all-reduces (ZeRO-1: reduce-scatters) a stage's gradients
  after its last backward (B or W); with ZeRO-1 its updated weights are all-gathered (``UNSHARD`` over dp).
- **when** (``Overlap``): a reduction after the stage's last backward (``stage``), during it (``layer``) or
  after the rank's last op (``drain``); ZeRO-1's gather ahead of the first forward (``layer``/``stage``) or
  after the reductions (``end``). A ``layer`` gather of a stage of several layers (``Sizes.layers``) sends
  the first layer's share ahead of the op and the rest ``during`` it (bucket by bucket, one ahead of the
  compute: Megatron-LM's ``--overlap-param-gather``, FSDP2's per-block prefetch).
- **expert parallel** (``ep`` > 1 with MoE stages): an ``ALL_TO_ALL`` (dispatch + combine) inside each F, B
  and I of a stage with dispatch bytes (every stage when none are given), written after it (an F&B pair has
  one per half); the ep ranks took different rows, so without FSDP each stage's ``REDUCE_GRAD`` sums its dense
  gradients over ep (over dp x ep with dp: group ``dp+ep``), where dp's would be.
- **memory actions** (``OFFLOAD``, ``RELOAD``, ``RECOMPUTE``): kept where the schedule places them, on the
  stage's rank. A RECOMPUTE re-runs the forward: gathered as a forward is under ``reshard_after_forward``, with
  its all-to-all under ep; an OFFLOAD or RELOAD moves saved activations and touches no weights.
- **tied weights** (``sizes.tie`` > 0): the ranks of a lane's first and last stage all-reduce the tied
  gradients (``TIE_GRAD``) after their reductions, and so do the ranks holding DualPipe's two copies of a
  stage (one all-reduce per set of ranks, as the runtime sums them); then every rank's ``STEP_END`` (norm and
  loss).

A rank's collectives over dp, fsdp and ep are with its replicas, which run the same program; only the tie
and the step end join different pipeline ranks (``Lowered.members``).

Example:
    >>> from stagewise.schedules import generate
    >>> from stagewise.parallelism import Parallelism
    >>> low = lower(generate("1f1b", 2, 2), Parallelism(pp=2, fsdp=2))
    >>> print(low.text(1))
    1UNSHARD 1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1 1REDUCE_GRAD 1RESHARD 1STEP_END
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from ..actions import HOST_KINDS, RECOMPUTE, Pair, new
from ..parallelism import Parallelism
from ..schedule import Schedule
from ..collector import gc_paused
from ..comm_actions import (ALL_TO_ALL, HEADER_BYTES, HEADER_OF, RECV_B, RECV_F, REDUCE_GRAD, RESHARD, SEND_B, SEND_F,
                            STEP_END, TIE_GRAD, UNSHARD, CommAction)
from .options import LoweringOptions
from .rules import StagePoints, message_out, send_orders, stage_points


@dataclass(frozen=True, kw_only=True)
class Lowered:
    """A schedule with its communication: one program of compute ops and ``CommAction``s per pipeline rank."""

    schedule: Schedule
    parallelism: Parallelism
    programs: tuple[tuple, ...]
    options: LoweringOptions = field(default_factory=LoweringOptions)

    @property
    def ranks(self) -> int:
        return len(self.programs)

    def text(self, rank: int) -> str:
        return " ".join(str(a) for a in self.programs[rank])

    def __str__(self) -> str:
        return "\n".join(f"rank {r}: {self.text(r)}" for r in range(self.ranks))

    def comms(self, rank: int):
        """(position, CommAction) of ``rank``'s program."""
        return [(k, a) for k, a in enumerate(self.programs[rank]) if type(a) is CommAction]

    def members(self, rank: int, c: CommAction) -> tuple[int, ...]:
        """The pipeline ranks that enter collective ``c`` of ``rank`` together (its replicas over dp, fsdp and
        ep run the same program, so they are not listed)."""
        if c.group == "tie":
            return tuple(sorted({rank, c.peer}))
        if c.group == "world":
            return tuple(range(self.ranks))
        return (rank,)

    def global_ranks(self, rank: int, group: str) -> list[int]:
        """The global ranks of ``group`` around pipeline rank ``rank`` of the first replica (in the network's
        ``order``: by default ``parallelism.DIMS``, dp, fsdp, ep, pp, tp, outermost first)."""
        par = self.parallelism
        stride = self.options.network.strides(par)
        g = rank * stride["pp"]
        if "+" in group:  # over two dimensions (dp+ep: an expert-parallel stage's dense gradients)
            outer, inner = group.split("+")
            return sorted({o - g + i for o in self.global_ranks(rank, outer) for i in self.global_ranks(rank, inner)})
        if group in ("dp", "fsdp", "ep"):
            return [g + k * stride[group] for k in range(par.size(group))]
        if group == "world":
            return list(range(par.world))
        if group == "pp":
            return [g]
        raise KeyError(group)

    def inside(self, ranks) -> bool:
        """Whether these global ranks share one node."""
        n = self.options.network.gpus_per_node
        return len({g // n for g in ranks}) == 1

    def duration(self, rank: int, c: CommAction) -> float:
        """A collective's time under the options' network (a send's is the cost model's link: ``play``)."""
        net, par = self.options.network, self.parallelism
        if c.kind == RESHARD or c.kind in (SEND_F, SEND_B, RECV_F, RECV_B):
            return 0.0
        if c.group == "hsdp":  # reduce-scatter over fsdp, then the shard all-reduced over dp
            rs = net.collective("reduce-scatter", c.nbytes, par.fsdp, self.inside(self.global_ranks(rank, "fsdp")))
            return rs + net.collective("all-reduce", c.nbytes / par.fsdp, par.dp,
                                       self.inside(self.global_ranks(rank, "dp")))
        if c.group == "tie":
            pp = net.strides(par)["pp"]
            return net.collective(c.op, c.nbytes, 2, self.inside([rank * pp, c.peer * pp]))
        members = self.global_ranks(rank, c.group)
        return net.collective(c.op, c.nbytes, len(members), self.inside(members))


def lower(schedule: Schedule, parallelism: Parallelism | None = None,
          options: LoweringOptions | None = None) -> Lowered:
    """The lowered programs of ``schedule`` under ``parallelism`` (see the module docstring)."""
    par = parallelism or Parallelism(pp=schedule.ranks)
    opts = options or LoweringOptions()
    S = schedule.stages
    sizes = opts.sizes.resolve(S)
    with gc_paused():  # hundreds of thousands of small tuples and no cycles (as ``generate``)
        wiring = _wiring(schedule, sizes, opts.headers) if opts.p2p else None
        made = _stage_actions(par, sizes, opts.overlap)
        programs = tuple(_rank(schedule, par, opts, sizes, wiring, made, r) for r in range(schedule.ranks))
    return Lowered(schedule=schedule, parallelism=par, programs=programs, options=opts)


class _Wiring(NamedTuple):
    """``message_in``/``message_out`` and ``send_orders`` worked out once per lowering, as per-stage tables."""

    ahead: tuple  #: per stage, the rank of the next stage of its lane (-1 at the lane's last): F sends there
    behind: tuple  #: per stage, the rank of the stage before it (-1 at the lane's first): B and I send there
    nbytes: tuple  #: per stage, the bytes of its boundary activation (what its F sends on)
    #: (sender, receiver) -> (the receiver's RECV of each message, in the sender's order, each after its
    #: header where it has one; message key -> its RECV's position there): ``send_orders`` as the actions the
    #: receiver posts
    mail: dict
    headed: frozenset = frozenset()  #: (sender, message key) of each message that carries a header


def headed_keys(keys: list, rule: str) -> set:
    """The messages of one channel (keys in the sender's order) that carry a header under ``rule``
    (``LoweringOptions.headers``): none, the first of each boundary (direction, stage), or every one."""
    if rule == "every":
        return set(keys)
    if rule == "first":
        firsts: dict = {}
        for key in keys:
            firsts.setdefault(key[:2], key)
        return set(firsts.values())
    return set()


def _wiring(schedule: Schedule, sizes: dict, headers: str = "none") -> _Wiring:
    place, first, last = schedule.placement, schedule.first_stages, schedule.last_stages
    S = schedule.stages

    def rank_of(key):  # the rank a message key goes into (-1: none)
        return -1 if key is None else place[key[1]]

    ahead = tuple(rank_of(message_out(("F", s, 0), first, last)) for s in range(S))
    behind = tuple(rank_of(message_out(("B", s, 0), first, last)) for s in range(S))
    # a sequence slice sends 1/k of a micro-batch's boundary
    nbytes = tuple(x / schedule.slices for x in sizes["boundary"]) if sizes["boundary"] is not None else (0.0,) * S
    mail, headed = {}, set()
    for (src, dst), keys in send_orders(schedule).items():
        heads = headed_keys(keys, headers)
        headed.update((src, key) for key in heads)
        recvs, where = [], {}
        for key in keys:
            d, s, mb = key
            recv = new(CommAction, (RECV_F, s, mb, src, "pp", nbytes[s - 1], "p2p", "", False) if d == "F" else
                       (RECV_B, s, mb, src, "pp", nbytes[s], "p2p", "", False))
            if key in heads:
                recvs.append(_header(recv))
            where[key] = len(recvs)  # a key sent twice: its last position
            recvs.append(recv)
        mail[(src, dst)] = (recvs, where)
    return _Wiring(ahead, behind, nbytes, mail, frozenset(headed))


def _header(c: CommAction) -> CommAction:
    """The header of message ``c`` (a send or receive): on its channel right before it, a small message."""
    return c._replace(kind=HEADER_OF[c.kind], nbytes=HEADER_BYTES)


def _rank(schedule: Schedule, par: Parallelism, opts: LoweringOptions, sizes: dict, wiring: _Wiring,
          made: dict, r: int) -> tuple:
    prog = schedule.programs[r]
    ahead, behind, nbytes, mail, headed = wiring or _NO_WIRING(schedule.stages)
    fsdp = par.fsdp > 1
    raf = fsdp and par.reshard_after_forward
    moe = (par.ep > 1) and (opts.moe if opts.moe is not None else any(sizes["a2a"]))
    # the stages that exchange tokens: those with dispatch bytes, every stage when none are given
    a2a = [2 * b if (b > 0 or not any(sizes["a2a"])) else None for b in sizes["a2a"]] if moe else None
    points = stage_points(prog)
    before, after, final = _fixed(par, opts.overlap, made, points)
    feed_f, feed_b = _feeds(behind, mail, r), _feeds(ahead, mail, r)
    to_f = [q if q != r else -1 for q in ahead]  # where an F's output goes (-1: nowhere, or to r itself)
    to_b = [q if q != r else -1 for q in behind]

    out: list = []
    posted = [0] * schedule.ranks  # per sender, its messages to r posted so far
    for k, op in enumerate(prog):
        acts = (op.forward, op.backward) if type(op) is Pair else (op,)
        if k in before:
            out += before[k]
        for a in acts:
            kind, s, mb = a
            feed = feed_f[s] if kind == "F" else feed_b[s] if kind == "B" or kind == "I" else None
            if feed is None:
                continue
            src, sent, where = feed
            if where is None:
                raise KeyError((src, r))  # the sender sends r nothing at all (an invalid schedule)
            want = where.get(a if kind != "I" else ("B", s, mb), -1)  # an Action equals its fields' tuple
            if want >= posted[src]:  # else posted already (cannot happen for a valid schedule) or never sent
                out += sent[posted[src]:want + 1]
                posted[src] = want + 1
        if raf and op[0] in HOST_KINDS:  # a host transfer of saved activations uses no weights
            out.append(op)
            continue
        if raf:  # FSDP's per-layer rhythm: gathered before every op, freed after it (a RECOMPUTE is a forward)
            touched = (op[1],) if len(acts) == 1 else tuple(sorted({a[1] for a in acts}))
            way = None if len(acts) > 1 else "forward" if op[0] == "F" or op[0] == RECOMPUTE else "backward"
            out += [made["unshard"][s] if way is None else made[way][s][0] for s in touched]
        out.append(op)
        tail = len(out)
        if raf and way is not None:  # the other layers' gathers, each one layer ahead of the compute
            out += made[way][op[1]][1]
        for kind, s, mb in acts if a2a is not None else ():
            if kind != "W" and kind not in HOST_KINDS and a2a[s] is not None:  # a RECOMPUTE's forward has one
                out.append(new(CommAction, (ALL_TO_ALL, s, mb, -1, "ep", a2a[s], "ep", "all-to-all", False)))
        for kind, s, mb in acts:
            if kind == "F":
                if to_f[s] >= 0:
                    send = new(CommAction, (SEND_F, s, mb, to_f[s], "pp", nbytes[s], "p2p", "", False))
                    if headed and (r, ("F", s + 1, mb)) in headed:
                        out.append(_header(send))
                    out.append(send)
            elif (kind == "B" or kind == "I") and to_b[s] >= 0:
                send = new(CommAction, (SEND_B, s, mb, to_b[s], "pp", nbytes[s - 1], "p2p", "", False))
                if headed and (r, ("B", s - 1, mb)) in headed:
                    out.append(_header(send))
                out.append(send)
        if k in after:
            out += after[k]
        if k in after or (raf and way is not None):  # only these can hold collectives that run during the op
            out[tail:] = _in_release_order(out[tail:])
        if raf:
            out += [made["reshard"][s] for s in touched]
    out += final
    out += _ties(schedule, opts.sizes.tie, sizes["grads"], r)
    if opts.step_end and (par.world > 1):
        out.append(CommAction(STEP_END, min(schedule.stages_of_rank(r), default=0), None, -1, "world",
                              opts.sizes.step_end, "world", "all-reduce"))
    return tuple(out)


def _in_release_order(tail: list) -> list:
    """What follows an op, with the collectives that run during it (a fraction of the way through) in the order
    the op reaches them, each kept in one of their own slots: a stream runs its collectives in program order,
    and FSDP issues a layer's reduce-scatter as the backward leaves it, then the prefetch of the layer after
    next, so a gather released with a reduction comes after it."""
    slots = [i for i, a in enumerate(tail) if type(a) is CommAction and type(a.during) is float]
    if len(slots) < 2:
        return tail
    ordered = sorted((tail[i] for i in slots), key=lambda a: (a.during, a.kind != REDUCE_GRAD))
    for i, a in zip(slots, ordered):
        tail[i] = a
    return tail


def _NO_WIRING(stages: int) -> _Wiring:
    """No sends or receives (``LoweringOptions.p2p`` False): every stage's neighbours are none."""
    none = (-1,) * stages
    return _Wiring(none, none, (0.0,) * stages, {})


def _feeds(src_of, mail: dict, r: int) -> list:
    """Per stage, what an op of it on ``r`` receives from the stage next to it (``src_of``: per stage that
    stage's rank, -1 for none): (sender, the sender's RECVs to ``r``, message key -> position there), or
    None (nothing to receive, or from ``r`` itself). (sender, None, None): it sends ``r`` nothing at all."""
    return [None if q == -1 or q == r else (q, *mail.get((q, r), (None, None))) for q in src_of]


def _fixed(par: Parallelism, ov, made: dict, points: StagePoints) -> tuple[dict, dict, list]:
    """The collectives of a rank that sit at fixed places, from its ``StagePoints``: op position -> those
    before it (gathers one stage ahead), op position -> those after its sends (the reductions of the stages
    whose last backward it is, then the frees of the sharded stages it uses last), and those after its last
    op (drained reductions, ZeRO-1's gathers at the end). Stages in stage order within one op."""
    fsdp, dp = par.fsdp > 1, par.dp > 1
    raf = fsdp and par.reshard_after_forward
    zero_gather = dp and not fsdp and par.zero
    reduces = dp or fsdp or (par.ep > 1 and not fsdp)
    rule = ov.fsdp_reduce if fsdp else ov.reduce
    before: dict[int, list] = {}
    after: dict[int, list] = {}
    if (fsdp and not raf) or (zero_gather and ov.gather != "end"):
        layer = (ov.fsdp_gather if fsdp else ov.gather) == "layer"
        for s, k in points.gathers.items():
            first, rest = made["forward"][s] if layer else (made["unshard"][s], ())
            before.setdefault(k, []).append(first)
            if rest:  # the other layers' buckets, gathered while the op computes
                after.setdefault(k, []).extend(rest)
    last_bw = sorted(points.last_backward.items())
    # "each": every backward reduces what it made (gradient sync on between micro-batches), else the last one
    reducing = [(s, k) for s, ks in sorted(points.backwards.items()) for k in ks] if rule == "each" else last_bw
    for s, k in reducing if reduces and rule != "drain" else ():
        after.setdefault(k, []).extend((made["reduce"][s],) if rule == "stage" else made["reduce_during"][s])
    for s, k in sorted(points.last_use.items()) if fsdp and not raf else ():
        after.setdefault(k, []).append(made["reshard"][s])
    final = []
    if reduces and rule == "drain":  # in the order of the ops they follow
        final += [made["reduce"][s] for s, k in sorted(last_bw, key=lambda sk: (sk[1], sk[0]))]
    if zero_gather and ov.gather == "end":
        final += [made["unshard"][s] for s, k in last_bw]
    return before, after, final


def gradient_reduction(par: Parallelism) -> tuple[str, str, str]:
    """(group, stream, op) of a stage's gradient reduction under ``par``; the stream is its gathers' group too."""
    fsdp, dp = par.fsdp > 1, par.dp > 1
    ep = par.ep > 1 and not fsdp  # the ep ranks took different rows: their dense gradients are summed
    group = "hsdp" if fsdp and dp else "fsdp" if fsdp else "dp+ep" if dp and ep else "ep" if ep else "dp"
    op = "reduce-scatter+all-reduce" if fsdp and dp else "reduce-scatter" if fsdp or par.zero else "all-reduce"
    return group, "fsdp" if fsdp else "dp", op


def _stage_actions(par: Parallelism, sizes: dict, ov) -> dict[str, list[CommAction]]:
    """Per stage, its gather, free and reduction (after its op, or ``during`` it): the same value wherever a
    program issues them."""
    group, stream, reduce_op = gradient_reduction(par)
    gather_group = stream
    layers = sizes["layers"]
    return {"unshard": [CommAction(UNSHARD, s, None, -1, gather_group, b, stream, "all-gather")
                        for s, b in enumerate(sizes["params"])],
            # a layer-wise gather (a ``layer`` rule; with reshard after forward, per op): (the gather ahead of the
            # op, those during it) in the order the op runs the layers, a forward from the first, a backward from
            # the last
            "forward": [_layer_gathers(s, b, xs, gather_group, stream) for s, (b, xs) in
                        enumerate(zip(sizes["params"], layers))],
            "backward": [_layer_gathers(s, b, xs[::-1], gather_group, stream) for s, (b, xs) in
                         enumerate(zip(sizes["params"], layers))] if par.reshard_after_forward else None,
            "reshard": [CommAction(RESHARD, s, None, -1, "fsdp", 0.0, "fsdp") for s in range(len(sizes["params"]))],
            "reduce": [CommAction(REDUCE_GRAD, s, None, -1, group, b, stream, reduce_op) for s, b in
                       enumerate(sizes["grads"])],
            # bucketed: the backward runs the layers last first, and each layer's gradients are reduced once it
            # has produced them, k / n of the way through (one layer: the whole stage during the op, done no
            # earlier than it)
            "reduce_during": [(CommAction(REDUCE_GRAD, s, None, -1, group, b, stream, reduce_op, True),)
                              if len(xs) == 1 else
                              tuple(CommAction(REDUCE_GRAD, s, None, -1, group, b * x, stream, reduce_op,
                                               (k + 1) / len(xs)) for k, x in enumerate(reversed(xs)))
                              for s, (b, xs) in enumerate(zip(sizes["grads"], layers))]}


def _layer_gathers(s: int, nbytes: float, shares, group: str, stream: str) -> tuple:
    """A stage's all-gather layer by layer, in ``shares``' order: the first layer's ahead of the op, layer k's
    once k - 1 of the op's n layers have run (one ahead of the compute)."""
    first = CommAction(UNSHARD, s, None, -1, group, nbytes * shares[0], stream, "all-gather")
    return first, tuple(CommAction(UNSHARD, s, None, -1, group, nbytes * x, stream, "all-gather", (k - 1) / len(shares))
                        for k, x in enumerate(shares) if k)


def _ties(schedule: Schedule, nbytes: float, grads, r: int) -> list[CommAction]:
    """The all-reduces of the gradients of parameters held on several ranks, on ``r``: a tied weight (``nbytes``
    > 0: every lane's first and last stage hold a copy) and DualPipe's two copies of each stage (one per
    lane). One per set of ranks, as the runtime sums them (replicas.py: one flat all-reduce per rank set),
    named after ``r``'s first stage in it, in the model's layer order."""
    place, lanes = schedule.placement, schedule.lanes
    held = [[lane.stage_lo + j for lane in lanes] for j in range(schedule.stages_per_copy)]  # copies of layer j
    if nbytes > 0:
        ends = [s for lane in lanes for s in (lane.stage_lo, lane.stage_hi - 1)]
        held[0] = sorted(set(held[0]) | set(ends))  # the tie counts with the first layer
    sets: dict[tuple, list] = {}  # rank set -> [r's first stage, bytes]
    for j, stages in enumerate(held):
        ranks = tuple(sorted({place[s] for s in stages}))
        if len(ranks) < 2 or r not in ranks:
            continue
        mine = min(s for s in stages if place[s] == r)
        extra = (nbytes if j == 0 and nbytes > 0 else 0.0) + (grads[mine] if len(lanes) > 1 else 0.0)
        got = sets.setdefault(ranks, [mine, 0.0])
        got[0], got[1] = min(got[0], mine), got[1] + extra
    return [CommAction(TIE_GRAD, s, None, next(q for q in ranks if q != r), "tie", b, "tie", "all-reduce")
            for ranks, (s, b) in sets.items()]
