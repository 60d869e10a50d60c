"""From a rank's death to the first step after the restart, split into its parts (measured).

A run of the built-in GPT saves every 2 steps; a fault kills one rank at step 3 (``lose``: its slot is gone, so
an ``--elastic`` run re-plans; ``exit``: the same ranks come back). The run's own record of the transition
(``RunResult.restarts``, restart.py) gives, per repetition:

- detection: the dead rank's last flight-recorder event to the launcher stopping every rank;
- restart: the launcher's decision to the new ranks starting to restore (spawn from the launcher's
  forkserver, torch preloaded; rendezvous; preflight; building each rank's stages);
- re-plan: choosing the layout for the ranks left (``plan.elastic``);
- load: finding and verifying the checkpoint (manifest, every file's size and SHA-256, RNG states);
- reshard: DCP's read of each rank's shards into the new layout;
- first step: the rest, up to the end of the first step after the restart;
- downtime: the whole, from the death to that step's end.

Medians over the repetitions, each a fresh run in a fresh folder.

    .venv/bin/python benchmarks/bench_elastic.py [--reps 3]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import tempfile

from stagewise import Parallelism
from stagewise.runtime import RunConfig, train
from stagewise.runtime.run.models import GPTConfig

PARTS = ("detection_s", "restart_s", "replan_s", "load_s", "reshard_s")

CASES = (  # (name, layout and m, fault, elastic)
    ("same ranks back (pp 2 x dp 2)", (Parallelism(pp=2, dp=2), 4), "exit:rank=3:action=1F0:step=3", None),
    ("one slot lost: dp 2 -> 1 (pp 2 x dp 2 -> pp 2)", (Parallelism(pp=2, dp=2), 4),
     "lose:rank=3:action=1F0:step=3", (2, 4)),
    ("one slot lost: 4 -> 3 stages, re-partitioned (pp 4 -> pp 3)", (Parallelism(pp=4), 8),
     "lose:rank=3:action=3F0:step=3", (2, 4)),
    ("one slot lost: FSDP kept, 2 -> 1 stage (pp 2 x fsdp 2 -> fsdp 2)", (Parallelism(pp=2, fsdp=2), 4),
     "lose:rank=3:action=1F0:step=3", (2, 4)),
)


def one(layout: tuple, fault: str, elastic, model) -> dict:
    par, m = layout
    with tempfile.TemporaryDirectory() as d:
        cfg = RunConfig(schedule="1f1b", parallelism=par, microbatches=m, batch=16, steps=4, model=model,
                        measure_memory=False, save=d, save_every=2, max_restarts=1, elastic=elastic, fault=fault)
        with contextlib.redirect_stderr(io.StringIO()):  # the restart's own line: its record says it all
            res = train(cfg)
    [r] = res.restarts
    r = dict(r)
    r["first_step_s"] = r["downtime_s"] - sum(r[k] for k in PARTS)
    return r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    model = GPTConfig(layers_n=6, d_model=64, heads=4, seq=32, vocab=64)
    train(RunConfig(schedule="1f1b", parallelism=Parallelism(pp=2), microbatches=2, batch=4, steps=1, model=model,
                    measure_memory=False))  # the forkserver started: every case's first launch alike
    cols = (*PARTS, "first_step_s", "downtime_s")
    print(f"built-in GPT ({model.layers_n} blocks, d {model.d_model}), 1f1b, batch 16, saved every 2 steps, a rank "
          f"killed at step 3; medians of {args.reps} runs, milliseconds")
    print(f"{'case':<66}" + "".join(f"{c.removesuffix('_s'):>11}" for c in cols) + "  new layout")
    for name, layout, fault, elastic in CASES:
        runs = [one(layout, fault, elastic, model) for _ in range(args.reps)]
        med = {c: statistics.median(r[c] for r in runs) for c in cols}
        print(f"{name:<66}" + "".join(f"{med[c] * 1e3:>11.1f}" for c in cols) + f"  {runs[0]['new_layout']['text']}")


if __name__ == "__main__":
    main()
