"""`plan --verify`: run the top configurations for real and set measured beside predicted.

Runs on the runtime (stagewise.runtime.train_many, local gloo ranks) with the
built-in GPT the profile was made from. Every configuration that fits runs,
data parallel ones on p x dp local ranks and recomputation included; one that
does not fit is skipped and named. Measured step time is the median over the steps after the first
(warm-up). Measured peak activations come from counting, on each rank, the
bytes autograd saves for backward (the profiler's own count, so both sides
measure the same thing); the fixed bytes (weights, gradients, optimizer state)
are computed, not measured, and are left out of the comparison.
"""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ...schedules import FAMILIES
from ...plan.cluster import fmt_bytes
from ...plan.errors import PlanError
from ...plan.profile import Profile
from ...plan.search import Candidate


@dataclass(frozen=True, kw_only=True)
class MeasuredGPT:
    """The built-in GPT whose layers count saved activation bytes per rank (a runtime model config).

    Each rank writes its peak to ``<peaks_dir>/rank<r>.txt`` when the next step's batch is made.
    """

    gpt: object  #: stagewise.runtime.run.models.GPTConfig
    peaks_dir: str

    @property
    def num_layers(self) -> int:
        return self.gpt.num_layers

    def check(self) -> None:
        self.gpt.check()

    def layers(self):
        from torch import nn

        class Counted(nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, x):
                with _counter().hooks(self.inner):
                    return self.inner(x)

        return [Counted(layer) for layer in self.gpt.layers()]

    def batch(self, step: int, size: int):
        counter = _counter()
        if step == 0:  # a new run in this process: its own peak
            counter.reset_peak()
        else:  # the steps so far are done: record their peak
            _write_peak(self.peaks_dir)
        return self.gpt.batch(step, size)

    def loss(self, output, target):
        return self.gpt.loss(output, target)


_COUNTER = None


def _counter():
    global _COUNTER
    if _COUNTER is None:
        from .measure import SavedBytes

        _COUNTER = SavedBytes()
    return _COUNTER


def _write_peak(folder: str) -> None:
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else 0
    Path(folder, f"rank{rank}.txt").write_text(str(_counter().peak))


def verify(profile: Profile, cands: list[Candidate], k: int, *, steps: int = 6, rounds: int = 2,
           log: Callable[[str], None] | None = print) -> list[dict]:
    """Run the top ``k`` configurations that fit; one row each of predicted and measured figures.

    Configurations with the same ranks run in one launch, in ``rounds`` alternating rounds of
    ``steps`` steps, so load from elsewhere on the machine falls on all of them alike.
    """
    gpt_args = profile.meta.get("gpt")
    if not gpt_args:
        raise PlanError("--verify runs the built-in GPT; this profile is of another model (profile it with "
                        "`stagewise profile` or run your model with stagewise.runtime.train)")
    if steps < 2:
        raise PlanError(f"--steps must be >= 2 for --verify (the first step warms up); got {steps}")
    try:
        from ..launching.launch import train_many
        from ..run.models import GPTConfig
    except ImportError as e:
        raise PlanError(f"--verify needs torch ({e.name} is missing): pip install 'stagewise[torch]'") from None
    picked, skipped = [], []
    for c in cands:
        if len(picked) == k:
            break
        why = None if c.fits else "does not fit"
        (skipped.append((c, why)) if why else picked.append(c))
    if log and skipped:
        log("verify skips: " + "; ".join(f"{c.config.label()}: {w}" for c, w in skipped[:5]))
    if not picked:
        raise PlanError("--verify: none of the top configurations fits in --memory")
    gpt = GPTConfig(**gpt_args)
    rows: dict[int, dict] = {}
    with tempfile.TemporaryDirectory(prefix="stagewise-verify-") as tmp:
        for p in sorted({c.config.p * c.config.dp for c in picked}):  # one launch per number of ranks
            group = [(n, c) for n, c in enumerate(picked) if c.config.p * c.config.dp == p]
            if log:
                log(f"verify: {len(group)} configuration(s) on {p} local ranks, {rounds} round(s) of {steps} steps")
            cfgs = [_run_config(c, gpt, profile, steps, Path(tmp, str(n))) for n, c in group]
            results = train_many(cfgs * rounds)
            for j, (n, c) in enumerate(group):
                times = [t for res in results[j::len(group)] for t in res.step_time_s[1:]]
                timelines = [tl for res in results[j::len(group)] for tl in res.timelines[1:]]
                rows[n] = _row(c, times, Path(tmp, str(n)), timelines)
    return [rows[n] for n in range(len(picked))]


def _run_config(c: Candidate, gpt, profile: Profile, steps: int, folder: Path):
    from ..run.config import RunConfig

    g = c.config
    folder.mkdir()
    # a family by name (each rank generates it); auto's order as the Schedule value itself
    sched = dict(schedule=g.family, chunks=g.v) if g.family in FAMILIES else dict(schedule=c.schedule)
    return RunConfig(**sched, ranks=g.p, dp=g.dp, recompute=g.recompute, microbatches=g.m, steps=steps,
                     batch=g.m * g.mbs * g.dp,
                     model=MeasuredGPT(gpt=gpt, peaks_dir=str(folder)), split=c.split,
                     threads=profile.meta.get("threads"), optimizer=profile.meta.get("optimizer", "adamw"),
                     measure_memory=False)  # MeasuredGPT counts activations: no second meter in the timing


def _busy(tl) -> float:
    """Mean seconds of ops per rank of a measured timeline (what the simulator's (1 - bubble) x makespan is)."""
    return sum(e - s for st, en in zip(tl.starts, tl.ends) for s, e in zip(st, en)) / len(tl.starts)


def _row(c: Candidate, times: list[float], folder: Path, timelines=()) -> dict:
    peaks = [float((folder / f"rank{r}.txt").read_text()) if (folder / f"rank{r}.txt").exists() else None
             for r in range(c.config.p)]
    measured = statistics.median(times)
    return {"config": c.config.label(), "layout": c.layout, "predicted_step": c.step_time, "measured_step": measured,
            "measured_best": min(times), "error": c.step_time / measured - 1,
            "measured_busy": statistics.median(map(_busy, timelines)) if timelines else None,
            "predicted_activations": list(c.activations), "measured_activations": peaks, "steps": times}


def verify_table(rows: list[dict]) -> str:
    head = (f"{'#':>2} {'configuration':<40}{'predicted':>11}{'measured':>11}{'best':>10}{'error':>8}   "
            f"peak activations per rank, predicted / measured")
    lines = ["step time predicted vs measured (median over steps after the first; the runtime on local gloo ranks):",
             head, "-" * len(head)]
    for n, r in enumerate(rows, 1):
        acts = ", ".join(f"{fmt_bytes(p)} / {fmt_bytes(m) if m is not None else '?'}"
                         for p, m in zip(r["predicted_activations"], r["measured_activations"]))
        lines.append(f"{n:>2} {r['config']:<40}{r['predicted_step'] * 1e3:>9.1f}ms{r['measured_step'] * 1e3:>9.1f}ms"
                     f"{r['measured_best'] * 1e3:>8.1f}ms{r['error']:>+8.1%}   {acts}")
    fastest = min(range(len(rows)), key=lambda i: rows[i]["measured_step"])
    lines.append(f"measured fastest: #{fastest + 1} of the planner's order ({rows[fastest]['config']})")
    return "\n".join(lines)
