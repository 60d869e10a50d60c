"""The workshop's JSON API: settings in, simulated timelines out.

It runs the very code the CLI runs (``compare.schedules_for``, ``Costs``, ``compare.simulate_all``,
``report.result``), so a setting the CLI rejects gets the CLI's message here,
tagged with the page control (``field``) that caused it.
"""

from __future__ import annotations

from contextlib import contextmanager

import functools
import importlib.util
import math
import re
from dataclasses import asdict, dataclass, fields
from typing import Mapping

from .. import causes as words
from .. import jsonout, limits
from ..actions import KINDS, Pair
from ..compare import schedules_for, simulate_all
from ..explain import explain_at, gap_causes, idle_by_cause, messages
from ..costs import CostError, Costs, MemoryCap, rank_share_weights, scaled
from ..render import palette
from ..render.cells import chunk_of_stage, comm_cells, memory_steps, origin
from ..schedule import Schedule
from ..schedules import FAMILIES, ScheduleArgError, generate
from ..simulate import simulate
from ..timeline import Timeline
from ..flags import FLAGS, say
from ..validate import ScheduleError

#: page control -> the CLI option that means the same (messages name the CLI option; the degrees Parallelism's)
OPTIONS = {"schedules": "--schedules", "p": FLAGS["pp"], "m": "--microbatches", "v": "--chunks", "tf": "--tf",
           "tb": "--tb", "ti": "--ti", "tw": "--tw", "tfb": "--tfb", "a2a": "--a2a", "latency": "--latency",
           "skew": "skew", "per": "per", "free_at_i": "--free-at-i", "cap": "--cap", "fsdp": FLAGS["fsdp"],
           "bandwidth": "--intra-bandwidth", "slices": FLAGS["slices"]}
#: the durations that take one number or one per stage (``1,1,1,2``), as the CLI's options do
PER_STAGE = ("tf", "tb", "ti", "tw", "tfb", "a2a")
_FIELD_OF_OPTION = {opt: name for name, opt in OPTIONS.items()}
#: a page is for exploring: keep one request about a second at worst
LIMITS = {"p": 64, "m": 256, "v": 8, "fsdp": 8, "slices": 8}
#: most values in a per-stage list: every stage of the largest view (DualPipe keeps two copies)
MOST_STAGES = 2 * LIMITS["p"] * LIMITS["v"]
#: one duration, or one per stage
Times = float | tuple[float, ...]


class SettingError(ValueError):
    """A setting the page sent that cannot be simulated; ``field`` names the control."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything on the page's controls; None = the family's or the cost model's default."""

    schedules: tuple[str, ...] = ("1f1b",)  #: one family, or several to compare
    p: int = 4  #: ranks
    m: int = 8  #: micro-batches
    v: int | None = None  #: chunks per rank (None: each family's default)
    tf: Times = 1.0  #: forward; a tuple gives one per stage (the CLI's ``--tf 1,1,1,2``)
    tb: Times = 2.0  #: full backward
    ti: Times | None = None  #: input-gradient backward (default t_b / 2)
    tw: Times | None = None  #: weight-gradient backward (default t_b / 2)
    tfb: Times | None = None  #: an F&B pair, by hand
    a2a: Times | None = None  #: expert-parallel all-to-all of a forward (and a backward), its own resource
    latency: float = 0.0  #: time of one message between ranks
    skew: float = 1.0  #: cost factor of the first and last stage (embedding, head): uneven layers
    #: "rank": t_f etc. are one rank's share of the model, so a stage of a v-chunk schedule costs 1/v of it
    #: (schedules compare on the same model); "stage": per stage, as the CLI reads them
    per: str = "rank"
    free_at_i: float = 0.0  #: share of an activation freed at I (the rest at W)
    cap: float | None = None  #: most activation per rank (chunk-units; rank shares with per="rank")
    #: sharded data parallel: each stage's weights all-gathered before its first forward and its gradients
    #: reduce-scattered after its last backward, over ``fsdp`` ranks (communication as actions: lowering)
    fsdp: int = 1
    #: of those collectives: one rank's share of the weights per t_f (None: free); lower it to see a bubble
    bandwidth: float | None = None
    #: sequence slices per micro-batch, for the families that take them (Seq1F1B)
    slices: int = 1

    def to_query(self) -> dict[str, str]:
        """The non-default settings as strings (the page's URL state)."""
        default = Settings()
        out = {}
        for f in fields(self):
            val = getattr(self, f.name)
            if val == getattr(default, f.name):
                continue
            out[f.name] = ",".join(val) if f.name == "schedules" else _text(val)
        return out


