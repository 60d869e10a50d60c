"""`stagewise train`: run a schedule for real on local ranks (or under torchrun).

torch is imported only when the command runs, so the rest of the CLI works
without it.
"""

from __future__ import annotations

import os
import sys

from . import train_hf, train_moe, train_safety, train_scale
from ..flags import add_layout_options
from .common import UsageError, check_timeline_output, int_list, positive_int, print_json


def register(sub) -> None:
    p = sub.add_parser(
        "train", help="train the built-in GPT or an --hf model with a schedule on local ranks (or under torchrun)",
        description="Run a schedule for real: p local ranks (gloo), the built-in GPT (or an --hf model), m "
        "micro-batches per step. "
        "Prints each step's loss, then the measured bubble next to the simulator's prediction from the measured "
        "mean cost of each action. Under torchrun (RANK/WORLD_SIZE set) this process is one rank. "
        "--schedule none (or -p 1) runs the unpipelined reference.")
    g = p.add_argument_group("schedule")
    g.add_argument("--schedule", metavar="NAME", default=None,
                   help="schedule family (see `stagewise list`), or 'none' for the unpipelined reference")
    g.add_argument("--csv", metavar="FILE", default=None, help="read the schedule from torch's compute-only CSV")
    add_layout_options(g, ("pp",), more={"pp": "default 4 (under torchrun: WORLD_SIZE / (dp x fsdp x ep x tp))"})
    g.add_argument("-m", "--microbatches", type=positive_int, default=8, help="micro-batches per step, default 8")
    g.add_argument("-v", "--chunks", type=positive_int, default=None, help="stages per rank (family default)")
    g.add_argument("--slices", type=positive_int, default=1,
                   help="sequence slices per micro-batch (seq1f1b, seq1f1b-zb; --seq a multiple of it), default 1")
    g.add_argument("--split", default=None, metavar="SPLIT",
                   help="layers per stage of one model copy: counts like 3,2,2,3 or a layout like 'E+t*2 | t*2+H' "
                   "(E embedding, t block, H head; as `stagewise plan` prints it); default: even")
    g = p.add_argument_group("model and data (built-in GPT)")
    g.add_argument("--layers", type=positive_int, default=4, help="transformer blocks, default 4 (+ embedding, head)")
    g.add_argument("--d-model", type=positive_int, default=64, help="width, default 64")
    g.add_argument("--heads", type=positive_int, default=4, help="attention heads, default 4")
    g.add_argument("--seq", type=positive_int, default=32, help="tokens per sequence, default 32")
    g.add_argument("--vocab", type=positive_int, default=None, help="vocabulary, default 64 (256 with --data)")
    g.add_argument("--dtype", default="float32", help="float32 (default), float64 or bfloat16")
    g.add_argument("--data", metavar="FILE", default=None,
                   help="train on this file's bytes (vocab 256); default: a seeded synthetic token stream")
    g.add_argument("--seed", type=int, default=0, help="weights and data, default 0")
    g.add_argument("--pack", action="store_true",
                   help="packed documents (docs/packing.md): each step's documents, of lengths drawn from BERT's "
                   "Wikipedia histogram scaled to --seq, packed into rows of --seq tokens, attention within each "
                   "document, tokens balanced across micro-batches and --dp ranks; with --hf too")
    g = p.add_argument_group("training")
    g.add_argument("--steps", type=positive_int, default=3, help="optimizer steps, default 3")
    g.add_argument("--batch", type=positive_int, default=None, help="sequences per step (default: 8, rounded up "
                   "to a multiple of -m)")
    g.add_argument("--lr", type=float, default=1e-3, help="learning rate, default 1e-3")
    g.add_argument("--optimizer", default="adamw", help="a torch.optim class, default adamw")
    g.add_argument("--clip", type=float, default=None, help="clip the global gradient norm to this value")
    g.add_argument("--timeout", type=float, default=30.0, help="seconds a rank waits for a peer, default 30: a "
                   "stalled rank is noticed after this (one that dies or raises stops the run within a second)")
    g.add_argument("--threads", type=positive_int, default=None, help="torch threads per rank (default cores/p)")
    train_hf.add_args(p)
    train_safety.add_args(p)
    train_scale.add_args(p)
    train_moe.add_args(p)
    g = p.add_argument_group("output")
    g.add_argument("--trace", metavar="FILE", default=None,
                   help="write the last step's measured timeline: .json Chrome trace, or .png .svg .html .txt")
    g.add_argument("--draw", action="store_true", help="draw the last step's measured timeline in the terminal")
    g.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_train)


