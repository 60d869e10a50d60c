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

Then the same under torchrun, as a cluster shrinks: two torchrun agents (two "nodes" of 2 ranks on
loopback, ``--nnodes 1:2``, one c10d rendezvous) train pp 2 x dp 2; once the step-2 checkpoint is written
the bench kills node B's whole process group (``kill -9``). Node A hosts the rendezvous' store
(``is_host=true``: the agent holding it must be one that stays, or every agent dies with it), and its
workers fail at B's closed connections; its agent restarts them on the 2 ranks left, which re-plan pp 2 x
dp 2 -> pp 2 and resume. Measured: kill -> the restarted worker's start (torchrun: the survivor's
detection, its agent's new rendezvous round, the spawn), then the worker's own parts from its restart
record (start: imports and the workers' group; re-plan; build: the stages and optimizer; load; reshard;
first step), and kill -> the end of the first step. Under the documented ``--rdzv-conf`` (docs/checkpoints.md:
``last_call_timeout=2``, how long a round that has its minimum of nodes waits for more, 30 s by default;
``keep_alive_interval=1,keep_alive_max_attempt=3``, a node is taken as dead 3 s after its last heartbeat, not
15 s, which a new round waits for), with ``last_call_timeout=2`` alone, and under torch's defaults.

    .venv/bin/python benchmarks/bench_elastic.py [--reps 3] [--torchrun-reps 1]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


#: the torchrun cases: (name, --rdzv-conf beyond is_host)
RDZV = (("documented", "last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=3"),
        ("last_call_timeout=2 alone", "last_call_timeout=2"), ("torch's defaults", ""))
TORCHRUN_PARTS = ("start_s", "replan_s", "build_s", "load_s", "reshard_s", "first_step_s")
TRAIN = ["--schedule", "1f1b", "-p", "2", "--dp", "2", "-m", "2", "--layers", "6", "--d-model", "64", "--heads", "4",
         "--seq", "32", "--vocab", "64", "--batch", "16", "--steps", "60", "--save-every", "2", "--elastic", "2:4",
         "--threads", "1", "--no-memory", "--json"]


class NoStart(Exception):
    """A node ended before the step-2 checkpoint: the agents' first rendezvous failed (not what is measured)."""


def two_agents(conf: str, tries: int = 3) -> dict:
    """One shrink under torchrun, node A's restart record with the kill -> worker start (``torchrun_s``) and
    kill -> first step's end (``kill_to_first_step_s``). On a loaded machine a node may reach the first
    rendezvous after its last call: the round then starts without it, and the start can fail (``NoStart``);
    such a run is started again, up to ``tries`` times."""
    for k in range(tries):
        try:
            return _shrink(conf)
        except NoStart:
            if k == tries - 1:
                raise


def _shrink(conf: str) -> dict:
    """Two agents, node B killed once step 2 is saved."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torchrun = str(Path(sys.executable).parent / "torchrun")
    with tempfile.TemporaryDirectory() as d:
        agents = []
        for host in ("true", "false"):  # A hosts the store: B's death leaves it
            rdzv = ",".join(x for x in (f"is_host={host}", conf, "join_timeout=120") if x)
            cmd = [torchrun, "--nnodes", "1:2", "--nproc-per-node", "2", "--max-restarts", "1", "--rdzv-backend",
                   "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "bench", "--rdzv-conf", rdzv,
                   "-m", "stagewise", "train", *TRAIN, "--save", d]
            agents.append(subprocess.Popen(cmd, cwd=d, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                           start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"}))
        a, b = agents
        try:
            saved = Path(d) / "step-00000002" / "manifest.json"
            while not saved.exists() and a.poll() is None and b.poll() is None:
                time.sleep(0.02)
            if not saved.exists():
                ended = [p for p in agents if p.poll() is not None]
                sys.stderr.write(f"a node ended before step 2 was saved ({ended[0].returncode}), again:\n"
                                 f"{ended[0].communicate()[1][-1500:]}\n")
                raise NoStart()
            killed = time.time()
            os.killpg(b.pid, signal.SIGKILL)  # node B is gone for good
            out, err = a.communicate(timeout=300)
        finally:
            for p in agents:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
        if a.returncode != 0:
            raise SystemExit(f"node A failed ({a.returncode}):\n{err[-3000:]}")
    [r] = json.loads(out)["restarts"]
    return {**r, "torchrun_s": r["started_at"] - killed, "kill_to_first_step_s": r["first_step_at"] - killed}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--torchrun-reps", type=int, default=1, help="runs of each torchrun case (0: none)")
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
    if args.torchrun_reps < 1:
        return
    cols = ("torchrun_s", *TORCHRUN_PARTS, "kill_to_first_step_s")
    print()
    print(f"torchrun, two agents of 2 ranks (--nnodes 1:2, c10d store on node A), pp 2 x dp 2 -> pp 2; node B "
          f"killed after the step-2 checkpoint; medians of {args.torchrun_reps} runs, seconds")
    print(f"{'--rdzv-conf':<44}" + "".join(f"{c.removesuffix('_s').replace('kill_to_first_step', 'kill->step'):>12}"
                                            for c in cols))
    for name, conf in RDZV:
        runs = [two_agents(conf) for _ in range(args.torchrun_reps)]
        med = {c: statistics.median(r[c] for r in runs) for c in cols}
        print(f"{name:<44}" + "".join(f"{med[c]:>12.2f}" for c in cols))


if __name__ == "__main__":
    main()
