"""`stagewise profile`: measure the built-in GPT (or an HF model) layer by layer into a JSON profile (torch)."""

from __future__ import annotations

import sys
import time

from .. import limits
from .common import UsageError, positive_int, print_json
from .planning import whole_numbers


def register(sub) -> None:
    p = sub.add_parser(
        "profile", help="measure the built-in GPT or an --hf model layer by layer (times, bytes, link) into a JSON "
        "profile",
        description="Time F, B, I and W of every layer of the built-in GPT (or an --hf model) on this device at "
        "each micro-batch size, one layer built at a time, count the activation, parameter and boundary bytes, "
        "measure the point-to-point link between two local ranks (gloo) and the per-step work outside the layers "
        "(two short runs of the same model on 2 local ranks). `stagewise plan --profile FILE` reads the result. "
        "For your own model use the "
        "Python API: stagewise.profiling.measure.profile_model(model), the model a runtime ModelConfig "
        "(stagewise.runtime.run.models.GPTConfig, LayerModel).")
    p.add_argument("-o", "--output", default="profile.json", help="where to write the profile, default profile.json")
    p.add_argument("--micro-batch-sizes", default="1,2,4", help="sizes to measure, default 1,2,4")
    p.add_argument("--layers", type=positive_int, default=4, help="transformer blocks, default 4 (+ embedding, head)")
    p.add_argument("--d-model", type=positive_int, default=64, help="width, default 64")
    p.add_argument("--heads", type=positive_int, default=4, help="attention heads, default 4")
    p.add_argument("--seq", type=positive_int, default=32, help="tokens per sequence, default 32")
    p.add_argument("--vocab", type=positive_int, default=64, help="vocabulary, default 64")
    p.add_argument("--dtype", default="float32", help="float32 (default), float64 or bfloat16")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    p.add_argument("--threads", type=positive_int, default=1,
                   help="torch threads while measuring, default 1 (match the threads per rank of the run)")
    p.add_argument("--repeats", type=positive_int, default=7, help="timed runs per layer (median), default 7")
    p.add_argument("--each-layer", action="store_true", help="time every layer, not one per distinct structure")
    p.add_argument("--no-link", action="store_true", help="skip the point-to-point measurement")
    p.add_argument("--no-overhead", action="store_true",
                   help="skip measuring the per-step work outside the layers (two short runs on 2 local CPU ranks; "
                   "measured only with --device cpu and the link)")
    p.add_argument("--hf", metavar="FOLDER_OR_CONFIG", default=None,
                   help="profile a transformers causal LM (a local folder or a config.json; pip install "
                   "'stagewise[hf]') instead of the built-in GPT: layers E, t per decoder layer, N (norm), H; "
                   "--seq, --dtype apply")
    p.add_argument("--json", action="store_true", help="print the profile as JSON too")
    p.set_defaults(func=cmd_profile)


def cmd_profile(args) -> int:
    sizes = whole_numbers(args.micro_batch_sizes, "--micro-batch-sizes")
    _check_sizes(args, sizes)  # before torch is imported or anything allocated
    try:
        from ..profiling.link import measure_link
        from ..profiling.measure import profile_model
    except ImportError as e:
        raise UsageError(f"stagewise profile needs torch ({e.name} is missing): pip install 'stagewise[torch]'") \
            from None
    model = _hf_model(args) if args.hf else _gpt_model(args)
    _check_device(args.device)
    _check_output(args.output)
    t0 = time.perf_counter()
    prof = profile_model(model, sizes, repeats=args.repeats, device=args.device, threads=args.threads,
                         each_layer=args.each_layer)
    from dataclasses import replace

    if not args.no_link:
        try:
            prof = replace(prof, link=measure_link())
        except RuntimeError as e:
            raise UsageError(f"{e}; rerun with --no-link to skip the link (plan then takes --intra-bandwidth)") \
                from None
    if not args.no_overhead and prof.link is not None and args.device == "cpu":  # the check runs on gloo CPU ranks
        from ..plan.search import KEY
        from ..profiling.step_overhead import measure_overhead

        fit = measure_overhead(prof, log=None if args.json else print)
        prof = replace(prof, meta={**prof.meta, KEY: fit})
    prof = _with_command(prof)
    try:
        prof.save(args.output)
    except OSError as e:
        raise UsageError(f"-o {args.output}: cannot write: {e.strerror}") from None
    if args.json:
        print_json(prof.to_json())
        return 0
    print(_profile_text(prof))
    print(f"wrote {args.output} in {time.perf_counter() - t0:.1f} s")
    return 0