def _text(val) -> str:
    if isinstance(val, tuple):
        return ",".join(map(_text, val))
    return f"{val:g}" if isinstance(val, float) else str(val)


def available() -> list[str]:
    """Families whose generator module exists (others are registered but not built yet)."""
    return [name for name, fam in FAMILIES.items()
            if importlib.util.find_spec(f"stagewise.schedules.{fam.target.split(':')[0]}") is not None]


def families() -> dict:
    """What the page needs to build its controls."""
    out = []
    for name in available():
        fam = FAMILIES[name]
        out.append({"name": name, "summary": fam.summary, "chunks": list(fam.chunks) if fam.chunks else None,
                    "default_chunks": fam.default_chunks, "split_backward": fam.split_backward})
    return {"families": out, "defaults": asdict(Settings()), "limits": LIMITS, "options": OPTIONS,
            "style": style()}


def parse_settings(data: Mapping) -> Settings:
    """Settings from a JSON object or a query string's dict; values may be strings."""
    if not isinstance(data, Mapping):
        raise SettingError("the request body must be a JSON object of settings", "schedules")
    unknown = sorted(set(data) - set(OPTIONS))
    if unknown:
        raise SettingError(f"unknown setting {unknown[0]!r}; known: {', '.join(OPTIONS)}", "schedules")
    kw: dict = {}
    for name, raw in data.items():
        if raw is None or raw == "":
            continue  # blank control: default
        if name == "schedules":
            kw[name] = _names(raw)
        elif name == "per":
            if raw not in ("rank", "stage"):
                raise SettingError(f"per must be 'rank' or 'stage'; got {raw!r}", "per")
            kw[name] = raw
        elif name in ("p", "m", "v", "fsdp", "slices"):
            kw[name] = _whole(name, raw)
        elif name in PER_STAGE:
            kw[name] = _times(name, raw)
        else:
            kw[name] = _number(name, raw)
    return Settings(**kw)


def _names(raw) -> tuple[str, ...]:
    items = raw.split(",") if isinstance(raw, str) else raw
    if not isinstance(items, (list, tuple)) or not all(isinstance(x, str) for x in items):
        raise SettingError(f"--schedules must be a list of names; got {raw!r}", "schedules")
    names = tuple(dict.fromkeys(x.strip() for x in items if x.strip()))
    return names


#: longest number the page sends (a control's text); longer is refused before it is converted
MAX_NUMBER_TEXT = 32


def _whole(name: str, raw) -> int:
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise SettingError(f"{OPTIONS[name]}: expected a whole number; got {raw!r}", name)
    if isinstance(raw, int):
        value = raw
    elif re.fullmatch(r"\s*-?[0-9]{1,9}\s*", raw):
        value = int(raw)
    elif re.fullmatch(r"\s*-?[0-9]+\s*", raw):
        raise SettingError(f"{OPTIONS[name]}: expected a whole number of at most 9 digits; got {_short(raw)}", name)
    else:
        raise SettingError(f"{OPTIONS[name]}: expected a whole number; got {_short(raw)}", name)
    if value > LIMITS[name]:
        raise SettingError(f"{OPTIONS[name]} must be <= {LIMITS[name]} in the workshop; got {_short(value)}", name)
    return value


def _short(raw) -> str:
    text = repr(raw)
    return text if len(text) <= MAX_NUMBER_TEXT else f"{text[:MAX_NUMBER_TEXT]}... ({len(text)} characters)"


def _number(name: str, raw) -> float:
    if isinstance(raw, str) and len(raw) > MAX_NUMBER_TEXT:
        raise SettingError(f"{OPTIONS[name]}: a number of at most {MAX_NUMBER_TEXT} characters; got {_short(raw)}",
                           name)
    try:
        value = float(raw) if not isinstance(raw, bool) else math.nan
    except (TypeError, ValueError, OverflowError):
        value = math.nan
    if not math.isfinite(value):
        raise SettingError(f"{OPTIONS[name]}: expected a finite number; got {_short(raw)}", name)
    return value


