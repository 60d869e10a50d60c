"""What the planner prints: the ranked table, why the winner wins, and the command that runs it."""

from __future__ import annotations

import shlex

from .bands import memory_cell, tie
from .devices import fmt_bytes
from ...split import format_layout
from .profile import Profile
from .search import Candidate


def table(cands: list[Candidate], symbols, top: int = 10) -> str:
    head = (f"{'#':>3}  {'schedule':<17}{'p':>3}{'dp':>4}{'v':>3}{'m':>5}{'mbs':>5} {'rc':<4}"
            f"{'step':>10}{'samples/s':>11}{'bubble':>8}  {'peak mem/rank (band)':<26}{'fits':<5} layout")
    lines = [head, "-" * len(head)]
    for n, c in enumerate(cands[:top], 1):
        g = c.config
        lines.append(
            f"{n:>3}  {g.family:<17}{g.p:>3}{g.dp:>4}{g.v:>3}{g.m:>5}{g.mbs:>5} {'on' if g.recompute else 'off':<4}"
            f"{fmt_seconds(c.step_time):>10}{c.throughput:>11.4g}{c.bubble:>8.1%}  {memory_cell(max(c.memory), c.memory_band):<26}"
            f"{'yes' if c.fits else 'NO':<5} {format_layout(symbols, c.counts, abbreviate=True)}")
    return "\n".join(lines)


def why(cands: list[Candidate]) -> str:
    """One line: the winner against the best configuration of another family (a tie when their bands, the
    profile's measured spread, overlap)."""
    best = cands[0]
    other = next((c for c in cands[1:] if c.fits == best.fits and c.config.family != best.config.family), None)
    if other is None:
        return f"{best.config.family} wins: no other family has a configuration that fits"
    b, o = best.config, other.config
    faster = other.step_time / best.step_time - 1
    if tie(best.step_time, best.band, other.step_time, other.band):
        spread = (f"inside the profile's measured spread (±{max(best.band or 0, other.band or 0):.1%})"
                  if best.band or other.band else "the same prediction (this profile records no spread)")
        return (f"{b.family} and {o.family} are a tie: {faster:.2%} apart, {spread}; "
                f"{b.family} is listed first, {o.family} is as good a choice")
    mem_b, mem_o = max(best.memory), max(other.memory)
    mem = "same memory" if abs(mem_b - mem_o) <= 0.05 * max(mem_b, mem_o) else \
        f"peak memory {fmt_bytes(mem_b)} vs {fmt_bytes(mem_o)}"
    same = [k for k in ("p", "dp", "m", "mbs", "recompute") if getattr(b, k) == getattr(o, k)]
    keys = ("p", "dp", "v", "m", "mbs", "recompute")
    diff = [f"{k}={_val(getattr(o, k))}" for k in keys if getattr(b, k) != getattr(o, k)]
    where = "same p, dp, m" if len(same) == 5 else f"at its best, {', '.join(diff)}"
    reasons = [f"bubble {best.bubble:.1%} vs {other.bubble:.1%}", mem]
    work_b, work_o = best.makespan * (1 - best.bubble), other.makespan * (1 - other.bubble)
    if abs(work_b - work_o) > 0.01 * work_o:  # e.g. a split backward's I + W costing more than B
        reasons.append(f"compute per rank {fmt_seconds(work_b)} vs {fmt_seconds(work_o)}")
    if abs(best.allreduce - other.allreduce) > 0.05 * best.step_time:
        reasons.append(f"step-end all-reduce {fmt_seconds(best.allreduce)} vs {fmt_seconds(other.allreduce)}")
    if abs(best.optimizer - other.optimizer) > 0.05 * best.step_time:
        reasons.append(f"optimizer step {fmt_seconds(best.optimizer)} vs {fmt_seconds(other.optimizer)}")
    pct = f"{faster:.1%}" if faster >= 0.01 else f"{faster:.2%}"
    return f"{b.family} wins: {pct} faster than the best {o.family} ({where}): " + ", ".join(reasons)


def _val(x) -> str:
    return ("on" if x else "off") if isinstance(x, bool) else str(x)


def train_command(best: Candidate, profile: Profile, csv_path: str | None, global_batch: int) -> str:
    """The `stagewise train` line that runs the winner."""
    c, par = best.config, best.parallelism
    gpt = profile.meta.get("gpt")
    if csv_path is not None:
        args = ["stagewise", "train", "--csv", csv_path, "-m", str(c.m)]
    else:
        args = ["stagewise", "train", "--schedule", c.family, "-m", str(c.m), "-v", str(c.v)]
    args += ["--batch", str(c.m * c.mbs * par.data_shards), "--split", str(best.split)]
    args += [*par.flags(), *(["--recompute"] if c.recompute else [])]  # the degrees as train takes them
    if gpt:
        for key, opt in (("layers_n", "--layers"), ("d_model", "--d-model"), ("heads", "--heads"), ("seq", "--seq"),
                         ("vocab", "--vocab"), ("dtype", "--dtype")):
            if key in gpt:
                args += [opt, str(gpt[key])]
    hf = profile.meta.get("hf")
    if hf:  # stagewise profile --hf: the same model folder; the text file is the user's
        args += ["--hf", hf["source"], "--seq", str(hf["seq"]), "--dtype", hf["dtype"],
                 "--data", "FILE"]
    threads = profile.meta.get("threads")
    if threads:
        args += ["--threads", str(threads)]
    line = shlex.join(args)
    notes = []
    if not gpt and not hf:
        notes.append("a user model: pass the same split to stagewise.runtime.train(RunConfig(..., model=...))")
    return line + (f"   # {'; '.join(notes)}" if notes else "")


def fmt_seconds(x: float) -> str:
    if x >= 1:
        return f"{x:.3g} s"
    if x >= 1e-3:
        return f"{x * 1e3:.3g} ms"
    return f"{x * 1e6:.3g} us"