def config_from(args):
    """The RunConfig of the parsed options (raises UsageError on a bad combination)."""
    from ..runtime.config import RunConfig, default_batch
    from ..runtime.run.models import GPTConfig

    name, ranks, reference = schedule_choice(args, world_per_replica=False)
    _check_sizes(args)
    if args.csv and args.slices != 1:
        raise UsageError(f"--slices {args.slices} cuts a family's micro-batches (--schedule seq1f1b); a --csv "
                         "schedule runs as written: leave --slices out")
    # the same default batch for the reference as for a pipelined -m (train_scale: x --dp); 0 or less is an error
    batch = args.batch if args.batch is not None else default_batch(args.microbatches)
    vocab = args.vocab if args.vocab is not None else (256 if args.data else 64)
    model = train_hf.model(args) if args.hf else GPTConfig(layers_n=args.layers, d_model=args.d_model,
                                                           heads=args.heads, seq=args.seq, vocab=vocab,
                                                           dtype=args.dtype, data=args.data, seed=args.seed,
                                                           pack=args.pack)
    return RunConfig(schedule=None if reference else name, csv=args.csv, ranks=1 if reference else ranks,
                     microbatches=args.microbatches, chunks=args.chunks, slices=1 if reference else args.slices,
                     steps=args.steps, batch=batch,
                     model=model, split=_split(args.split), lr=args.lr, optimizer=args.optimizer, clip=args.clip,
                     timeout=args.timeout, threads=args.threads)


def schedule_choice(args, *, world_per_replica: bool) -> tuple[str | None, int, bool]:
    """(--schedule name, ranks, whether this is the unpipelined reference) from the parsed options.

    Without -p the ranks are torchrun's WORLD_SIZE (divided by --dp x --fsdp x --ep x --tp when
    ``world_per_replica``), else 4. One rank with none of --dp, --fsdp, --ep, --tp is the reference.
    """
    from ..runtime.launching.groups import is_torchrun

    name = args.schedule
    if name is None and not args.csv:
        raise UsageError("--schedule NAME (or --csv FILE, or --schedule none) is required")
    if name and args.csv:
        raise UsageError(f"give either --schedule ({name}) or --csv, not both")
    from ..parallelism import Parallelism
    from ..runtime.launching.groups import torchrun_env

    given = Parallelism(**train_scale.degrees(args))
    other = given.per_pipeline_rank
    world = torchrun_env()[1] if is_torchrun() else 4
    if world_per_replica and is_torchrun():
        world = Parallelism.of_world(world, **train_scale.degrees(args)).pp
    ranks = args.ranks if args.ranks is not None else world
    return name, ranks, name == "none" or (ranks == 1 and other == 1 and not args.csv)


def _split(text: str | None):
    """--split: counts ``3,2,2,3`` (a tuple) or layout text ``E+t*3 | t*3+H`` (read against the model's layers
    by ``RunConfig.layer_split``)."""
    if text is None or not ("," in text or text.strip().isdigit()):
        return text
    return int_list("--split", text, "layer counts like 3,2,2,3 or a layout like 'E+t*3 | t*3+H'")


def _check_sizes(args) -> None:
    """Sizes that the defaults are computed from: >= 1 when given (zero never means "default")."""
    for option, value in (("-p", args.ranks), ("-m", args.microbatches), ("-v", args.chunks), ("--dp", args.dp),
                          ("--fsdp", args.fsdp), ("--tp", args.tp),
                          ("--batch", args.batch), ("--vocab", args.vocab), ("--threads", args.threads)):
        if value is not None and value < 1:
            raise UsageError(f"{option} must be >= 1; got {value}")


