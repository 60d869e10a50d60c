"""A cluster plan as the options of the frameworks that run such jobs: Megatron-LM, torchtitan, DeepSpeed, stagewise.

Each framework's best layout (``cluster_search``'s ``Result.best``) becomes its own
command. Megatron-LM (Megatron-Core's ``pretrain_gpt.py`` flags) runs 1F1B and its
interleaved schedule; a split it cannot say with even stages or uneven first and last
ones is its ``--pipeline-model-parallel-layout`` (stages in virtual order, ``E`` the
embedding, ``t`` a block, ``L`` the loss with the output layer). torchtitan runs its
own schedule classes by name, and any order from torch's compute-only CSV
(``pipeline_parallel_schedule_csv``), with the split as ``pipeline_parallel_split_points``.
DeepSpeed's pipeline engine is configured by its JSON and ``PipelineModule``; stagewise
runs the plan with ``stagewise train`` under torchrun. Layer counts here are transformer
blocks; the embedding rides with the first stage and the head with the last.
"""

from __future__ import annotations

import json
import shlex
from itertools import accumulate

from .cluster_search import ClusterCandidate, Job

MEGATRON_SCHEDULES = ("1f1b", "interleaved-1f1b")
#: torchtitan's schedule classes by our family names (``--parallelism.pipeline_parallel_schedule``)
TORCHTITAN_SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B",
                        "looped-bfs": "LoopedBFS", "zb-v": "ZBVZeroBubble", "dualpipe-v": "DualPipeV"}


def block_counts(counts: tuple[int, ...]) -> list[int]:
    """Blocks per piece: the analytic profile's counts less the embedding (first) and head (last)."""
    out = list(counts)
    out[0] -= 1
    out[-1] -= 1
    return out


def megatron_options(c: ClusterCandidate, job: Job) -> tuple[str | None, str]:
    """(Megatron-LM flags, note); None when Megatron-LM has no such schedule."""
    g, spec = c.config, job.spec
    if g.family not in MEGATRON_SCHEDULES:
        return None, f"Megatron-LM runs 1F1B and interleaved 1F1B, not {g.family}"
    blocks = block_counts(c.candidate.counts)
    args = ["--tensor-model-parallel-size", str(c.t), "--pipeline-model-parallel-size", str(g.p),
            "--micro-batch-size", str(g.mbs), "--global-batch-size", str(job.global_batch),
            "--seq-length", str(spec.seq)]
    split = _megatron_split(c.candidate.counts, blocks)
    if g.v > 1 and g.p > 1 and not split[:1] == ["--pipeline-model-parallel-layout"]:  # no VPP without PP
        args += ["--num-virtual-stages-per-pipeline-rank", str(g.v)]
    args += split
    if job.sequence_parallel and c.t > 1:
        args.append("--sequence-parallel")
    if c.sharding == "zero1" and g.dp > 1:
        args += ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"]
    elif g.dp > 1:
        args.append("--overlap-grad-reduce")
    if c.ep > 1:  # experts sharded over ep GPUs of a stage, each cut over etp (MoE parallel folding)
        args += ["--num-experts", str(spec.moe.experts), "--moe-router-topk", str(spec.moe.top_k),
                 "--expert-model-parallel-size", str(c.ep)]
        if c.etp is not None and c.etp != c.t:
            args += ["--expert-tensor-parallel-size", str(c.etp)]
        if c.expert_placement == "across":
            args.append("--use-tp-pp-dp-mapping")
    args += _megatron_precision(job)
    if c.recompute == "selective":
        args += ["--recompute-granularity", "selective"]
        if tuple(job.recompute_modules) != ("core_attn",):
            args += ["--recompute-modules", *job.recompute_modules]
    if c.recompute == "full":  # every block its own checkpoint, as the analytic profile assumes
        per_chunk = max(1, max(blocks))
        args += ["--recompute-granularity", "full", "--recompute-method", "block",
                 "--recompute-num-layers", str(per_chunk)]
    return shlex.join(args), ""


