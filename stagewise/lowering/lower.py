"""``lower(schedule, parallelism, options)``: every rank's compute program with the communication it performs.

The rules, each in one place here (the runtime's ``RankPlan`` follows the same ones, runtime/execution/plan.py):

- **sends and receives**: an F sends its output on when the next stage of its lane is on another rank
  (``SEND_F``), a B or I sends its input gradient back (``SEND_B``); each send follows its op. A receive
  (``RECV_F``/``RECV_B``) comes before the op that needs it, together with every earlier message of the same
  sender not yet received: receives from one sender are posted in that sender's order (NCCL's FIFO per
  pair; what the runtime's message plan does).
- **FSDP** (``fsdp`` > 1): a stage's ``UNSHARD`` (all-gather) is issued one stage ahead: at the first forward
  of the stage whose first forward comes before its own (the program's first stage: at its first op),
  ahead of that op's receives; its ``REDUCE_GRAD`` (reduce-scatter, with ``dp`` > 1 then an all-reduce over
  dp: HSDP) and ``RESHARD`` follow its last action. With ``reshard_after_forward`` every F, B, I and W of a
  sharded stage gathers it before and frees it after (FSDP's own per-layer rhythm).
- **data parallel** (``dp`` > 1): ``REDUCE_GRAD`` all-reduces (ZeRO-1: reduce-scatters) a stage's gradients
  after its last backward (B or W); with ZeRO-1 its updated weights are all-gathered (``UNSHARD`` over dp).
- **when** (``Overlap``): a reduction after the stage's last backward (``stage``), during it (``layer``) or
  after the rank's last op (``drain``); ZeRO-1's gather ahead of the first forward (``layer``/``stage``) or
  after the reductions (``end``).
- **expert parallel** (``ep`` > 1 with MoE stages): an ``ALL_TO_ALL`` (dispatch + combine) inside each F, B
  and I of a stage with dispatch bytes (every stage when none are given), written after it (an F&B pair has
  one per half); the ep ranks took different rows, so without FSDP each stage's ``REDUCE_GRAD`` sums its dense
  gradients over ep (over dp x ep with dp: group ``dp+ep``), where dp's would be.
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

from ..actions import Action, actions_of
from ..parallelism import Parallelism
from ..schedule import Schedule
from .comms import (ALL_TO_ALL, RECV_B, RECV_F, REDUCE_GRAD, RESHARD, SEND_B, SEND_F, STEP_END, TIE_GRAD, UNSHARD,
                    CommAction)
from .options import LoweringOptions


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
        """The global ranks of ``group`` around pipeline rank ``rank`` of the first replica (mesh order
        ``parallelism.DIMS``: dp, fsdp, ep, pp, tp, outermost first)."""
        par = self.parallelism
        g = rank * par.tp
        stride = {"ep": par.pp * par.tp, "fsdp": par.ep * par.pp * par.tp,
                  "dp": par.fsdp * par.ep * par.pp * par.tp}
        if "+" in group:  # over two dimensions (dp+ep: an expert-parallel stage's dense gradients)
            outer, inner = group.split("+")
            return sorted({o - g + i for o in self.global_ranks(rank, outer) for i in self.global_ranks(rank, inner)})
        if group in stride:
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
            tp = par.tp
            return net.collective(c.op, c.nbytes, 2, self.inside([rank * tp, c.peer * tp]))
        members = self.global_ranks(rank, c.group)
        return net.collective(c.op, c.nbytes, len(members), self.inside(members))


def lower(schedule: Schedule, parallelism: Parallelism | None = None,
          options: LoweringOptions | None = None) -> Lowered:
    """The lowered programs of ``schedule`` under ``parallelism`` (see the module docstring)."""
    par = parallelism or Parallelism(pp=schedule.ranks)
    opts = options or LoweringOptions()
    S = schedule.stages
    sizes = opts.sizes.resolve(S)
    orders = send_orders(schedule)
    programs = tuple(_rank(schedule, par, opts, sizes, orders, r) for r in range(schedule.ranks))
    return Lowered(schedule=schedule, parallelism=par, programs=programs, options=opts)


def send_orders(schedule: Schedule) -> dict[tuple[int, int], list[tuple]]:
    """(sender rank, receiver rank) -> the keys (``message_out``) of what it sends there, in the sender's
    program order: the order the receiver posts them in (NCCL's FIFO per pair)."""
    place, first, last = schedule.placement, schedule.first_stages, schedule.last_stages
    orders: dict[tuple[int, int], list[tuple]] = {}
    for r, prog in enumerate(schedule.programs):
        for op in prog:
            for a in actions_of(op):
                out = message_out(a, first, last)
                if out is not None and place[out[1]] != r:
                    orders.setdefault((r, place[out[1]]), []).append(out)
    return orders


def message_out(a: Action, first, last) -> tuple | None:
    """What ``a`` hands to another stage, as ("F", the stage it goes into, mb) (an F's output, past its lane's
    last stage) or ("B", ...) (a B's or I's input gradient, before its lane's first stage); None.
    ``first``/``last``: per stage, the first and last stage of its lane (``Schedule.first_stages``)."""
    kind, s, mb = a
    if kind == "F" and s != last[s]:
        return ("F", s + 1, mb)
    if kind in ("B", "I") and s != first[s]:
        return ("B", s - 1, mb)
    return None


def message_in(a: Action, first, last) -> tuple | None:
    """What ``a`` needs from another stage, as (its key, as ``message_out`` names it; the stage that sends it):
    an F an activation (past its lane's first stage), a B or I a gradient (before its lane's last stage,
    which starts the backward from its own loss); None."""
    kind, s, mb = a
    if kind == "F" and s != first[s]:
        return ("F", s, mb), s - 1
    if kind in ("B", "I") and s != last[s]:
        return ("B", s, mb), s + 1
    return None


def _rank(schedule: Schedule, par: Parallelism, opts: LoweringOptions, sizes: dict, orders, r: int) -> tuple:
    prog = schedule.programs[r]
    place, first, last = schedule.placement, schedule.first_stages, schedule.last_stages
    bound = sizes["boundary"]
    nb = (lambda s: bound[s]) if bound is not None else (lambda s: 0.0)
    ov = opts.overlap
    fsdp, dp = par.fsdp > 1, par.dp > 1
    raf = fsdp and par.reshard_after_forward
    zero_gather = dp and not fsdp and par.zero
    moe = (par.ep > 1) and (opts.moe if opts.moe is not None else any(sizes["a2a"]))
    # the stages that exchange tokens: those with dispatch bytes, every stage when none are given
    a2a_stage = (lambda s: sizes["a2a"][s] > 0) if any(sizes["a2a"]) else (lambda s: True)
    ep = par.ep > 1 and not fsdp  # the ep ranks took different rows: their dense gradients are summed
    group = "hsdp" if fsdp and dp else "fsdp" if fsdp else "dp+ep" if dp and ep else "ep" if ep else "dp"
    stream = "fsdp" if fsdp else "dp"
    reduce_op = ("reduce-scatter+all-reduce" if fsdp and dp else "reduce-scatter" if fsdp or par.zero
                 else "all-reduce")
    reduce_rule = ov.fsdp_reduce if fsdp else ov.reduce
    gather_group = "fsdp" if fsdp else "dp"

    points = stage_points(prog)
    first_fw, last_bw, last_use = points.first_forward, points.last_backward, points.last_use
    gathers: dict[int, list[int]] = {}
    if (fsdp and not raf) or (zero_gather and ov.gather != "end"):
        for s, k in points.gathers.items():
            gathers.setdefault(k, []).append(s)

    def unshard(s):
        return CommAction(UNSHARD, s, None, -1, gather_group, sizes["params"][s], stream, "all-gather")

    def reduce(s, during=False):
        return CommAction(REDUCE_GRAD, s, None, -1, group, sizes["grads"][s], stream, reduce_op, during)

    reduces = dp or fsdp or ep
    out: list = []
    received = {key: 0 for key in orders if key[1] == r}  # (src, r) -> messages posted so far
    index = {key: {m: j for j, m in enumerate(sent)} for key, sent in orders.items() if key[1] == r}
    drained: list[int] = []
    for k, op in enumerate(prog):
        acts = actions_of(op)
        touched = (acts[0].stage,) if len(acts) == 1 else tuple(sorted({a.stage for a in acts}))
        for s in gathers.get(k, ()):
            out.append(unshard(s))
        for a in acts:
            got = message_in(a, first, last)
            if got is None or place[got[1]] == r:
                continue
            key, src_stage = got
            src = place[src_stage]
            sent = orders[(src, r)]
            want = index[(src, r)].get(key, -1)
            if want < received[(src, r)]:
                continue  # posted already (cannot happen for a valid schedule) or never sent
            for j in range(received[(src, r)], want + 1):
                d, s2, mb2 = sent[j]
                out.append(CommAction(RECV_F if d == "F" else RECV_B, s2, mb2, src, "pp",
                                      nb(s2 - 1 if d == "F" else s2), "p2p"))
            received[(src, r)] = want + 1
        if raf:
            for s in touched:
                out.append(unshard(s))
        out.append(op)
        for a in acts:
            if moe and a.kind != "W" and a2a_stage(a.stage):
                out.append(CommAction(ALL_TO_ALL, a.stage, a.mb, -1, "ep", 2 * sizes["a2a"][a.stage], "ep",
                                      "all-to-all"))
        for a in acts:
            o = message_out(a, first, last)
            if o is not None and place[o[1]] != r:
                out.append(CommAction(SEND_F if o[0] == "F" else SEND_B, a.stage, a.mb, place[o[1]], "pp",
                                      nb(a.stage if o[0] == "F" else a.stage - 1), "p2p"))
        done = [s for s in touched if last_bw.get(s) == k]
        for s in done if reduces else ():
            if reduce_rule == "drain":
                drained.append(s)
            else:
                out.append(reduce(s, during=reduce_rule == "layer"))
        for s in touched if fsdp else ():
            if raf and last_use[s] != k:
                out.append(CommAction(RESHARD, s, None, -1, "fsdp", 0.0, "fsdp"))
            elif fsdp and last_use[s] == k:
                out.append(CommAction(RESHARD, s, None, -1, "fsdp", 0.0, "fsdp"))
    for s in drained:
        out.append(reduce(s))
    if zero_gather and ov.gather == "end":
        for s in sorted(last_bw):
            out.append(unshard(s))
    out += _ties(schedule, opts.sizes.tie, sizes["grads"], r)
    if opts.step_end and (par.world > 1):
        out.append(CommAction(STEP_END, min(schedule.stages_of_rank(r), default=0), None, -1, "world",
                              opts.sizes.step_end, "world", "all-reduce"))
    return tuple(out)


class StagePoints(NamedTuple):
    """Where a rank's work on each of its stages begins and ends in its program (op positions): the rules the
    lowering places gathers, reductions and frees by, and the runtime's ``RankPlan`` reads."""

    first_forward: dict  #: stage -> its first F
    last_backward: dict  #: stage -> its last B or W (its weight gradients are complete after it)
    last_use: dict  #: stage -> its last op of any kind (a sharded stage is freed after it)
    gathers: dict  #: stage -> the op its gather is issued before: one stage ahead (see ``lower``)


def stage_points(program) -> StagePoints:
    """The ``StagePoints`` of one rank's program."""
    first_fw: dict[int, int] = {}
    last_bw: dict[int, int] = {}
    last_use: dict[int, int] = {}
    for k, op in enumerate(program):
        for a in actions_of(op):
            last_use[a.stage] = k
            if a.kind == "F":
                first_fw.setdefault(a.stage, k)
            if a.kind in ("B", "W"):
                last_bw[a.stage] = k
    # one stage ahead: at the first forward of the stage whose first forward comes before its own (the
    # program's first stage: at its first op)
    order = sorted(first_fw, key=first_fw.get)
    gathers = {s: (first_fw[order[j - 1]] if j else 0) for j, s in enumerate(order)}
    return StagePoints(first_forward=first_fw, last_backward=last_bw, last_use=last_use, gathers=gathers)


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
