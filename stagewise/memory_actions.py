"""Memory actions placed into a schedule from a per-stage policy: keep, offload or recompute (PipeOffload, Mario).

``place(schedule, policy)`` returns the schedule with, for every unit (stage s, micro-batch u) of a stage whose
policy is

- ``offload``: ``OFFLOAD(s,u)`` right after the op that runs F(s,u) (its saved activations leave as soon as
  they exist), and ``RELOAD(s,u)`` ``reload_lead`` compute ops before the op that runs its backward (B or I), on
  the stage's rank: the reload is issued when the op before the backward starts and runs on the host link while
  that op computes, so the backward finds it back when the link is fast enough (one op of lead by default: the
  activation is back on the device for one op only). Never before its own OFFLOAD.
- ``recompute``: the F keeps only its input (``Costs.recompute_keep``) and ``RECOMPUTE(s,u)`` redoes it on the
  compute stream, placed by ``recompute_at``: ``backward`` right before the op that runs the backward (what
  recomputation inside the backward costs, drawn as its own cell; an idle wait right before the backward
  takes it first), ``bubble`` in the rank's idle time before the backward (Mario): on the timeline of the
  schedule with the recomputes at ``backward``, the latest idle gap of the rank at least the recompute's
  length, after F(s,u) ends and after the rank's previous backward op (so that what comes back early is held
  over a few forwards at most, not the whole warm-up); gaps are used up as recomputes fill them; none: at the
  backward.
- ``keep``: nothing.

The result is an ordinary schedule (``validate`` checks the order; ``simulate`` plays the host link and the
recomputes). ``policy_of`` makes a policy from the CLI's ``--offload`` and ``--recompute`` stage lists.

Example:
    >>> from stagewise.schedules import generate
    >>> s = place(generate("1f1b", 2, 2), ("offload", "recompute"))
    >>> " ".join(map(str, s.programs[0]))
    '0F0 0OFFLOAD0 0RELOAD0 0F1 0OFFLOAD1 0RELOAD1 0B0 0B1'
    >>> " ".join(map(str, s.programs[1]))
    '1F0 1RECOMPUTE0 1B0 1F1 1RECOMPUTE1 1B1'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from .actions import OFFLOAD, RECOMPUTE, RELOAD, Action, Pair, actions_of
from .errors import StagewiseError
from .schedule import Schedule

KEEP, OFF, REC = "keep", "offload", "recompute"
POLICIES = (KEEP, OFF, REC)
#: where a RECOMPUTE goes (``place``'s ``recompute_at``)
RECOMPUTE_AT = ("backward", "bubble")


class MemoryActionError(StagewiseError):
    """A policy that cannot be placed (wrong length, unknown word, stage out of range)."""


def policy_of(stages: int, offload: Sequence[int] | str | None = None,
              recompute: Sequence[int] | str | None = None) -> tuple[str, ...]:
    """Per stage keep/offload/recompute from the stages to offload and to recompute (each a list of stage
    numbers, ``"all"``, or None); a stage in both is refused.

    >>> policy_of(3, offload=[0], recompute="all")
    Traceback (most recent call last):
    ...
    stagewise.memory_actions.MemoryActionError: `offload` and `recompute` both name stage 0; ...
    >>> policy_of(3, offload=[0], recompute=[2])
    ('offload', 'keep', 'recompute')
    """
    sets = {}
    for name, given in (("offload", offload), ("recompute", recompute)):
        if given is None:
            sets[name] = set()
        elif given == "all":
            sets[name] = set(range(stages))
        else:
            bad = [s for s in given if not 0 <= s < stages]
            if bad:
                raise MemoryActionError(f"`{name}` names stage {bad[0]}; the schedule has stages 0..{stages - 1}")
            sets[name] = set(given)
    both = sorted(sets["offload"] & sets["recompute"])
    if both:
        raise MemoryActionError(f"`offload` and `recompute` both name stage {both[0]}; a stage's activations are "
                                "offloaded or recomputed, not both")
    return tuple(OFF if s in sets["offload"] else REC if s in sets["recompute"] else KEEP for s in range(stages))


def place(schedule: Schedule, policy: Sequence[str], *, recompute_at: str = "backward", costs=None,
          reload_lead: int = 1) -> Schedule:
    """``schedule`` with the memory actions of ``policy`` (one of ``POLICIES`` per stage) placed (module
    docstring). ``costs`` (a ``Costs``) times the timeline ``bubble`` reads (default the seed's)."""
    policy = _checked(schedule, policy)
    if recompute_at not in RECOMPUTE_AT:
        raise MemoryActionError(f"`recompute_at` {recompute_at!r}: one of {', '.join(RECOMPUTE_AT)}")
    if not (isinstance(reload_lead, int) and reload_lead >= 0):
        raise MemoryActionError(f"`reload_lead` must be a whole number >= 0; got {reload_lead}")
    if all(p == KEEP for p in policy):
        return schedule
    programs = tuple(_placed(prog, policy, reload_lead) for prog in schedule.programs)
    out = replace(schedule, programs=programs)
    if recompute_at == "bubble" and REC in policy:
        out = _into_bubbles(out, costs)
    return out


def _checked(schedule: Schedule, policy: Sequence[str]) -> tuple[str, ...]:
    policy = tuple(policy)
    if len(policy) != schedule.stages:
        raise MemoryActionError(f"`policy` has {len(policy)} entries; the schedule has {schedule.stages} stages")
    for s, p in enumerate(policy):
        if p not in POLICIES:
            raise MemoryActionError(f"`policy` of stage {s} is {p!r}; one of {', '.join(POLICIES)}")
    return policy


def _placed(prog, policy: tuple[str, ...], lead: int) -> tuple:
    """One rank's program with OFFLOAD after each offloaded F, RELOAD ``lead`` ops before its backward's op and
    RECOMPUTE right before it."""
    before: dict[int, list[Action]] = {}  # op position -> memory actions just before it
    after: dict[int, list[Action]] = {}
    offloaded_at: dict[tuple, int] = {}  # (stage, mb) -> the position of its F's op
    for k, op in enumerate(prog):
        for kind, s, mb in actions_of(op):
            p = policy[s]
            if p == KEEP:
                continue
            if kind == "F" and p == OFF:
                after.setdefault(k, []).append(Action(OFFLOAD, s, mb))
                offloaded_at[(s, mb)] = k
            elif kind in ("B", "I") and p == OFF:
                at = max(k - lead, offloaded_at[(s, mb)] + 1)  # the op the reload is issued before
                before.setdefault(at, []).append(Action(RELOAD, s, mb))
            elif kind in ("B", "I"):
                before.setdefault(k, []).append(Action(RECOMPUTE, s, mb))
    out: list = []
    for k, op in enumerate(prog):
        out += before.get(k, ())
        out.append(op)
        out += after.get(k, ())
    return tuple(out)


def _into_bubbles(schedule: Schedule, costs) -> Schedule:
    """Each RECOMPUTE moved into the latest idle gap of its rank, between its F's end and its backward's start,
    that holds it (on the timeline with every recompute at its backward); gaps are used up in turn."""
    from .costs import Costs
    from .simulate import simulate

    costs = costs or Costs()
    tl = simulate(schedule, costs)
    sc = costs.resolve(schedule.stages)
    programs = []
    for r, prog in enumerate(schedule.programs):
        st, en = tl.starts[r], tl.ends[r]
        # idle gaps between compute ops: (the op after the gap, gap start, gap end); recomputes count as compute
        busy = [k for k, op in enumerate(prog) if type(op) is Pair or op.kind not in (OFFLOAD, RELOAD)]
        gaps = [[b, en[a], st[b]] for a, b in zip(busy, busy[1:]) if st[b] > en[a]]
        f_end = {(a.stage, a.mb): en[k] for k, op in enumerate(prog) for a in actions_of(op) if a.kind == "F"}
        moved: dict[int, list[Action]] = {}  # op position -> recomputes moved before it
        drop = set()
        last_bw = -1  # the rank's latest backward op so far
        for k, op in enumerate(prog):
            if any(a.kind in ("B", "I") for a in actions_of(op)):
                last_bw = k
            if type(op) is Pair or op.kind != RECOMPUTE:
                continue
            need = sc.duration(RECOMPUTE, op.stage)
            for gap in reversed(gaps):
                at, lo, hi = gap
                if last_bw < at <= k and lo >= f_end[(op.stage, op.mb)] and hi - lo >= need:
                    moved.setdefault(at, []).append(op)
                    drop.add(k)
                    gap[1] = lo + need
                    break
        out = []
        for k, op in enumerate(prog):
            out += moved.get(k, ())
            if k not in drop:
                out.append(op)
        programs.append(tuple(out))
    return replace(schedule, programs=tuple(programs))
