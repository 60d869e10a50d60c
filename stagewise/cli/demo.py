"""`stagewise demo`: every family on one model, the pictures and a report, then a real run whose claims it checks.

The real run trains the built-in GPT on local ranks under 1F1B and ZB-H1 and makes two claims: each
measured bubble lies within ``TOLERANCE`` of the simulator's prediction (fed the measured cost of each
action kind per stage), and ZB-H1's step is shorter than 1F1B's. Both need each rank to have a core
of its own, so the demo runs as many ranks as the machine has cores, 2 to 4 (``run_sizes``), and when
a claim misses it says why it may have: more ranks than cores, or a machine busy with other programs
(its load average), which stretch ops at random and add waits the simulator cannot see.

The pictures are SVG from the pure-Python renderer (``render.svg``), which takes a few hundredths of a
second where matplotlib's PNG of eleven timelines takes seconds; ``stagewise compare -o x.png`` draws the PNG.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
from dataclasses import dataclass
from pathlib import Path

from .. import jsonout
from ..report import table
from .common import UsageError, costs_from

#: the claims' tolerance: measured and predicted bubble within this many points of each other
TOLERANCE = 0.05
#: the families the run compares: the baseline and the one that should be faster
RUN_FAMILIES = ("1f1b", "zb-h1")


def register(sub) -> None:
    p = sub.add_parser("demo", help="the tour: every family at p=4, m=8, pictures, report and a real run",
                       description="Simulate every family at p=4, m=8 on one model and print the table, write the "
                       "comparison picture (SVG) and an offline HTML report into -o, then train the built-in GPT "
                       "for real on local ranks (one per core, 2 to 4) under 1F1B and ZB-H1, print the measured "
                       "bubble (the mean over the steps after the first) next to the simulator's prediction, and "
                       f"check the two claims: each within {100 * TOLERANCE:.0f} points, and ZB-H1's step shorter than "
                       "1F1B's (saying why when one misses).")
    p.add_argument("-o", "--output", default="stagewise-demo", help="output folder, default ./stagewise-demo")
    p.add_argument("--no-run", action="store_true", help="skip the real run on local ranks")
    p.set_defaults(func=cmd_demo)


def cmd_demo(args) -> int:
    from .core import compare_entries

    load = _load()  # before the demo's own work: what other programs keep running (a 1-minute average)
    from ..runtime.launching.launch import start_early

    start_early()  # the ranks' imports (torch) overlap the pictures drawn first
    out = Path(args.output)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--output {out}: cannot create: {e.strerror}") from None
    ns = argparse.Namespace(ranks=4, microbatches=8, chunks=None, schedules=None, tf=1.0, tb=2.0, ti=None,
                            tw=None, tfb=None, latency=0.0, bandwidth=None, boundary_bytes=0.0,
                            activation_bytes=None, costs_per="rank")
    entries = compare_entries(ns)
    results = [res for res, _ in entries]
    print("Every schedule family on the same model at p=4 ranks, m=8 micro-batches: t_f=1, t_b=2 for one\n"
          "rank's share of the model (a chunk of a v-chunk schedule costs and keeps 1/v; --costs-per rank)\n")
    print(table(results))
    path = out / "schedules.json"
    path.write_text(jsonout.dumps(results, indent=2))
    print(f"\nwrote {path}")
    pictures(entries, costs_from(ns), out)
    if not args.no_run:
        demo_run(out, load=load)
    return 0


def pictures(entries, costs, out: Path) -> None:
    """The comparison picture and the HTML report, both from the pure-Python SVG renderer."""
    from ..render.html import report_html
    from ..render.svg import compare_svg

    figure = out / "compare.svg"
    figure.write_text(compare_svg([tl for _, tl in entries]), encoding="utf-8")
    print(f"wrote {figure} (a PNG: stagewise compare --costs-per rank -o compare.png)")
    page = out / "report.html"
    page.write_text(report_html(entries, costs, costs_per="rank"), encoding="utf-8")
    print(f"wrote {page}")


@dataclass(frozen=True, kw_only=True)
class Sizes:
    """The real run's sizes: ranks, micro-batches, steps (the first is the warm-up) and the model."""

    ranks: int
    microbatches: int
    steps: int = 6
    batch: int = 16
    layers: int = 6
    d_model: int = 128
    seq: int = 64