def _times(name: str, raw) -> Times:
    """One number, or one per stage: a JSON list, or text with commas (``1,1,1,2``) as the CLI reads it."""
    items = raw.split(",") if isinstance(raw, str) and "," in raw else raw
    if not isinstance(items, (list, tuple)):
        return _number(name, raw)
    if not 1 <= len(items) <= MOST_STAGES:
        raise SettingError(f"{OPTIONS[name]}: one number or one per stage (at most {MOST_STAGES}); got "
                           f"{len(items)} values", name)
    values = tuple(_number(name, x) for x in items)
    return values[0] if len(values) == 1 else values


def field_of(message: str, default: str = "schedules") -> str:
    """The control a CLI message is about: the first ``--option`` it names."""
    for opt in re.findall(r"--[a-z-]+", message):
        if opt in _FIELD_OF_OPTION:
            return _FIELD_OF_OPTION[opt]
    return default


def stage_weights(schedule: Schedule, skew: float, per: str) -> list[float]:
    """Cost factor per stage: the rank-share weights (``per="rank"``), with ``skew``
    weighing the first and last stage of each lane (embedding, output layer)."""
    weights = rank_share_weights(schedule) if per == "rank" else [1.0] * schedule.stages
    for lane in schedule.lanes:
        for s in (lane.stage_lo, lane.stage_hi - 1):
            weights[s] *= skew if s in lane.stages else 1.0
    return weights


def costs_for(s: Settings, schedule: Schedule) -> Costs:
    """The cost model of the settings; uneven weights make each duration a per-stage list."""
    if s.skew <= 0:
        raise SettingError(f"skew (cost factor of the first and last stage) must be > 0; got {s.skew:g}", "skew")
    cap = MemoryCap(values=(s.cap,)) if s.cap is not None else None
    base = Costs(t_f=s.tf, t_b=s.tb, t_i=s.ti, t_w=s.tw, t_fb=s.tfb, a2a=0.0 if s.a2a is None else s.a2a,
                 latency=s.latency, free_at_i=s.free_at_i, cap=cap)
    timed = scaled(base, stage_weights(schedule, s.skew, s.per), activation=False)
    # a chunk holding 1/v of a rank's layers also keeps 1/v of its activations (the skew is compute only)
    costs = scaled(timed, stage_weights(schedule, 1.0, s.per), durations=False)
    if s.bandwidth is not None and not s.bandwidth > 0:
        raise SettingError(f"--intra-bandwidth must be > 0; got {s.bandwidth:g}", "bandwidth")
    if s.fsdp > 1:
        from dataclasses import replace

        from ..lowering import Communication, LoweringOptions, Network, Sizes
        from ..parallelism import Parallelism

        # a stage's weights: its share of a rank's (1/v of them per chunk with per="rank")
        net = Network(intra_bandwidth=s.bandwidth, inter_bandwidth=s.bandwidth)
        opts = LoweringOptions(sizes=Sizes(params=stage_weights(schedule, 1.0, s.per)), network=net, step_end=False)
        costs = replace(costs, comm=Communication(parallelism=Parallelism(fsdp=s.fsdp), options=opts))
    return costs


def schedules_of(s: Settings) -> tuple[Schedule, ...]:
    """The schedules to show; with several, v goes only to the families that take it (as `compare`)."""
    check_names(s)
    check_size(s)
    return generated(s.schedules, s.p, s.m, s.v, s.slices)


def check_names(s: Settings) -> None:
    """Refuse a view with no schedule, or one this version does not build (``SettingError`` on schedules)."""
    if not s.schedules:
        raise SettingError("choose at least one schedule", "schedules")
    have = available()
    for name in s.schedules:
        if name not in have:
            raise SettingError(f"unknown schedule {name!r}; choose one of: {', '.join(have)}", "schedules")


def most_actions(names: tuple[str, ...], p: int, m: int, v: int | None, slices: int = 1) -> int:
    """The most actions ``names`` can make at p, m (v and slices where a family takes them), from these numbers
    alone: each (stage, unit) of a lane runs F and B, or F, I and W.

    >>> most_actions(("1f1b", "zb-v"), 4, 8, None)  # 2 x 4 x 8 + 3 x 8 x 8
    256
    """
    total = 0
    for name in names:
        fam = FAMILIES[name]
        chunks = v if v and (fam.chunks is None or v in fam.chunks) else fam.default_chunks
        units = m * (slices if fam.slices else 1)
        total += p * chunks * units * (3 if fam.split_backward else 2) // fam.param_copies
    return total


