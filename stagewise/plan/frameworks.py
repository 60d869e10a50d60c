"""A cluster plan as the options of the frameworks that run such jobs: Megatron-LM and torchtitan.

Megatron-LM (Megatron-Core's ``pretrain_gpt.py`` flags) runs 1F1B and its
interleaved schedule; uneven first and last stages are its
``--decoder-first/last-pipeline-num-layers``. torchtitan runs any schedule
from torch's compute-only CSV (``pipeline_parallel_schedule_csv``) and takes
the split as ``pipeline_parallel_split_points``. Layer counts here are
transformer blocks; the embedding rides with the first stage and the head
with the last, as in both frameworks.
"""

from __future__ import annotations

import shlex
from itertools import accumulate

from .cluster_search import ClusterCandidate, Job

MEGATRON_SCHEDULES = ("1f1b", "interleaved-1f1b")


def block_counts(counts: tuple[int, ...]) -> list[int]:
    """Blocks per piece: the analytic profile's counts less the embedding (first) and head (last)."""
    out = list(counts)
    out[0] -= 1
    out[-1] -= 1
    return out


def megatron_options(c: ClusterCandidate, job: Job) -> tuple[str | None, str]:
    """(Megatron-LM flags, note); None when Megatron-LM has no such schedule or split."""
    g, spec = c.config, job.spec
    if g.family not in MEGATRON_SCHEDULES:
        return None, f"Megatron-LM runs 1F1B and interleaved 1F1B, not {g.family}: use torchtitan with the CSV"
    blocks = block_counts(c.candidate.counts)
    args = ["--tensor-model-parallel-size", str(c.t), "--pipeline-model-parallel-size", str(g.p),
            "--micro-batch-size", str(g.mbs), "--global-batch-size", str(job.global_batch),
            "--seq-length", str(spec.seq)]
    if g.v > 1:
        args += ["--num-virtual-stages-per-pipeline-rank", str(g.v)]
    split, why = _megatron_split(c.candidate.counts, blocks)
    if split is None:
        return None, why
    args += split
    if job.sequence_parallel and c.t > 1:
        args.append("--sequence-parallel")
    if job.zero and g.dp > 1:
        args.append("--use-distributed-optimizer")
    if c.ep > 1:  # experts sharded over ep of the data-parallel ranks; expert tensor parallel = t
        args += ["--num-experts", str(spec.moe.experts), "--moe-router-topk", str(spec.moe.top_k),
                 "--expert-model-parallel-size", str(c.ep)]
    if c.recompute == "selective":
        args += ["--recompute-granularity", "selective"]
    if c.recompute == "full":  # every block its own checkpoint, as the analytic profile assumes
        per_chunk = max(1, max(blocks))
        args += ["--recompute-granularity", "full", "--recompute-method", "block",
                 "--recompute-num-layers", str(per_chunk)]
    return shlex.join(args), ""


def _megatron_split(counts, blocks) -> tuple[list[str] | None, str]:
    """Megatron-LM's split flags: even blocks, even with the embedding and the loss counted as a layer
    each, or uneven first and last stages around even middle ones."""
    if len(set(blocks)) == 1:
        return [], ""
    middle = set(blocks[1:-1])
    if len(middle) <= 1 and min(blocks[0], blocks[-1]) >= 1:
        return ["--decoder-first-pipeline-num-layers", str(blocks[0]),
                "--decoder-last-pipeline-num-layers", str(blocks[-1])], ""
    if len(set(counts)) == 1:
        return ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"], ""
    return None, f"Megatron-LM splits evenly or with uneven first and last stages; this split is {blocks}"


def torchtitan_options(c: ClusterCandidate, job: Job, csv_path: str | None) -> str:
    """torchtitan flags: parallel degrees, the schedule (as our CSV when it round-trips), the split."""
    g, spec = c.config, job.spec
    cuts = list(accumulate(block_counts(c.candidate.counts)))[:-1]
    args = ["--parallelism.tensor_parallel_degree", str(c.t), "--parallelism.pipeline_parallel_degree", str(g.p),
            ("--parallelism.data_parallel_shard_degree" if job.zero else
             "--parallelism.data_parallel_replicate_degree"), str(g.dp),
            "--parallelism.pipeline_parallel_microbatch_size", str(g.mbs),
            "--training.local_batch_size", str(g.m * g.mbs), "--training.seq_len", str(spec.seq)]
    if c.ep > 1:
        args += ["--parallelism.expert_parallel_degree", str(c.ep)]
    if csv_path:
        args += ["--parallelism.pipeline_parallel_schedule_csv", csv_path]
    if cuts:
        names = [f"layers.{k}" if k < spec.layers else "norm" for k in cuts]  # a cut after the last block
        args += ["--parallelism.pipeline_parallel_split_points", ",".join(names)]
    args += ["--activation_checkpoint.mode", {"off": "none"}.get(c.recompute, c.recompute)]
    if c.recompute == "selective":  # operator-level: matrix multiplies kept, the attention core redone
        args += ["--activation_checkpoint.selective_ac_option", "op"]
    return shlex.join(args)


def stagewise_command(c: ClusterCandidate, job: Job, csv_path: str | None) -> str:
    """The winner as ``stagewise train --hf`` under torchrun on every node: the degrees (``-p``, ``--tp``, ``--dp``
    with ``--zero 1`` as the plan assumes ZeRO-1, else replicated), the schedule (its CSV when it round-trips,
    else the family, ``-m``, ``-v``), the split as layout text over the HF layers (E, t per block, N, H)."""
    g, spec, hw = c.config, job.spec, job.hardware
    blocks = block_counts(c.candidate.counts)
    pieces = [f"t*{b}" if b else "" for b in blocks]
    pieces[0] = "+".join(x for x in ("E", pieces[0]) if x)
    pieces[-1] = "+".join(x for x in (pieces[-1], "N", "H") if x)
    args = ["torchrun", f"--nnodes={max(1, job.gpus // hw.gpus_per_node)}",
            f"--nproc-per-node={min(job.gpus, hw.gpus_per_node)}", "-m", "stagewise", "train",
            "--hf", "MODEL_FOLDER", "--data", "TEXT_FILE"]
    args += ["--csv", csv_path] if csv_path else ["--schedule", g.family, "-m", str(g.m), "-v", str(g.v)]
    args += ["-p", str(g.p), "--tp", str(c.t), "--dp", str(g.dp)] + (["--zero", "1"] if job.zero and g.dp > 1 else [])
    args += ["--batch", str(g.m * g.mbs * g.dp), "--seq", str(spec.seq), "--split", " | ".join(pieces)]
    if c.recompute == "full":
        args.append("--recompute")
    return shlex.join(args)