def run_sizes(cores: int) -> Sizes:
    """One rank per core, 2 to 4: on 2 cores, p=2 and m=4 (1F1B's bubble 1/5 against ZB-H1's 1/13 at t_W = t_B/2,
    a step about 13% shorter in the simulator, with 4 micro-batches to measure); from 4 cores, the table's p=4, m=8.

    >>> run_sizes(2), run_sizes(16).ranks
    (Sizes(ranks=2, microbatches=4, steps=6, batch=16, layers=6, d_model=128, seq=64), 4)
    """
    ranks = max(2, min(4, cores))
    return Sizes(ranks=ranks, microbatches=4 if ranks < 4 else 8)


def demo_run(out: Path, sizes: Sizes | None = None, load: float | None = None) -> None:
    """The demo's real run: the built-in GPT under 1F1B and ZB-H1 on local ranks, measured vs predicted bubble,
    and the verdict on its claims."""
    if importlib.util.find_spec("torch") is None:
        print("\n(real run skipped: torch is not installed; pip install 'stagewise[torch]')")
        return
    from ..runtime import RankFailure, RunConfig
    from ..runtime.run.models import GPTConfig
    from ..runtime.run.train import train_many

    cores = os.cpu_count() or 1
    z = sizes or run_sizes(cores)
    model = GPTConfig(layers_n=z.layers, d_model=z.d_model, heads=4, seq=z.seq, vocab=256)
    cfgs = [RunConfig(schedule=name, ranks=z.ranks, microbatches=z.microbatches, batch=z.batch, steps=z.steps,
                      model=model) for name in RUN_FAMILIES]
    load = _load() if load is None else load
    print(f"\nA real run: {z.ranks} local ranks (gloo, one per core: this machine has {cores}), GPT with {z.layers} "
          f"blocks, d_model {z.d_model}, seq {z.seq}; m={z.microbatches}, {z.steps} steps each:")
    try:
        results = train_many(cfgs)
    except RankFailure as e:
        print(f"(real run failed: {e})")
        return
    from ..render.output import write_timeline
    from ..timeline import metrics
    from .train import summary

    for res in results:
        print(summary(res))
        last = metrics(res.last_timeline).bubble_fraction
        for suffix in (".json", ".svg"):
            path = write_timeline(res.last_timeline, out / f"measured-{res.schedule}{suffix}")
            print(f"wrote {path} (the last step's measured timeline: its own bubble {last:.1%})")
    print("\n".join(verdict(results, cores=cores, ranks=z.ranks, load=load, predicted=predicted_steps(results))))


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # not on every platform
        return 0.0


def step_time(res) -> float:
    """The median step after the first (the warm-up): one step that another program slowed does not move it."""
    return statistics.median(res.step_time_s[1:] or res.step_time_s)


def predicted_steps(results) -> dict[str, float]:
    """Each run's step as the simulator predicts it, fed that run's measured mean cost of each action kind
    per stage (what ``predicted_bubble_fraction`` is computed from): the order of two schedules on this machine,
    where ZB-H1's split backward (I, then W) may cost more than one fused B."""
    from ..runtime.execution.timing import predicted

    return {r.schedule: predicted(r.timelines[1:] or r.timelines).makespan for r in results if r.timelines}


