"""Chrome trace / Perfetto JSON of any timeline (open in ui.perfetto.dev or chrome://tracing).

One track per rank, one complete event ("X") per action with its real start
and duration (an overlapped F&B pair gives two events over the same interval,
the backward nested under the forward), categories per kind, a counter track
of live activations per rank, and a flow arrow from each send to its receive.
Sends follow the engine's dependency rules (engine.py) within each lane:
``F(s, mb) -> F(s+1, mb)`` and ``B|I(s+1, mb) -> B|I(s, mb)``, only where the
two stages sit on different ranks (a hand-over on one rank is no message).
Expert-parallel all-to-all (``Timeline.comm``) gets a track of its own per rank,
right under the rank's, one complete event per action's all-to-all with what of
it was exposed (the rank waited) in its args.
"""

from __future__ import annotations

from pathlib import Path

from .. import jsonout
from ..timeline import Timeline
from .cells import Cell, cells, comm_cells, memory_steps, summary

#: trace microseconds per time unit; cost-model units are shown as milliseconds
SCALE = {"s": 1e6, "ms": 1e3, "us": 1.0}
COST_UNIT_SCALE = 1e3
PID = 0


def scale_of(unit: str) -> float:
    """Trace microseconds per unit of the timeline."""
    return SCALE.get(unit, COST_UNIT_SCALE)


def chrome_trace(timeline: Timeline) -> dict:
    """The trace as a dict in the Trace Event Format."""
    sm = summary(timeline)
    k = scale_of(timeline.unit)
    events: list[dict] = [_meta("process_name", None, f"{sm.name} p={sm.ranks} m={sm.microbatches} "
                                f"v={sm.chunks} ({sm.source})")]
    comm = timeline.comm is not None
    for r in range(timeline.ranks):
        events.append(_meta("thread_name", r, f"rank {r}"))
        events.append({"name": "thread_sort_index", "ph": "M", "pid": PID, "tid": r,
                       "args": {"sort_index": 2 * r if comm else r}})
        if comm:
            events.append(_meta("thread_name", a2a_track(timeline, r), f"rank {r} all-to-all"))
            events.append({"name": "thread_sort_index", "ph": "M", "pid": PID, "tid": a2a_track(timeline, r),
                           "args": {"sort_index": 2 * r + 1}})
    cs = cells(timeline)
    for c in cs:
        a = c.action
        ev = {"name": str(a), "cat": a.kind, "ph": "X", "pid": PID, "tid": c.rank, "ts": _num(c.start * k),
              "dur": _num((c.end - c.start) * k), "args": {"stage": a.stage, "mb": a.mb, "chunk": c.chunk}}
        if c.part:
            ev["args"]["overlapped"] = True  # half of an F&B pair
        events.append(ev)
    for c in comm_cells(timeline):
        a = c.action
        events.append({"name": f"a2a {a}" if c.kind == "a2a" else str(a), "cat": c.kind, "ph": "X", "pid": PID,
                       "tid": a2a_track(timeline, c.rank),
                       "ts": _num(c.start * k), "dur": _num((c.end - c.start) * k),
                       "args": {"stage": a.stage, "mb": a.mb, "kind": a.kind, "exposed": _num(c.exposed * k)}})
    events += _flows(timeline, cs, k)
    events += _counters(timeline, k)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"schedule": sm.name, "ranks": sm.ranks, "microbatches": sm.microbatches,
                      "chunks": sm.chunks, "source": sm.source, "unit": sm.unit,
                      "trace_us_per_unit": k, "bubble_fraction": sm.bubble, "makespan": sm.makespan},
    }


def a2a_track(timeline: Timeline, rank: int) -> int:
    """The trace thread of ``rank``'s all-to-all lane."""
    return timeline.ranks + rank


def write_trace(timeline: Timeline, path) -> Path:
    path = Path(path)
    with path.open("w") as fh:
        jsonout.dump(chrome_trace(timeline), fh, separators=(",", ":"))
    return path


def sends(timeline: Timeline, cs: list[Cell] | None = None) -> list[tuple[Cell, Cell]]:
    """(sender, receiver) cells of every message between ranks."""
    sched = timeline.schedule
    cs = cells(timeline) if cs is None else cs
    fwd: dict[tuple[int, int], Cell] = {}
    grad: dict[tuple[int, int], Cell] = {}
    for c in cs:
        a = c.action
        if a.kind == "F":
            fwd[a.stage, a.mb] = c
        elif a.kind in ("B", "I"):
            grad[a.stage, a.mb] = c
    place = sched.placement
    out = []
    for lane in sched.lanes:
        for s in range(lane.stage_lo, lane.stage_hi - 1):
            if place[s] == place[s + 1]:
                continue
            for mb in lane.mbs:
                for table, src, dst in ((fwd, s, s + 1), (grad, s + 1, s)):
                    a, b = table.get((src, mb)), table.get((dst, mb))
                    if a is not None and b is not None:
                        out.append((a, b))
    return out


def _flows(timeline: Timeline, cs: list[Cell], k: float) -> list[dict]:
    out = []
    for i, (a, b) in enumerate(sends(timeline, cs)):
        name = "activation" if a.action.kind == "F" else "gradient"
        common = {"name": name, "cat": "send", "id": i, "pid": PID}
        out.append({**common, "ph": "s", "tid": a.rank, "ts": _num(a.start * k)})
        out.append({**common, "ph": "f", "bp": "e", "tid": b.rank, "ts": _num(b.start * k)})
    return out


def _counters(timeline: Timeline, k: float) -> list[dict]:
    out = []
    for r in range(timeline.ranks):
        steps: dict[float, float] = {}
        for t, level in memory_steps(timeline, r):
            steps[t] = level  # the level after everything at time t
        name = f"live activations rank {r}"
        out += [{"name": name, "ph": "C", "pid": PID, "ts": _num(t * k), "args": {"chunks": _num(level)}}
                for t, level in steps.items()]
    return out


def _num(x: float) -> float | int:
    """Shorter JSON: whole numbers without '.0', others to a nanosecond."""
    return int(x) if float(x).is_integer() else round(x, 3)


def _meta(name: str, tid: int | None, value: str) -> dict:
    ev = {"name": name, "ph": "M", "pid": PID, "args": {"name": value}}
    if tid is not None:
        ev["tid"] = tid
    return ev


__all__ = ["chrome_trace", "write_trace", "sends", "scale_of", "a2a_track"]
