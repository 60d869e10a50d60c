"""The play engine: runs every rank's program in order against durations.

An action starts when its rank is free and its dependencies (``F(s)`` after ``F(s-1)``, ``B|I(s)`` after
``F(s)`` and the gradient of ``s+1``, ``W(s)`` after ``I(s)``) have arrived; sends are asynchronous, so a
message adds link time to the receiver's ready time but never occupies the sender. An op's duration depends on the op
alone (compute, its all-to-all, and for an F&B pair what of that is hidden:
``overlap``), never on when it runs. Start times do not depend on the
order in which ranks are advanced, so a plain work list (no event heap) gives
the exact timeline in time linear in the number of actions.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from operator import lt

from .actions import Action, Pair
from .costs import StageCosts
from .overlap import pair_parts, pair_time
from .schedule import Schedule


@dataclass(frozen=True)
class Blocked:
    """A rank that cannot go on: the op at ``position`` waits for ``waits_for``."""

    rank: int
    position: int
    op: object
    waits_for: Action


class Stuck(Exception):
    """Some ranks never finish: a wait cycle (deadlock)."""

    def __init__(self, blocked: list[Blocked]):
        super().__init__("deadlock")
        self.blocked = blocked


def play(schedule: Schedule, costs: StageCosts) -> tuple[list[list[float]], list[list[float]]]:
    """Start and end time of every op, per rank, aligned with the programs.

    Raises ``Stuck`` when some rank can never proceed. Assumes the structural
    checks of ``validate.check_structure`` passed.
    """
    m = schedule.microbatches
    n_keys = schedule.stages * m
    first, last, fwd_link, bwd_link = routes(schedule, costs)
    f_in, g_in = _input_keys(first, last, m, n_keys)
    dur = _durations(costs, schedule.stages)
    fb = costs.fb
    comm = costs.a2a_f is not None

    done = [-1.0] * (2 * n_keys)  # [0, n): F done; [n, 2n): input gradient done (B or I)
    programs = schedule.programs
    R = len(programs)
    starts = [[0.0] * len(p) for p in programs]
    ends = [[0.0] * len(p) for p in programs]
    pos = [0] * R
    clock = [0.0] * R
    # the rank parked on each key (-1: none); a key has one waiter from another rank in a valid schedule
    # (its consumers are fixed ranks), a second one (a deadlock in the making) waits in ``extra``
    waiter = [-1] * (2 * n_keys)
    extra: dict[int, list[int]] = {}
    queue = deque(range(R))

    # the two helpers of a pair take the state as defaults, not from play's scope: a variable a nested function
    # reads becomes a cell, and every read of it in the hot loop below would go through that cell
    def ready_time(a: Action, done=done, f_in=f_in, g_in=g_in, fwd_link=fwd_link, bwd_link=bwd_link, m=m,
                   n_keys=n_keys) -> tuple[float, int]:
        """(time a's inputs are ready, -1) or (-1, key it waits on)."""
        kind, s, mb = a
        if kind == "F":
            if f_in[s] < 0:
                return 0.0, -1
            k = f_in[s] + mb
            d = done[k]
            return (d + fwd_link[s], -1) if d >= 0 else (-1.0, k)
        if kind == "W":
            k = n_keys + s * m + mb
            d = done[k]
            return (d, -1) if d >= 0 else (-1.0, k)
        k = s * m + mb
        d = done[k]
        if d < 0:
            return -1.0, k
        if g_in[s] >= 0:
            k = g_in[s] + mb
            g = done[k]
            if g < 0:
                return -1.0, k
            g += bwd_link[s]
            if g > d:
                d = g
        return d, -1

    def finish(kind: str, s: int, mb: int, t: float, done=done, waiter=waiter, queue=queue, extra=extra, m=m,
               n_keys=n_keys) -> None:
        """Record that (kind, s, mb) ended at ``t`` and wake the ranks waiting on it."""
        k = s * m + mb if kind == "F" else n_keys + s * m + mb
        done[k] = t
        w = waiter[k]
        if w >= 0:
            waiter[k] = -1
            queue.append(w)
            if extra:
                queue.extend(extra.pop(k, ()))

    while queue:
        r = queue.popleft()
        prog = programs[r]
        st, en = starts[r], ends[r]
        i, t = pos[r], clock[r]
        n = len(prog)
        while i < n:
            op = prog[i]
            if type(op) is Pair:
                fa, ba = op
                rf, kw = ready_time(fa)
                if kw >= 0:
                    break
                rb, kw = ready_time(ba)
                if kw >= 0:
                    break
                start = max(t, rf, rb)
                if fb is not None:
                    d = fb[fa.stage]
                elif comm:  # one half's all-to-all behind the other's compute
                    d = pair_time(*pair_parts(op, costs))
                else:
                    d = dur["F"][fa.stage] + dur[ba.kind][ba.stage]
                t = start + d
                st[i] = start
                en[i] = t
                i += 1
                finish(*fa, t)
                if ba.kind != "W":
                    finish(*ba, t)
                continue
            # a single op, ``ready_time`` and ``finish`` written out: this loop is the simulator's hot path
            kind, s, mb = op
            if kind == "F":
                base = f_in[s]
                if base < 0:
                    rt = 0.0
                else:
                    rt = done[base + mb]
                    if rt < 0:
                        kw = base + mb
                        break
                    rt += fwd_link[s]
                k = s * m + mb
            else:
                k = s * m + mb
                if kind == "W":
                    rt = done[n_keys + k]
                    if rt < 0:
                        kw = n_keys + k
                        break
                    k = -1
                else:
                    rt = done[k]
                    if rt < 0:
                        kw = k
                        break
                    base = g_in[s]
                    if base >= 0:
                        g = done[base + mb]
                        if g < 0:
                            kw = base + mb
                            break
                        g += bwd_link[s]
                        if g > rt:
                            rt = g
                    k += n_keys
            start = t if t > rt else rt
            t = start + dur[kind][s]
            st[i] = start
            en[i] = t
            i += 1
            if k >= 0:
                done[k] = t
                w = waiter[k]
                if w >= 0:
                    waiter[k] = -1
                    queue.append(w)
                    if extra:
                        queue.extend(extra.pop(k, ()))
        if i < n:  # blocked on key ``kw``: parked until it is done
            if waiter[kw] < 0:
                waiter[kw] = r
            else:
                extra.setdefault(kw, []).append(r)
        pos[r], clock[r] = i, t
    if any(map(lt, pos, map(len, programs))):  # some rank did not finish its program
        waiting: dict[int, list[int]] = {}
        for k, w in enumerate(waiter):
            if w >= 0:
                waiting[k] = [w, *extra.get(k, ())]
        raise Stuck(_blocked(schedule, pos, waiting, n_keys))
    return starts, ends


def routes(schedule: Schedule, costs: StageCosts):
    """First and last stage of each stage's lane, and the link time into each stage
    from its predecessor (forward) and from its successor (gradient); 0 on one rank."""
    S, placement, msg = schedule.stages, schedule.placement, costs.message
    first, last = schedule.first_stages, schedule.last_stages
    fwd_link = [msg[s - 1] if s > first[s] and placement[s - 1] != placement[s] else 0.0 for s in range(S)]
    bwd_link = [msg[s] if s < last[s] and placement[s + 1] != placement[s] else 0.0 for s in range(S)]
    return first, last, fwd_link, bwd_link


def _input_keys(first, last, m: int, n_keys: int) -> tuple[list[int], list[int]]:
    """Per stage, where the keys of its inputs start: the forwards of the stage before, the input gradients of
    the stage after (-1: none, the lane's first / last stage)."""
    f_in = [-1 if s == first[s] else (s - 1) * m for s in range(len(first))]
    g_in = [-1 if s == last[s] else n_keys + (s + 1) * m for s in range(len(last))]
    return f_in, g_in


def _durations(costs: StageCosts, stages: int) -> dict[str, list[float]]:
    """A plain action's time per kind and stage: its compute, then its all-to-all."""
    if costs.a2a_f is None:
        return {"F": costs.f, "B": costs.b, "I": costs.i, "W": costs.w}
    return {k: [costs.duration(k, s) for s in range(stages)] for k in "FBIW"}


def _blocked(schedule: Schedule, pos: list[int], waiting: dict[int, list[int]], n_keys: int) -> list[Blocked]:
    m = schedule.microbatches
    out = []
    for key, ranks in waiting.items():
        s, mb = divmod(key % n_keys, m)
        kind = "F" if key < n_keys else "B|I"
        for r in ranks:
            op = schedule.programs[r][pos[r]]
            out.append(Blocked(r, pos[r], op, Action(kind, s, mb)))
    return sorted(out, key=lambda b: b.rank)