def verdict(results, *, cores: int, ranks: int, load: float, predicted: dict | None = None) -> list[str]:
    """The run's two claims, each held or missed, and why a miss may have happened. ``predicted``: each
    schedule's predicted step (``predicted_steps``); with it the second claim is that the measured order of
    the two steps is the predicted one, else that ZB-H1's step is the shorter (as with t_I + t_W = t_B).

    >>> from stagewise.runtime.result import RunResult
    >>> a = RunResult(schedule="1f1b", ranks=2, microbatches=4, losses=(1.0,), step_time_s=(0.5, 0.30, 0.30),
    ...               measured_bubble_fraction=0.22, predicted_bubble_fraction=0.20)
    >>> b = RunResult(schedule="zb-h1", ranks=2, microbatches=4, losses=(1.0,), step_time_s=(0.5, 0.26, 0.27),
    ...               measured_bubble_fraction=0.15, predicted_bubble_fraction=0.08)
    >>> print("\\n".join(verdict([a, b], cores=2, ranks=2, load=3.2)))
    claims, within 5 points: 1f1b's bubble 22.0% measured, 20.0% predicted: held; zb-h1's bubble 15.0% measured, 8.0% predicted: missed (7.0 points)
    zb-h1's step shorter than 1f1b's: held (265.0 ms against 300.0 ms, the median of steps 2..3)
    why a claim missed: this machine was busy while the ranks ran (load average 3.2 on 2 cores, 2 of them for the ranks): other programs took turns on the ranks' cores, which stretches ops at random and adds waits the simulator does not see; rerun it on an idle machine
    """
    by = {r.schedule: r for r in results}
    parts, missed = [], False
    for name in RUN_FAMILIES:
        r = by[name]
        off = abs(r.measured_bubble_fraction - r.predicted_bubble_fraction)
        ok = off <= TOLERANCE + 1e-12
        missed |= not ok
        parts.append(f"{name}'s bubble {r.measured_bubble_fraction:.1%} measured, {r.predicted_bubble_fraction:.1%} "
                     f"predicted: " + ("held" if ok else f"missed ({100 * off:.1f} points)"))
    lines = [f"claims, within {100 * TOLERANCE:.0f} points: " + "; ".join(parts)]
    base, fast = (step_time(by[n]) for n in RUN_FAMILIES)
    steps = len(by[RUN_FAMILIES[0]].step_time_s)
    a, b = RUN_FAMILIES
    if predicted and a in predicted and b in predicted:
        want = predicted[b] / predicted[a]
        ok = (fast < base) == (want < 1)
        lines.append(f"{b}'s step against {a}'s, in the predicted order: {'held' if ok else 'missed'} (measured "
                     f"{fast / base:.2f}x: {fast * 1e3:.1f} ms against {base * 1e3:.1f} ms, the median of steps "
                     f"2..{steps}; predicted {want:.2f}x from the ops' measured costs"
                     + (f", {b} {'shorter' if want < 1 else 'longer'} here" if abs(want - 1) > 1e-9 else "") + ")")
    else:
        ok = fast < base
        lines.append(f"{b}'s step shorter than {a}'s: {'held' if ok else 'missed'} "
                     f"({fast * 1e3:.1f} ms against {base * 1e3:.1f} ms, the median of steps 2..{steps})")
    missed |= not ok
    if missed:
        lines.append(f"why a claim missed: {why_missed(cores=cores, ranks=ranks, load=load)}")
    return lines


def why_missed(*, cores: int, ranks: int, load: float) -> str:
    """What may have made the run miss a claim: more ranks than cores, or other programs on the machine."""
    if ranks > cores:
        return (f"{ranks} ranks share {cores} core{'s' if cores > 1 else ''} here: an op stretches while more ranks "
                "compute than there are cores, so the measured bubble lies above the prediction")
    if load + ranks > cores + 0.5:
        return (f"this machine was busy while the ranks ran (load average {load:.1f} on {cores} cores, {ranks} of them "
                "for the ranks): other programs took turns on the ranks' cores, which stretches ops at random and adds "
                "waits the simulator does not see; rerun it on an idle machine")
    return ("the machine was idle and each rank had a core: the difference is the runtime's own (messages, Python "
            "between ops), which the prediction leaves out; more micro-batches or a larger model shrink its share")