def _megatron_precision(job: Job) -> list[str]:
    """FP8 (Transformer Engine's hybrid format), FP8 weights gathered in FP8, overlapped TP collectives."""
    out = ["--fp8-format", "hybrid"] if job.precision == "fp8" else []
    out += ["--fp8-param-gather"] if job.fp8_gather else []
    return out + (["--tp-comm-overlap"] if job.async_tp else [])


def _megatron_split(counts, blocks) -> list[str]:
    """Megatron-LM's split flags: even blocks; even with the embedding and the loss counted as a layer each;
    uneven first and last stages around even middle ones; else the layout string of every stage."""
    if len(set(blocks)) == 1:
        return []
    middle = set(blocks[1:-1])
    if len(middle) <= 1 and min(blocks[0], blocks[-1]) >= 1:
        return ["--decoder-first-pipeline-num-layers", str(blocks[0]),
                "--decoder-last-pipeline-num-layers", str(blocks[-1])]
    if len(set(counts)) == 1:
        return ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
    return ["--pipeline-model-parallel-layout", megatron_layout(blocks)]


def megatron_layout(blocks: list[int]) -> str:
    """'Et*7|t*8|...|t*7L': Megatron-LM's layout string, stages in model (= virtual) order."""
    parts = [("t*%d" % b if b > 1 else "t" if b == 1 else "") for b in blocks]
    parts[0] = "E" + parts[0]
    parts[-1] = parts[-1] + "L"
    return "|".join(parts)