def check_size(s: Settings) -> None:
    """Refuse a view over the page's limit before any schedule is made (``SettingError`` on m)."""
    total, most = most_actions(s.schedules, s.p, max(1, s.m), s.v, max(1, s.slices)), limits.WORKSHOP_ACTIONS.value
    if total > most:
        raise SettingError(f"these settings make up to {total} actions; the page draws at most {most}: lower "
                           "--microbatches or compare fewer schedules (`stagewise draw` takes any size; "
                           f"{limits.WORKSHOP_ACTIONS.env} raises the page's limit)", "m")


@functools.lru_cache(maxsize=4)
def generated(names: tuple[str, ...], p: int, m: int, v: int | None, slices: int = 1) -> tuple[Schedule, ...]:
    """The schedules of ``names``, kept for the next request: moving a cost, the cap or what I frees
    re-simulates without regenerating (v-half's generator takes 0.2 s at p=16, m=64; schedules are immutable).

    >>> generated(("1f1b",), 2, 2, None)[0].name
    '1f1b'
    """
    if len(names) == 1:  # one family: a v (or slices) it does not take is an error, not a default
        return (generate(names[0], p, m, v, slices),)
    return tuple(schedules_for(names, p, m, v, limit=None, slices=slices))  # bounded by the caller, as a setting


def simulate_settings(s: Settings) -> list[tuple[Timeline, dict]]:
    """(timeline, result) per schedule; raises SettingError naming the control at fault."""
    with setting_errors():
        return [tuple(e) for e in simulate_all(schedules_of(s), lambda sched: costs_for(s, sched))]


@contextmanager
def setting_errors():
    """The library's errors as the page's: each names the control at fault, the library's `ranks` said as the
    option the page's controls mirror (--ranks)."""
    try:
        yield
    except (ScheduleArgError, CostError, limits.LimitError) as e:
        said = say(str(e))
        raise SettingError(said, field_of(said, "m")) from None
    except ScheduleError as e:
        raise SettingError(say(str(e)), "schedules") from None


def payload(s: Settings, *, with_messages: bool = False) -> dict:
    """The /api/simulate answer: settings, and per schedule its result, ops, memory curve and idle gaps
    (``with_messages``: also every activation and gradient crossing ranks, which the page's Play draws)."""
    return {"settings": asdict(s), "query": s.to_query(),
            "results": [{**res, **drawing(tl), **waits(tl, with_messages)} for tl, res in simulate_settings(s)]}


def waits(tl: Timeline, with_messages: bool = False) -> dict:
    """Why ranks wait (``stagewise.explain``), in brief: ``gaps`` as ``[rank, start, end, position of the
    op that waits (-1: the step's end), cause]``, the idle time per cause, and optionally ``messages`` as
    ``[from rank, position, to rank, position, arrival, 0 activation | 1 gradient]``."""
    causes = gap_causes(tl)
    out = {"gaps": [[g.rank, _t(g.start), _t(g.end), g.pos, g.cause] for g in causes],
           "idle_by_cause": idle_by_cause(causes)}
    if with_messages:
        t0 = origin(tl)
        out["messages"] = [[a.rank, a.pos, b.rank, b.pos, _t(t - t0), int(what == "gradient")]
                           for a, b, what, t in messages(tl)]
    return out


def messages_of(s: Settings) -> dict:
    """The /api/messages answer: per schedule of the view, its messages as ``waits`` gives them (for Play,
    without sending the ops again)."""
    return {"results": [{"schedule": name, "messages": waits(simulated(s, name), True)["messages"]}
                        for name in s.schedules]}


def why(s: Settings, schedule: str, rank, pos) -> dict:
    """The explanation (``explain.gap_dict``) of one gap of ``schedule`` in the view ``s``: the one before
    op ``pos`` of ``rank``, or at the rank's end for ``pos`` -1."""
    if schedule not in s.schedules:
        raise SettingError(f"schedule {schedule!r} is not in this view ({', '.join(s.schedules)})", "schedules")
    return gap_of(simulated(s, schedule), rank, pos)


def simulated(s: Settings, name: str) -> Timeline:
    """The timeline of one schedule of the view (the view's schedules are kept: only this one is simulated)."""
    with setting_errors():
        sched = schedules_of(s)[s.schedules.index(name)]
        return simulate(sched, costs_for(s, sched))


