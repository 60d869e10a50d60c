"""The flight recorder's cost against a training step: target under 1% of the step on the built-in GPT.

Times one recorded event (median of repetitions, the text formatted as the
messages format it), counts the events a step records per rank (2 per op, 3
per received message, 1 per send, 3 per step), and divides by the measured
step time of a real run (the CLI's default model, 1f1b, p=2, m=8; median step,
the first excluded).

    .venv/bin/python benchmarks/bench_flight.py [--reps 7]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from stagewise.actions import Action
from stagewise.runtime import RunConfig, train
from stagewise.runtime.execution.program import lower
from stagewise.runtime.messages.p2p import Route, _brief
from stagewise.runtime.resilience.flight import SEND, Recorder
from stagewise.runtime.run.models import GPTConfig
from stagewise.schedules import generate


def event_cost(reps: int, n: int = 20_000) -> float:
    """Seconds per recorded event: a route's text and the record, into a file-backed ring."""
    with tempfile.TemporaryDirectory() as d:
        rec = Recorder(path=Path(d) / "r.flight")
        route, op = Route(0, 1, 3), Action("F", 1, 3)
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            for _ in range(n // 2):
                rec.event(SEND, _brief(route, 0))
                rec.start(op)
            times.append((time.perf_counter() - t) / n)
        return statistics.median(times)


def events_per_step(schedule) -> list[int]:
    out = []
    for r, prog in enumerate(schedule.programs):
        kinds = [str(getattr(a, "kind", "")) for a in lower(schedule, r).program]
        sends, recvs = sum(k.startswith("SEND") for k in kinds), sum(k.startswith("RECV") for k in kinds)
        out.append(2 * len(prog) + 3 * recvs + sends + 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    cost = event_cost(args.reps)
    model = GPTConfig(layers_n=4, d_model=64, heads=4, seq=32, vocab=64)  # `stagewise train`'s default model
    res = train(RunConfig(schedule="1f1b", ranks=2, microbatches=8, batch=8, steps=args.reps + 1, model=model))
    step = statistics.median(res.step_time_s[1:])
    events = max(events_per_step(generate("1f1b", 2, 8)))
    print(f"one event: {cost * 1e6:.2f} us; {events} events per step on the busiest rank; step {step * 1e3:.1f} ms")
    print(f"recorder / step = {events * cost / step:.2%} (target < 1%)")


if __name__ == "__main__":
    main()
