"""Memory per rank and step time of data parallel's three forms at the same world size: replicated, ZeRO-1, FSDP2.

The built-in GPT on pp 2 x 2 data-parallel ranks (4 ranks, gloo, CPU), each form one launch of the runtime's
one run path (``RunConfig`` -> ``RankTrainer``): replicated dp (every rank the whole stage, gradients
all-reduced), ZeRO-1 (AdamW's state sharded over dp), FSDP2 (parameters, gradients and state sharded; the
stage gathered from its first forward to its last backward), and FSDP2 with ``reshard_after_forward`` (each
layer gathered only while it computes; the gradients still whole until the stage's last backward). Per form:
the parameter, gradient and AdamW bytes each rank holds after a step (counted) next to the planner's rule
(each parameter over the ranks it is split across, AdamW's two moments over dp more under ZeRO-1), the
peak activation bytes (measured and simulated), the peak growth of the rank's resident memory over the run
(VmHWM after the steps minus VmRSS before the model is built, with glibc told to map every block of 64 KiB
or more apart and return it when freed, so the resident peak is the live peak: transient gathers and whole
gradients included), and the median step time (a second launch of each, with the runtime's own allocator
setting: freed memory kept for reuse).

    .venv/bin/python benchmarks/bench_parallel_memory.py [--d-model 512] [--layers 8] [--steps 4]
"""

from __future__ import annotations

import argparse
import statistics
import time

FORMS = {"replicated dp": {"dp": 2}, "ZeRO-1": {"dp": 2, "zero": 1}, "FSDP2": {"fsdp": 2},
         "FSDP2, reshard after forward": {"fsdp": 2, "reshard_after_forward": True}}


def _status(key: str) -> int:
    """A line of /proc/self/status in bytes (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def rank_main(form: dict, args, live: bool) -> dict:
    """One rank: reset the peak, build the run, step it, report what it held and its resident peak. ``live``:
    glibc returns every block of 64 KiB or more when freed (the resident peak is the live peak; slower), else
    the runtime's own setting (freed memory kept for reuse: the step times)."""
    import torch
    import torch.distributed as dist

    from stagewise.runtime.launching.allocator import keep_freed_memory
    from stagewise.runtime.config import RunConfig
    from stagewise.runtime.run.models import GPTConfig
    from stagewise.runtime.run.worker import Env, RankTrainer

    if live:  # every block of 64 KiB or more mapped on its own and returned when freed
        keep_freed_memory(trim_bytes=0, mmap_bytes=1 << 16)
    else:
        keep_freed_memory()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS: the peak counts from here
    before = _status("VmRSS")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = GPTConfig(layers_n=args.layers, d_model=args.d_model, heads=8, seq=args.seq, vocab=256)
    cfg = RunConfig(schedule="1f1b", ranks=2, microbatches=args.m, batch=args.batch, steps=args.steps, model=model,
                    **form)
    env = Env(rank=rank, world=world, device=torch.device("cpu"), backend="gloo")
    trainer = RankTrainer(env, cfg)
    times = [trainer.step(k)[1] for k in range(args.steps)]
    res = trainer.result()
    peak = [None] * world
    dist.all_gather_object(peak, _status("VmHWM") - before)
    if rank != 0:
        return {}
    mem = res.memory
    return {"state": mem.state_bytes, "predicted": mem.predicted_state_bytes, "act": mem.peak_activation_bytes,
            "act_predicted": mem.predicted_peak_activation_bytes, "peak": peak,
            "step_s": statistics.median(times[1:] or times), "losses": res.losses}


def mib(x) -> str:
    return "-" if x is None else f"{x / 2**20:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("-m", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    from stagewise import launch

    t0 = time.time()
    rows = {name: launch(rank_main, 4, form, args, True, threads=1, timeout=600) for name, form in FORMS.items()}
    for name, form in FORMS.items():  # the step times with the runtime's allocator setting, in a second launch
        rows[name]["step_s"] = launch(rank_main, 4, form, args, False, threads=1, timeout=600)["step_s"]
    print(f"GPT {args.layers} blocks d_model={args.d_model} seq={args.seq}, AdamW; pp 2 x 2 data-parallel ranks = 4, "
          f"1f1b m={args.m} batch={args.batch}; gloo, 1 thread per rank; {args.steps} steps each "
          f"({time.time() - t0:.0f} s in all). MiB per rank, ranks 0..3 (ranks 0 and 1 are one pipeline):")
    head = (f"{'form':<30} {'params held / rule':>20} {'grads':>14} {'AdamW held / rule':>20} "
            f"{'activations':>13} {'resident peak':>14} {'step s':>7}")
    print(head)
    print("-" * len(head))
    for name, r in rows.items():
        for k in range(4):
            s, p = r["state"][k], r["predicted"][k]
            label = name if k == 0 else ""
            step = f"{r['step_s']:>7.3f}" if k == 0 else ""
            print(f"{label:<30} {mib(s['parameters']):>9} / {mib(p['parameters']):<8} {mib(s['gradients']):>14} "
                  f"{mib(s['optimizer']):>9} / {mib(p['optimizer']):<8} {mib(r['act'][k]):>6}/{mib(r['act_predicted'][k]):<6} "
                  f"{mib(r['peak'][k]):>14} {step}")
    base = rows["replicated dp"]
    for name, r in rows.items():
        held = [sum(v for v in s.values()) for s in r["state"]]
        ref = [sum(v for v in s.values()) for s in base["state"]]
        print(f"{name}: state held {sum(held) / sum(ref):.2f}x of replicated, resident peak "
              f"{sum(r['peak']) / sum(base['peak']):.2f}x, step time {r['step_s'] / base['step_s']:.2f}x, "
              f"losses {'equal' if max(abs(a - b) for a, b in zip(r['losses'], base['losses'])) < 1e-4 else 'DIFFER'}")


if __name__ == "__main__":
    main()
