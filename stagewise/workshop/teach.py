"""Teach: a lesson per idea, each with the page's own numbers and a question the page checks.

The lessons go from the bubble to the schedules that shrink it: the bubble itself (and why more
micro-batches shrink it), why 1F1B keeps GPipe's bubble but not its memory, interleaving (v), zero
bubble (W fills the gap), the V shape (memory against bubble), DualPipe (both ends, F&B pairs hiding
the all-to-all), uneven stages (the slowest sets the pace) and sequence slices (Seq1F1B: a micro-batch cut
along the sequence holds less and fills faster). Each ``Lesson`` is data: where it starts
(the page's settings), the question it ends with, and ``goal``, which reads the view the student made
and says whether it answers the question and where it stands (``payload``'s ``lessons``); the page
writes the lesson's text around them (static/lessons.js).

``payload`` also simulates every taught family at the page's p, m and costs (``rows``), and writes each
closed form with the page's numbers plugged in (``formula``; its value is ``formulas.bubble_fraction``'s,
which tests/test_workshop_teach.py checks).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from ..explain import gap_causes, idle_by_cause
from ..formulas import uniform
from ..schedules import FAMILIES
from .api import Settings, SettingError, available, check_names, costs_for, simulate_settings

#: the families the lessons talk about, simulated at the page's settings
TAUGHT = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v", "v-half", "v-min", "dualpipe", "dualpipe-v",
          "seq1f1b")
#: the V-shape schedules of the controllable-memory lesson
V_SHAPES = ("zb-v", "v-half", "v-min")


@dataclass(frozen=True, kw_only=True)
class Lesson:
    """One idea: its title, the settings it starts from, its question and the check of an answer."""

    key: str
    title: str
    start: dict  #: the page's settings the lesson starts from (as in its address)
    question: str
    #: (the view's settings, its results by schedule) -> (answered, where the view stands, in a few words)
    goal: Callable[[Settings, dict], tuple[bool, str]]


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _bubble_goal(name: str, below: float, *, p: int, m: int | None = None, most_m: int | None = None):
    """Answered when ``name`` is shown at p (and m, or m at most ``most_m``) with its bubble under ``below``."""
    def goal(s: Settings, shown: dict) -> tuple[bool, str]:
        if name not in shown:
            return False, f"tick {name}"
        res = shown[name]
        v = f", v={res['chunks']}" if res["chunks"] > 1 else ""
        now = f"{name} at p={s.p}, m={s.m}{v}: bubble {_pct(res['bubble_fraction'])}"
        need = [f"p = {p}"] if s.p != p else []
        need += [f"m = {m}"] if m is not None and s.m != m else []
        need += [f"m at most {most_m}"] if most_m is not None and s.m > most_m else []
        if need:
            return False, f"{now}; the question asks for {' and '.join(need)}"
        return res["bubble_fraction"] < below - 1e-9, now  # 7/70 is not under 10%, whatever the rounding
    return goal


def _memory_goal(s: Settings, shown: dict) -> tuple[bool, str]:
    if not {"gpipe", "1f1b"} <= set(shown):
        return False, "tick gpipe and 1f1b"
    gp, ob = max(shown["gpipe"]["peak_activations"]), max(shown["1f1b"]["peak_activations"])
    ratio = gp / ob
    now = f"at p={s.p}, m={s.m}: GPipe's peak {gp:g}, 1F1B's {ob:g}: {ratio:.3g}\u00d7"
    return s.p == 4 and ratio >= 4 - 1e-9, now + ("" if s.p == 4 else "; the question is at p=4")


def _v_goal(s: Settings, shown: dict) -> tuple[bool, str]:
    if (s.p, s.m) != (8, 16) or s.cap is None or s.cap > 5:
        return False, f"p={s.p}, m={s.m}, cap {'none' if s.cap is None else f'{s.cap:g}'}; the question is at p=8, " \
                      "m=16 with a cap of at most 5"
    fit = {name: res for name, res in _simulated(s, V_SHAPES).items() if res["within_cap"]}
    if not fit:
        return False, f"no V schedule fits a cap of {s.cap:g}"
    best = min(fit, key=lambda n: fit[n]["bubble_fraction"])
    names = sorted(shown)
    now = "shown: " + ", ".join(f"{n} {_pct(shown[n]['bubble_fraction'])}"
                                f"{'' if shown[n]['within_cap'] else ' (over the cap)'}" for n in names)
    return names == [best], now


def _dualpipe_goal(s: Settings, shown: dict) -> tuple[bool, str]:
    if not {"zb-v", "dualpipe-v"} <= set(shown):
        return False, "tick zb-v and dualpipe-v"
    a, b = shown["dualpipe-v"]["makespan"], shown["zb-v"]["makespan"]
    a2a = "none" if s.a2a is None else s.a2a
    now = f"all-to-all {a2a}: dualpipe-v's step {a:g}, zb-v's {b:g}"
    return s.a2a is not None and a < b - 1e-9, now


def _uneven_goal(s: Settings, shown: dict) -> tuple[bool, str]:
    if "1f1b" not in shown or (s.p, s.m) != (4, 8):
        return False, "tick 1f1b at p=4, m=8"
    tf, tb = (s.tf if isinstance(s.tf, tuple) else (s.tf,) * s.p), (s.tb if isinstance(s.tb, tuple) else (s.tb,) * s.p)
    same = abs(sum(tf) - 5) < 1e-6 and abs(sum(tb) - 10) < 1e-6 and s.skew == 1
    span = shown["1f1b"]["makespan"]
    now = f"t_F sums to {sum(tf):g}, t_B to {sum(tb):g}" + ("" if s.skew == 1 else f", uneven layers \u00d7{s.skew:g}") + \
        f": makespan {span:g}"
    return same and span < 45, now


def _slices_goal(s: Settings, shown: dict) -> tuple[bool, str]:
    if not {"1f1b", "seq1f1b"} <= set(shown):
        return False, "tick 1f1b and seq1f1b"
    ob, sq = max(shown["1f1b"]["peak_activations"]), max(shown["seq1f1b"]["peak_activations"])
    now = (f"at p={s.p}, m={s.m}, {s.slices} slice{'s' if s.slices > 1 else ''}: Seq1F1B's peak {sq:g}, 1F1B's "
           f"{ob:g} ({sq / ob:.0%})")
    if (s.p, s.m) != (8, 8):
        return False, now + "; the question is at p=8, m=8"
    return sq <= ob / 2 + 1e-9, now


LESSONS = (
    Lesson(key="bubble", title="The bubble", start={"schedules": "1f1b", "p": 8, "m": 8},
           question="Make 1F1B's bubble under 10% at p = 8.", goal=_bubble_goal("1f1b", 0.10, p=8)),
    Lesson(key="memory", title="1F1B: the same bubble, less memory", start={"schedules": "gpipe,1f1b", "p": 4, "m": 8},
           question="At p = 4, find an m at which GPipe keeps 4\u00d7 the activations 1F1B keeps.", goal=_memory_goal),
    Lesson(key="interleaving", title="Interleaving: v chunks per rank",
           start={"schedules": "1f1b,interleaved-1f1b", "p": 4, "m": 8},
           question="Keep p = 4 and m = 8: make interleaved 1F1B's bubble under 10% with v.",
           goal=_bubble_goal("interleaved-1f1b", 0.10, p=4, m=8)),
    Lesson(key="zero-bubble", title="Zero bubble: W fills the gap", start={"schedules": "1f1b,zb-h1", "p": 4, "m": 8},
           question="At p = 4, with m at most 10, make ZB-H1's bubble under 10% (1F1B needs m = 28).",
           goal=_bubble_goal("zb-h1", 0.10, p=4, most_m=10)),
    Lesson(key="v-shape", title="The V shape: memory against bubble",
           start={"schedules": "zb-v,v-half,v-min", "p": 8, "m": 16},
           question="At p = 8, m = 16, set a cap of 5 activations per rank and keep only the V schedule with the "
                    "smallest bubble that fits.", goal=_v_goal),
    Lesson(key="dualpipe", title="DualPipe: both ends, and pairs that hide the all-to-all",
           start={"schedules": "zb-v,dualpipe-v", "p": 4, "m": 8},
           question="Raise the all-to-all until DualPipe-V's step is shorter than ZB-V's.", goal=_dualpipe_goal),
    Lesson(key="uneven", title="Uneven stages: the slowest sets the pace",
           start={"schedules": "1f1b", "p": 4, "m": 8, "tf": "1,1,1,2", "tb": "2,2,2,4"},
           question="Move work between the stages (t_F still summing to 5, t_B to 10) so the makespan drops under 45.",
           goal=_uneven_goal),
    Lesson(key="slices", title="Sequence slices: Seq1F1B", start={"schedules": "1f1b,seq1f1b", "p": 8, "m": 8},
           question="Keep p = 8 and m = 8: cut each micro-batch into slices until Seq1F1B keeps at most half of "
                    "1F1B's peak activations.", goal=_slices_goal),
)


def payload(s: Settings) -> dict:
    """Per taught family at the page's p, m and costs (its own v, no cap): bubble, closed form, peak memory,
    idle per cause, or the rule it breaks; and per lesson whether the view answers its question."""
    check_names(s)
    rows = []
    for name in TAUGHT:
        if name not in available():
            continue
        try:
            slices = s.slices if FAMILIES[name].slices else 1  # the page's slices go to the families that take them
            ((tl, res),) = simulate_settings(replace(s, schedules=(name,), v=None, cap=None, slices=slices))
        except SettingError as e:
            rows.append({"schedule": name, "error": str(e)})
            continue
        sched = tl.schedule
        rows.append({"schedule": name, "chunks": res["chunks"], "makespan": res["makespan"],
                     "bubble_fraction": res["bubble_fraction"],
                     "formula_bubble_fraction": res["formula_bubble_fraction"],
                     "peak_activations": res["peak_activations"], "busy": res["busy"],
                     "exposed_a2a": res.get("exposed_a2a"), "idle_by_cause": idle_by_cause(gap_causes(tl)),
                     "formula": formula(name, s.p, s.m, res["chunks"], costs_for(s, sched))})
    return {"p": s.p, "m": s.m, "rows": rows, "lessons": lessons(s)}


def lessons(s: Settings) -> list[dict]:
    """Each lesson as the page shows it, with ``answered`` and ``now`` for the view ``s``."""
    try:
        shown = _simulated(s, s.schedules)
    except SettingError:
        shown = {}
    out = []
    for lesson in LESSONS:
        answered, now = lesson.goal(s, shown) if shown else (False, "the settings do not simulate")
        out.append({"key": lesson.key, "title": lesson.title, "start": lesson.start, "question": lesson.question,
                    "answered": answered, "now": now})
    return out


def _simulated(s: Settings, names) -> dict:
    """Results by schedule of ``names`` at the settings ``s`` (those this version builds)."""
    names = tuple(n for n in names if n in available())
    return {res["schedule"]: res for _, res in simulate_settings(replace(s, schedules=names))} if names else {}


def formula(name: str, p: int, m: int, v: int, costs) -> dict | None:
    """The family's closed-form bubble as text, with the numbers in, and its value; None where the family
    has none for these costs (uneven stages, links, or no form for a shared step end).

    >>> formula("1f1b", 4, 8, 1, __import__("stagewise").Costs())["numbers"]
    '(4−1) / (8+4−1) = 3/11'
    """
    u = uniform(costs)
    if u is None:
        return None
    if name in ("gpipe", "1f1b"):
        return {"form": "(p−1) / (m+p−1)", "numbers": f"({p}−1) / ({m}+{p}−1) = {p - 1}/{m + p - 1}",
                "value": (p - 1) / (m + p - 1)}
    if name in ("interleaved-1f1b", "looped-bfs") and m >= p:
        return {"form": "(p−1) / (v·m+p−1)", "numbers": f"({p}−1) / ({v}·{m}+{p}−1) = {p - 1}/{v * m + p - 1}",
                "value": (p - 1) / (v * m + p - 1)}
    if name == "zb-h1" and m >= p and u.w <= min(u.f, u.i):
        idle, busy = (p - 1) * (u.f + u.b - 2 * u.w), m * (u.f + u.b)
        return {"form": "(p−1)(t_F+t_B−2t_W) / (m(t_F+t_B) + (p−1)(t_F+t_B−2t_W))",
                "numbers": f"{_n(idle)} / ({_n(busy)} + {_n(idle)})", "value": idle / (busy + idle)}
    return None


def _n(x: float) -> str:
    return f"{x:.4g}"