def _check_sizes(args, sizes: list[int]) -> None:
    limits.SIZES.check(len(sizes), "--micro-batch-sizes", detail=f"--micro-batch-sizes: {len(sizes)} sizes")
    if len(set(sizes)) != len(sizes):
        twice = next(x for x in sizes if sizes.count(x) > 1)
        raise UsageError(f"--micro-batch-sizes names {twice} twice; each size is measured once")
    limits.REPEATS.check(args.repeats, "--repeats")
    limits.THREADS.check(args.threads, "--threads")
    if args.hf:  # the model's own sizes are checked when its config is read (stagewise.hf)
        limits.TOKENS.check(max(sizes) * args.seq, "", detail=f"--micro-batch-sizes {max(sizes)} x --seq {args.seq}"
                            f" = {max(sizes) * args.seq:,} tokens")
        return
    try:
        limits.check_gpt_size(layers=args.layers, d_model=args.d_model, heads=args.heads, seq=args.seq,
                              vocab=args.vocab, batch=max(sizes))
    except limits.LimitError as e:
        if "sequences" not in str(e):
            raise
        raise UsageError(f"--micro-batch-sizes {max(sizes)}: {e}") from None


def _check_output(path: str) -> None:
    """-o must be writable before minutes of measuring: a file in an existing folder, not a folder."""
    import os
    from pathlib import Path

    out = Path(path)
    if out.is_dir():
        raise UsageError(f"-o {path}: is a folder; give a file name such as {out / 'profile.json'}")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"-o {path}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise UsageError(f"-o {path}: cannot write there")


def _gpt_model(args):
    from ..runtime.run.models import GPTConfig

    cfg = GPTConfig(layers_n=args.layers, d_model=args.d_model, heads=args.heads, seq=args.seq, vocab=args.vocab,
                    dtype=args.dtype)
    cfg.check()
    return cfg


def _hf_model(args):
    try:
        from ..hf.hf_run import HFRun
    except ImportError as e:
        raise UsageError(f"--hf needs {e.name}: pip install 'stagewise[hf]'") from None
    model = HFRun(source=args.hf, seq=args.seq, dtype=args.dtype)  # random token ids: shapes, not meaning
    model.check()
    return model


def _check_device(device: str) -> None:
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"--device {device}: no CUDA device here; use --device cpu")
    if not (device == "cpu" or device.startswith("cuda")):
        raise UsageError(f"--device must be cpu or cuda[:N]; got {device!r}")


def _with_command(prof):
    from dataclasses import replace

    return replace(prof, meta={**prof.meta, "command": "stagewise " + " ".join(sys.argv[1:])})


def _profile_text(prof) -> str:
    from ..plan.search import fmt_bytes
    from ..plan.search import fmt_seconds

    k = 0
    w = max([12] + [len(x.name) + 2 for x in prof.layers])  # HF names are long: model.embed_tokens
    lines = [f"{prof.model} on {prof.device}, micro-batch size {prof.micro_batch_sizes[k]} "
             f"(of {', '.join(map(str, prof.micro_batch_sizes))}):",
             f"{'layer':<{w}}{'sym':<4}{'F':>10}{'B':>10}{'I':>10}{'W':>10}{'activations':>13}{'params':>12}"]
    for x in prof.layers:
        lines.append(f"{x.name:<{w}}{x.symbol:<4}{fmt_seconds(x.t_f[k]):>10}{fmt_seconds(x.t_b[k]):>10}"
                     f"{fmt_seconds(x.t_i[k]):>10}{fmt_seconds(x.t_w[k]):>10}{fmt_bytes(x.activation_bytes[k]):>13}"
                     f"{fmt_bytes(x.param_bytes):>12}")
    if prof.link:
        lines.append(f"link (gloo, 2 local ranks): {fmt_seconds(prof.link.latency)} + bytes / "
                     f"{prof.link.bandwidth / 1e9:.3g} GB/s")
    fit = prof.meta.get("step_overhead")
    if fit:
        lines.append(f"per step outside the layers: {fmt_seconds(fit['fixed_s'])} + {fmt_seconds(fit['per_action_s'])}"
                     " per action of the busiest rank, and the layers "
                     f"{fit.get('slowdown', 0.0):+.1%} slower in a run than alone (1F1B on 2 local ranks, measured "
                     "against predicted)")
    return "\n".join(lines)