def gap_of(tl: Timeline, rank, pos) -> dict:
    """The gap before op ``pos`` of ``rank`` (-1: at its end) as JSON; SettingError if there is none."""
    r = _index("rank", rank, 0, tl.ranks - 1)
    k = _index("pos", pos, -1, len(tl.schedule.programs[r]) - 1)
    gap = explain_at(tl, r, None if k == -1 else k)
    if gap is None:
        where = "at its end" if k == -1 else f"before position {k} ({tl.schedule.programs[r][k]})"
        raise SettingError(f"rank {r} has no idle gap {where}", "schedules")
    return words.gap_json(gap, tl)


def _index(name: str, raw, lo: int, hi: int) -> int:
    value = raw if isinstance(raw, int) and not isinstance(raw, bool) else None
    if isinstance(raw, str) and re.fullmatch(r"\s*-?[0-9]{1,9}\s*", raw):
        value = int(raw)
    if value is None or not lo <= value <= hi:
        raise SettingError(f"{name} must be a whole number in {lo}..{hi}; got {_short(raw)}", "schedules")
    return value


def drawing(tl: Timeline) -> dict:
    """What the page draws, in the renderers' colours (``render.palette``).

    ``ops``: per rank, ``[text, kind, chunk, mb, start, end]`` per op, and for
    an F&B pair also the backward's ``kind, chunk`` (drawn in the lower half).
    ``memory``: per rank, live activations as ``[time, level]`` steps.
    """
    sched = tl.schedule
    chunk = chunk_of_stage(sched)
    t0 = origin(tl)
    ops = []
    for r in range(sched.ranks):
        row = []
        for op, start, end in tl.rows(r):
            a = op.forward if type(op) is Pair else op
            cell = [str(op), op.kind, chunk[a.stage], a.mb, _t(start - t0), _t(end - t0)]
            if type(op) is Pair:
                cell += [op.backward.kind, chunk[op.backward.stage]]
            row.append(cell)
        ops.append(row)
    memory = [[[_t(t), _t(x)] for t, x in memory_steps(tl, r)] for r in range(sched.ranks)]
    v = max(sched.chunks, max(chunk, default=0) + 1)
    colours = {k: [palette.colour(k, c, v) for c in range(v)] for k in KINDS}
    ink = {fill: palette.text_colour(fill) for fills in colours.values() for fill in fills}
    return {"ops": ops, "memory": memory, "colours": colours, "ink": ink, "unit": tl.unit, "lanes": lanes(tl)}


def lanes(tl: Timeline) -> list[dict]:
    """The thin lanes drawn under each rank's row, beside its compute: today the expert-parallel all-to-all
    (``Timeline.comm``), one ``[start, end, waited, text]`` per transfer and rank (``waited``: the part of it
    the rank spent idle). A lane is a ``key``, its ``label`` and ``rows`` (per rank); the page draws any number."""
    if tl.comm is None:
        return []
    from ..comm_actions import describe

    rows: list[list] = [[] for _ in range(tl.ranks)]
    comm: list[list] = [[] for _ in range(tl.ranks)]
    for c in comm_cells(tl):
        if c.kind == "a2a":
            rows[c.rank].append([_t(c.start), _t(c.end), _t(c.exposed), f"all-to-all of {c.action}"])
        else:  # a lowered transfer: the rank's gathers, reductions, sends and receives
            comm[c.rank].append([_t(c.start), _t(c.end), _t(c.exposed), describe(c.action, c.rank)])
    return ([{"key": "a2a", "label": "all-to-all", "rows": rows}] if any(rows) else []) + \
        ([{"key": "comm", "label": "communication", "rows": comm}] if any(comm) else [])


def style() -> dict:
    """Every colour and label the page draws with (``render.palette``), so it looks like the SVG and notebook
    views; each cause of idle time with its colour, hatch pattern, label and meaning (``causes``)."""
    causes = {name: {"colour": c, "pattern": pattern, "label": words.label(name), "meaning": words.meaning(name)}
              for name, (c, pattern) in palette.CAUSES.items()}
    return {"memory": palette.MEMORY, "grid": palette.GRID, "ink": palette.INK, "kinds": palette.KIND_COLOURS,
            "labels": palette.KIND_LABELS, "causes": causes, "page": palette.PAGE,
            "lanes": {"a2a": [palette.A2A_HIDDEN, palette.A2A], "comm": [palette.COMM_HIDDEN, palette.COMM]}}


def _t(x: float) -> float:
    return round(x, 6)


def dumps(obj) -> bytes:
    return jsonout.dumps(obj, separators=(",", ":")).encode()


__all__ = ["Settings", "SettingError", "families", "parse_settings", "payload", "simulate_settings",
           "costs_for", "field_of"]