def torchtitan_options(c: ClusterCandidate, job: Job, csv_path: str | None) -> str:
    """torchtitan flags: parallel degrees, the schedule (our CSV when given, else its class), the split."""
    g, spec = c.config, job.spec
    cuts = list(accumulate(block_counts(c.candidate.counts)))[:-1]
    args = ["--parallelism.tensor_parallel_degree", str(c.t), "--parallelism.pipeline_parallel_degree", str(g.p)]
    if c.sharding == "hsdp":
        args += ["--parallelism.data_parallel_replicate_degree", str(g.dp // c.shard),
                 "--parallelism.data_parallel_shard_degree", str(c.shard)]
    else:
        args += [("--parallelism.data_parallel_shard_degree" if c.sharding in ("fsdp", "zero1") else
                  "--parallelism.data_parallel_replicate_degree"), str(g.dp)]
    args += ["--parallelism.pipeline_parallel_microbatch_size", str(g.mbs),
             "--training.local_batch_size", str(g.m * g.mbs), "--training.seq_len", str(spec.seq)]
    if c.ep > 1:
        args += ["--parallelism.expert_parallel_degree", str(c.ep)]
        if c.etp is not None and c.etp != c.t:
            args += ["--parallelism.expert_tensor_parallel_degree", str(c.etp)]
    if job.precision == "fp8":  # torchao Float8 linear layers
        args += ["--model.converters", "float8"]
        if job.fp8_gather:
            args.append("--float8.enable_fsdp_float8_all_gather")
    if job.async_tp:  # AsyncTP needs torch.compile
        args += ["--parallelism.enable_async_tensor_parallel", "--compile.enable"]
    if csv_path:
        args += ["--parallelism.pipeline_parallel_schedule_csv", csv_path]
    elif g.family in TORCHTITAN_SCHEDULES:
        args += ["--parallelism.pipeline_parallel_schedule", TORCHTITAN_SCHEDULES[g.family]]
    if cuts:
        names = [f"layers.{k}" if k < spec.layers else "norm" for k in cuts]  # a cut after the last block
        args += ["--parallelism.pipeline_parallel_split_points", ",".join(names)]
    args += ["--activation_checkpoint.mode", {"off": "none"}.get(c.recompute, c.recompute)]
    if c.recompute == "selective":  # operator-level: matrix multiplies kept, the attention core redone
        args += ["--activation_checkpoint.selective_ac_option", "op"]
    return shlex.join(args)


def deepspeed_config(c: ClusterCandidate, job: Job) -> str:
    """DeepSpeed's pipeline engine for the layout: its JSON config and the PipelineModule arguments."""
    g = c.config
    config = {"train_batch_size": job.global_batch, "train_micro_batch_size_per_gpu": g.mbs,
              "gradient_accumulation_steps": g.m, "bf16": {"enabled": True},
              "zero_optimization": {"stage": 1 if c.sharding == "zero1" else 0}}
    blocks = block_counts(c.candidate.counts)
    module = (f"PipelineModule(num_stages={g.p}, partition_method='uniform'"
              + (", activation_checkpoint_interval=1" if c.recompute == "full" else "") + ")")
    split = "" if len(set(blocks)) == 1 else f"; blocks per stage {'/'.join(map(str, blocks))} (E first, H last)"
    return f"{json.dumps(config, separators=(',', ':'))} {module}, tensor parallel {c.t}{split}"


def stagewise_command(c: ClusterCandidate, job: Job, csv_path: str | None) -> str:
    """The layout as ``stagewise train --hf`` under torchrun on every node: the degrees (``-p``, ``--tp``, the
    data-parallel ranks as ``--dp`` replicas, ``--fsdp`` shards or both for HSDP, ``--zero 1``), the schedule
    (its CSV when it round-trips, else the family, ``-m``, ``-v``) and the split as layout text over the HF
    layers (E, t per block, N, H)."""
    g, spec, hw = c.config, job.spec, job.hardware
    blocks = block_counts(c.candidate.counts)
    pieces = [f"t*{b}" if b else "" for b in blocks]
    pieces[0] = "+".join(x for x in ("E", pieces[0]) if x)
    pieces[-1] = "+".join(x for x in (pieces[-1], "N", "H") if x)
    args = ["torchrun", f"--nnodes={max(1, job.gpus // hw.gpus_per_node)}",
            f"--nproc-per-node={min(job.gpus, hw.gpus_per_node)}", "-m", "stagewise", "train",
            "--hf", "MODEL_FOLDER", "--data", "TEXT_FILE"]
    args += ["--csv", csv_path] if csv_path else ["--schedule", g.family, "-m", str(g.m), "-v", str(g.v)]
    args += ["-p", str(g.p), "--tp", str(c.t)]
    if c.sharding in ("fsdp", "hsdp"):
        shards = (c.shard or g.dp) if c.sharding == "hsdp" else g.dp
        args += ["--dp", str(g.dp // shards), "--fsdp", str(shards)]
    else:
        args += ["--dp", str(g.dp)] + (["--zero", "1"] if c.sharding == "zero1" and g.dp > 1 else [])
    args += ["--batch", str(g.m * g.mbs * g.dp), "--seq", str(spec.seq), "--split", " | ".join(pieces)]
    if c.recompute == "full":
        args.append("--recompute")
    return shlex.join(args)


def commands(best: dict, job: Job, csv_path: str | None, winner: ClusterCandidate) -> dict:
    """framework name -> (its best ClusterCandidate, command or None, note) for each framework planned."""
    out = {}
    for name, c in best.items():
        csv = csv_path if c is winner or (csv_path and c.candidate.schedule is winner.candidate.schedule) else None
        if name == "megatron":
            cmd, note = megatron_options(c, job)
        elif name == "torchtitan":
            cmd, note = torchtitan_options(c, job, csv), ""
            if csv is None and c.config.family not in TORCHTITAN_SCHEDULES:
                note = (f"{c.config.family} is no torchtitan class: plan with --framework torchtitan to get its "
                        "order as the CSV")
        elif name == "deepspeed":
            cmd, note = deepspeed_config(c, job), ""
        else:
            cmd, note = stagewise_command(c, job, csv), ""
        out[name] = (c, cmd, note)
    return out
