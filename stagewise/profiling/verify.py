"""`plan --verify`: run the top configurations for real and set measured beside predicted.

Runs on the runtime (stagewise.runtime.train_many, local gloo ranks) with the
model the profile was made from (the built-in GPT, or an --hf model; ``model_of``). Every configuration that fits runs,
data parallel ones on p x dp local ranks and recomputation included; one that
does not fit is skipped and named. Measured step time is the median over the steps after the first
(warm-up). Measured peak activations are the runtime's meter (what autograd saves for
backward and the executor holds, counted like the profiler counts, so both sides
measure the same thing); the fixed bytes (weights, gradients, optimizer state)
are computed, not measured, and are left out of the comparison.
"""

from __future__ import annotations

import statistics
from typing import Callable

from .. import limits
from ..schedules import FAMILIES
from ..plan.search import fmt_bytes
from ..plan.errors import PlanError
from ..plan.search import Profile
from ..plan.search import Candidate


def verify(profile: Profile, cands: list[Candidate], k: int, *, steps: int = 6, rounds: int = 2,
           log: Callable[[str], None] | None = print) -> list[dict]:
    """Run the top ``k`` configurations that fit; one row each of predicted and measured figures.

    Configurations with the same ranks run in one launch, in ``rounds`` alternating rounds of
    ``steps`` steps, so load from elsewhere on the machine falls on all of them alike.
    """
    model = model_of(profile)
    if steps < 2:
        raise PlanError(f"`steps` must be >= 2 to verify (the first step warms up); got {steps}")
    from ..runtime.run.train import train_many
    picked, skipped = [], []
    for c in cands:
        if len(picked) == k:
            break
        why = None if c.fits else "does not fit"
        (skipped.append((c, why)) if why else picked.append(c))
    if log and skipped:
        log("verify skips: " + "; ".join(f"{c.config.label()}: {w}" for c, w in skipped[:5]))
    if not picked:
        raise PlanError("`verify`: none of the top configurations fits in `memory`")
    rows: dict[int, dict] = {}
    for p in sorted({c.config.p * c.config.dp for c in picked}):  # one launch per number of ranks
        group = [(n, c) for n, c in enumerate(picked) if c.config.p * c.config.dp == p]
        if log:
            log(f"verify: {len(group)} configuration(s) on {p} local ranks, {rounds} round(s) of {steps} steps")
        cfgs = [_run_config(c, model, profile, steps) for _, c in group]
        results = train_many(cfgs * rounds)
        for j, (n, c) in enumerate(group):
            runs = results[j::len(group)]
            times = [t for res in runs for t in res.step_time_s[1:]]
            timelines = [tl for res in runs for tl in res.timelines[1:]]
            rows[n] = _row(c, times, runs, timelines)
    return [rows[n] for n in range(len(picked))]


def model_of(profile: Profile):
    """The model a profile was measured on, rebuilt from what it recorded (``ModelConfig.profile_meta``)."""
    meta = profile.meta
    threads, optimizer = meta.get("threads"), meta.get("optimizer", "adamw")
    most = limits.THREADS.value
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= most):
        raise PlanError(f"`verify`: profile {profile.model!r}: meta.threads must be a whole number from 1 to {most} "
                        f"(torch threads per rank); got {str(threads)[:40]}")
    if not isinstance(optimizer, str) or not optimizer.isidentifier():
        raise PlanError(f"`verify`: profile {profile.model!r}: meta.optimizer must be a torch.optim class name; got "
                        f"{str(optimizer)[:40]!r}")
    for key in ("gpt", "hf"):
        if meta.get(key):
            return _rebuilt(profile, key)
    raise PlanError(f"`verify` reruns the model a profile was measured on; profile {profile.model!r} does not say "
                    "how to rebuild it (profiles from `stagewise profile`, of the built-in GPT or --hf, do)")


def _rebuilt(profile: Profile, key: str):
    """The model of the profile's ``meta.gpt`` or ``meta.hf``, checked: a field it does not have, a value out of
    its range, or not an object is named as the profile's (a hand-edited profile), not as a flag."""
    from ..runtime.config import RunError

    raw = profile.meta[key]
    try:
        if not isinstance(raw, dict):
            raise TypeError(f"an object of its options, not {type(raw).__name__}")
        if key == "gpt":
            from ..runtime.run.models import GPTConfig

            model = GPTConfig(**raw)
            model.check()
        else:  # transformers only for an HF profile
            from ..hf.hf_run import HFRun

            model = HFRun.from_meta(raw)
    except (TypeError, ValueError, KeyError, RunError) as e:
        why = str(e).replace("GPTConfig.__init__() got an ", "").replace("`", "")
        raise PlanError(f"`verify`: profile {profile.model!r}: meta.{key} does not rebuild the model it was measured "
                        f"on ({why[:200]}); profile it again with `stagewise profile`") from None
    return model


def _run_config(c: Candidate, model, profile: Profile, steps: int):
    from ..runtime.config import RunConfig

    g = c.config
    # a family by name (each rank generates it); auto's order as the Schedule value itself
    sched = dict(schedule=g.family, chunks=g.v) if g.family in FAMILIES else dict(schedule=c.schedule)
    return RunConfig(**sched, parallelism=c.parallelism, recompute=g.recompute, microbatches=g.m, steps=steps,
                     batch=g.m * g.mbs * c.parallelism.data_shards,
                     model=model, split=c.split, threads=profile.meta.get("threads"),
                     optimizer=profile.meta.get("optimizer", "adamw"),
                     measure_memory=True)  # the runtime's meter: what autograd saves, counted as the profile did


def _busy(tl) -> float:
    """Mean seconds of ops per rank of a measured timeline (what the simulator's (1 - bubble) x makespan is)."""
    return sum(e - s for st, en in zip(tl.starts, tl.ends) for s, e in zip(st, en)) / len(tl.starts)


def _row(c: Candidate, times: list[float], runs, timelines=()) -> dict:
    mems = [r.memory for r in runs if r.memory is not None and r.memory.peak_activation_bytes is not None]
    peaks = [max(m.peak_activation_bytes[r] for m in mems) if mems else None for r in range(c.config.p)]
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
