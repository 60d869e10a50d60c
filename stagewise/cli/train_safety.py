"""`stagewise train`'s checkpoint and fault options, and what the run says about them.

Not a subcommand: ``train.py`` adds these options and prints these lines.
The test-only fault (``stagewise.runtime.resilience.faults``) comes from the
``STAGEWISE_FAULT`` environment variable, deliberately not an option.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

from .common import positive_int, whole_int

FAULT_ENV = "STAGEWISE_FAULT"  # stagewise.runtime.resilience.faults.ENV, without importing the runtime


def add_args(p) -> None:
    g = p.add_argument_group("checkpoints and faults")
    g.add_argument("--save", metavar="DIR", default=None,
                   help="write a checkpoint to DIR/step-NNNNNNNN at the end (and every --save-every steps): "
                   "one torch.distributed.checkpoint of the model and optimizer state, written by every rank, the RNG "
                   "states and a manifest written last")
    g.add_argument("--overwrite", action="store_true",
                   help="let --save replace another run's checkpoints in DIR (deleted at the first save); "
                   "without it such a folder is refused (a resumed run saves into its own run's folder freely)")
    g.add_argument("--save-every", metavar="N", type=positive_int, default=None,
                   help="also save after every N steps")
    g.add_argument("--resume", metavar="DIR", default=None,
                   help="continue from a checkpoint: a --save DIR (its newest complete step) or one step folder; "
                   "any schedule, -p, -v, --dp, --fsdp or --tp; --steps counts from the start")
    g.add_argument("--save-on-signal", metavar="GRACE", type=_grace, nargs="?", const=30.0, default=None,
                   help="on SIGTERM (a preemption notice) finish the step, write a checkpoint into --save within GRACE "
                   "seconds (default 30), exit 143; a second SIGTERM stops at once")
    g.add_argument("--max-restarts", metavar="N", type=_count, default=0,
                   help="when a rank dies, errs or hangs past --timeout, restart every rank from the last complete "
                   "checkpoint of --save, up to N times (default 0)")
    g.add_argument("--elastic", metavar="MIN:MAX", type=_range, default=None,
                   help="with --max-restarts (under torchrun, alone): a restart, or a torchrun launch, on fewer ranks "
                   "(>= MIN) re-plans the layout (fewer dp replicas first, else fewer stages), keeps the global "
                   "batch, and reshards the checkpoint into it")
    g.add_argument("--skip-nonfinite", action="store_true",
                   help="on a nan/inf loss skip that step's update on every rank and go on (default: stop)")


def apply(cfg, args):
    """``cfg`` with the options above (and the test fault from the environment)."""
    return dataclasses.replace(cfg, save=args.save, save_every=args.save_every, resume=args.resume,
                               overwrite=args.overwrite, save_on_signal=args.save_on_signal,
                               max_restarts=args.max_restarts, elastic=args.elastic,
                               skip_nonfinite=args.skip_nonfinite, fault=os.environ.get(FAULT_ENV) or None)


def lines(res) -> list[str]:
    """What the run (a ``RunResult``) did with checkpoints and non-finite steps, one line each."""
    out = []
    ck = res.checkpoint or {}
    out += [f"note: --resume passed over {s}" for s in ck.get("skipped", [])]
    if ck.get("removed"):
        gone = ck["removed"]
        out.append(f"--save: deleted {', '.join(gone[:4])}{f' and {len(gone) - 4} more' if len(gone) > 4 else ''} "
                   "(another run's or unfinished checkpoints with --overwrite; temporaries of a crashed save)")
    if "resumed_from" in ck:
        rng = "" if ck["rng_restored"] else " (another layout: RNG states not restored)"
        out.append(f"resumed from {ck['resumed_from']} after step {ck['resumed_step']}{rng}")
    for folder, seconds in zip(ck.get("saved", []), ck.get("save_s", [])):
        out.append(f"saved {folder} ({seconds * 1e3:.0f} ms)")
    for r in res.restarts or ():
        cost = f", {r['time_lost_s']:.2f} s lost" if r.get("time_lost_s") is not None else ""
        if r["event"] in ("torchrun restart", "launch on fewer ranks"):
            what = f"torchrun restart {r['attempt']}" if r["attempt"] else f"launched on {r['world']} ranks"
            out.append(f"{what}: resumed at step {r['resumed_step']} on {r['new_layout']['text']}")
            continue
        if r["event"] == "grow":
            slots = f"{r['slots_back']} slot{'s' if r['slots_back'] != 1 else ''}"
            out.append(f"grow {r['attempt']} after step {r['after_step']}: {slots} back, resumed at step "
                       f"{r['resumed_step']} on {r['new_layout']['text']}{cost}")
            continue
        out.append(f"restart {r['attempt']} after step {r['failed_after_step']}: resumed at step {r['resumed_step']} "
                   f"({r['lost_steps']} lost) on {r['new_layout']['text']}{cost}")
    for s in res.skipped_steps or ():
        at = f" at {s['where']}" if s["where"] else ""
        out.append(f"skipped the update of step {s['step']}: loss {s['loss']}{at}")
    return out


def _grace(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"the grace must be a number of seconds > 0; got {text!r}")
    return value


def _count(text: str) -> int:
    value = whole_int(text)  # at most 18 digits
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0; got {text!r}")
    return value


def _range(text: str) -> tuple[int, int]:
    low, sep, high = text.partition(":")
    if not (sep and low.isdigit() and high.isdigit()) or not 1 <= int(low) <= int(high):
        raise argparse.ArgumentTypeError(f"must be MIN:MAX ranks, 1 <= MIN <= MAX (e.g. 2:4); got {text!r}")
    return int(low), int(high)