def cmd_train(args) -> int:
    from ..runtime.launching.groups import is_torchrun

    if not is_torchrun():
        from ..runtime.launching.launch import start_early

        start_early(train_hf.RANK_IMPORTS if args.hf else ())  # the ranks' imports overlap this process's own
    try:
        import torch  # noqa: F401 - the runtime needs it; say so before anything else
    except ImportError:
        raise UsageError("stagewise train needs torch: pip install 'stagewise[torch]'") from None
    from ..runtime import RankFailure, train
    from ..runtime.launching.launch import Stopped
    from ..runtime.resilience.preempt import Preempted
    from ..flags import say

    if args.trace:
        check_timeline_output("--trace", args.trace)
    train_hf.check_plain(args)
    speaks = not is_torchrun() or os.environ.get("RANK") == "0"  # under torchrun, rank 0 reports
    try:
        cfg = train_scale.apply(train_moe.apply(train_safety.apply(config_from(args), args), args), args)
        if args.hf:
            train_hf.check_tp_plan(cfg)
        with _progress(cfg.steps, enabled=speaks and not args.json) as report:
            res = train(cfg, report)
    except Preempted as e:  # --save-on-signal: every rank saved the step it finished; one says so
        if speaks:
            sys.stderr.write(f"stagewise train: stopped by SIGTERM after step {e.step}: saved {e.folder}; resume "
                             f"with --resume {args.save}\n")
        return e.code
    except Stopped as e:  # SIGTERM/SIGHUP: every rank is stopped; the conventional status
        sys.stderr.write(f"stagewise train: stopped by {e.name}; every rank stopped\n")
        return e.code
    except RankFailure as e:
        if e.user:
            raise UsageError(str(e)) from None
        sys.stderr.write(f"stagewise train: error: {say(str(e))}\n")  # a restart's reason names options
        if e.flight:
            sys.stderr.write(e.flight + "\n")
        return 1
    if speaks:
        _output(args, res)
    return 0


def _output(args, res) -> None:
    """Print ``res`` (a ``RunResult``): its JSON, or the summary and notes; write the trace."""
    last = res.last_timeline
    if args.trace and last is not None:
        from ..render.output import write_timeline

        write_timeline(last, args.trace)
    if args.json:
        print_json(res.to_json())
        return
    print(summary(res))
    for line in train_safety.lines(res) + train_scale.lines(res) + train_moe.lines(res) + train_hf.lines(res):
        print(line)
    if args.draw and last is not None:
        from ..render.ascii import draw_text

        print(draw_text(last))
    if args.trace and last is not None:
        print(f"wrote {args.trace} (measured timeline of the last step)")


def summary(res) -> str:
    """Mean step time and measured vs predicted bubble, the first step run excluded when there are several
    (numbered as the run counts its steps: a resumed run's first is the one after its checkpoint's)."""
    times = res.step_time_s[1:] or res.step_time_s
    first = (res.checkpoint or {}).get("resumed_step", 0) + 1
    last = first + len(res.step_time_s) - 1
    warm = f" (step {first} excluded as warm-up)" if len(res.step_time_s) > 1 else ""
    sliced = f" x {res.slices} slices" if res.slices > 1 else ""
    shape = (f"p={res.ranks} m={res.microbatches}{sliced}" if res.schedule != "none" else
              "the unpipelined reference, one process over the whole batch at once" if res.microbatches == 1 else
              f"the unpipelined reference, one process over {res.microbatches} micro-batches one after another "
              "(a pipeline's, its dropout masks too)")
    lines = [f"{res.schedule}: {shape}, mean step {_sec(sum(times) / len(times))}{warm}"]
    if res.padding_fraction and res.tokens_per_s is not None:  # padded or packed rows (--json: every run)
        lines.append(f"tokens: {sum(res.tokens):,} real, padding {res.padding_fraction:.1%}, "
                     f"{res.tokens_per_s:,.0f} tokens/s{' (after step ' + str(first) + ')' if warm else ''}")
    if res.ranks > 1:
        over = (f"step {last}" if last == first + 1 else f"the mean over steps {first + 1}..{last}") \
            if len(res.step_time_s) > 1 else f"step {first}"
        lines.append(f"bubble: measured {res.measured_bubble_fraction:.1%} ({over}), predicted "
                     f"{res.predicted_bubble_fraction:.1%} (simulator fed the measured mean cost of each action "
                     "kind per stage)")
    return "\n".join(lines)


class _progress:
    """Per-step loss lines; a rich progress bar too when stdout is a terminal and the run has several steps."""

    def __init__(self, steps: int, enabled: bool = True):
        self.steps, self.enabled = steps, enabled
        self.bar = None

    def __enter__(self):
        if self.enabled and sys.stdout.isatty() and self.steps > 2:
            try:
                from rich.progress import Progress

                self.bar = Progress(transient=True)
                self.bar.start()
                self.task = self.bar.add_task("training", total=self.steps)
            except ImportError:
                self.bar = None
        return self.report if self.enabled else None

    def report(self, job: int, step: int, loss: float, seconds: float) -> None:
        line = f"step {step + 1}/{self.steps}  loss {loss:.4f}  {_sec(seconds)}"
        if self.bar is not None:
            self.bar.console.print(line)
            self.bar.advance(self.task)
        else:
            print(line, flush=True)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
        return False


def _sec(x: float) -> str:
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s"
