"""A cluster plan as the options of the frameworks that run such jobs: Megatron-LM, torchtitan, DeepSpeed, stagewise.

Each framework's best layout (``cluster_search``'s ``Result.best``) becomes its own command, rendered from
the candidate's ``Parallelism`` (``ClusterCandidate.parallelism``: the planner's t, sharding and shard said
once, by ``Parallelism.of_plan``). Every line is written for a named version of its framework and checked by
that framework's own parser in the tests (``VERSIONS``):

- Megatron-LM (``pretrain_gpt.py``): 1F1B and its interleaved schedule, the model file's shape in its flags
  (``megatron_model``: what its ``validate_args`` requires, and what it would otherwise default to another
  model), on its synthetic data at the model's vocabulary (the note says what to add). The split is said the way Megatron
  builds it: even, even with the embedding and the loss counted as a layer each, uneven first and last
  *pipeline ranks* (``--decoder-first/last-pipeline-num-layers`` count every chunk of that rank), or the
  ``--pipeline-model-parallel-layout`` string of every stage (``E`` the embedding, ``t`` a block, ``L`` the
  loss with the output layer; stages in virtual order, stage s on rank s mod p).
- torchtitan (its ``ConfigManager``, tyro flags): its schedule classes by name, or our compute-only CSV
  (``_PipelineScheduleRuntime``; the class name then only says where the stages go: looped or V), the
  planned stages as ``--parallelism.module-fqns-per-model-part``, the ``activation-checkpoint:`` subcommand,
  and ``--training.disable-cuda-graphs`` under pipelining (its CUDA graphs do not run pipelines).
- DeepSpeed: its JSON config (a batch that passes its assertion, ``train_batch_size`` = micro-batch x
  accumulation x data-parallel ranks) and a ``PipelineModule`` with a ``PipeModelDataParallelTopology``.
- stagewise: ``stagewise train --hf`` under torchrun on every node (``stagewise_train_argv``): every option
  the plan assumed and nothing it did not.

``refusal`` is the one home of what a framework cannot express for a layout; the search offers no such row
for that framework (``cluster_search``) and the plan says why. Layer counts here are transformer blocks; the
embedding rides with the first stage and the head with the last.
"""

from __future__ import annotations

import json
import shlex
from itertools import groupby

from ...split import format_layout
from .candidate import ClusterCandidate
from .job import Job
from .overlap_rules import refusal

#: the framework versions the printed lines are written for and tested against (tests/test_plan_frameworks.py)
VERSIONS = {"megatron": "Megatron-LM d98e8a6 (2026-08-22)", "torchtitan": "torchtitan 0.3.0",
            "deepspeed": "DeepSpeed 0.19.8", "stagewise": "this stagewise"}
MEGATRON_SCHEDULES = ("1f1b", "interleaved-1f1b")
#: torchtitan's schedule classes by our family names (``--parallelism.pipeline-parallel-schedule``)
TORCHTITAN_SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B",
                        "looped-bfs": "LoopedBFS", "zb-v": "ZBVZeroBubble", "dualpipe-v": "DualPipeV"}
#: torchtitan's ``--module``/``--config`` of the shipped models it has (others print MODULE and CONFIG)
TORCHTITAN_MODELS = {"llama3-8b": ("llama3", "llama3_8b"), "llama3-70b": ("llama3", "llama3_70b"),
                     "llama3-405b": ("llama3", "llama3_405b"), "deepseek-v3": ("deepseek_v3", "deepseek_v3_671b")}
#: the dtype every plan is costed in (the analytic profile's bf16 weights and activations)
DTYPE = "bfloat16"


def block_counts(counts: tuple[int, ...]) -> list[int]:
    """Blocks per piece: the analytic profile's counts less the embedding (first) and head (last)."""
    out = list(counts)
    out[0] -= 1
    out[-1] -= 1
    return out


# ---- Megatron-LM


def megatron_options(c: ClusterCandidate, job: Job) -> tuple[str | None, str]:
    """(Megatron-LM flags, note); None when Megatron-LM has no such schedule or layout."""
    g, spec, par = c.config, job.spec, c.parallelism
    if g.family not in MEGATRON_SCHEDULES:
        return None, f"Megatron-LM runs 1F1B and interleaved 1F1B, not {g.family}"
    why = refusal("megatron", par, family=g.family, v=g.v)
    if why:
        return None, why
    blocks = block_counts(c.candidate.counts)
    args = [*megatron_model(spec), "--tensor-model-parallel-size", str(par.tp),
            "--pipeline-model-parallel-size", str(par.pp), "--micro-batch-size", str(g.mbs),
            "--global-batch-size", str(job.global_batch), "--bf16"]
    args += megatron_split(c.candidate.counts, g.p, g.v, spec.mtp_layers)
    if job.sequence_parallel and par.tp > 1:
        args.append("--sequence-parallel")
    if par.zero:
        args += ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"]
    elif par.data_shards > 1:
        args.append("--overlap-grad-reduce")
    if par.ep > 1:  # experts over ep x tp / etp GPUs of a stage, each cut over etp (MoE parallel folding)
        args += ["--expert-model-parallel-size", str(par.expert_degree)]
        if par.expert_tp != par.tp:
            args += ["--expert-tensor-parallel-size", str(par.expert_tp)]
        if c.expert_placement == "across":  # the pipeline inside a node, an expert group across nodes
            args.append("--use-tp-pp-dp-mapping")
    args += _megatron_precision(job)
    if c.recompute == "selective":
        args += ["--recompute-granularity", "selective"]
        if tuple(job.recompute_modules) != ("core_attn",):
            args += ["--recompute-modules", *job.recompute_modules]
    if c.recompute == "full":  # every block its own checkpoint, as the analytic profile assumes
        args += ["--recompute-granularity", "full", "--recompute-method", "block",
                 "--recompute-num-layers", str(max(1, max(blocks)))]
    env = ("CUDA_DEVICE_MAX_CONNECTIONS=1 in the environment (Megatron-LM requires it with tensor parallelism "
           "before Blackwell); ") if par.tp > 1 else ""
    return shlex.join(args), env + MEGATRON_NOTE


#: what a Megatron-LM line leaves to the user (the model file does not say it, or it is the user's data)
MEGATRON_NOTE = ("synthetic data (--mock-data, NullTokenizer): give --data-path and your tokenizer for text; add "
                 "your model's --position-embedding-type and --normalization (a model file does not say them)")


def megatron_model(spec) -> list[str]:
    """The model's shape in Megatron-LM's words (what its ``validate_args`` requires and what it would otherwise
    default to another shape): sizes, heads and query groups, the MLP kind, MLA, the experts and which blocks
    have them, sliding windows, MTP, the vocabulary (NullTokenizer over synthetic data), dropout."""
    args = ["--num-layers", str(spec.layers), "--hidden-size", str(spec.hidden), "--ffn-hidden-size", str(spec.ffn),
            "--num-attention-heads", str(spec.heads), "--seq-length", str(spec.seq),
            "--max-position-embeddings", str(spec.seq)]
    if spec.mla:
        m = spec.mla
        args += ["--multi-latent-attention", "--kv-lora-rank", str(m.kv_lora_rank), "--qk-head-dim",
                 str(m.qk_nope_head_dim), "--qk-pos-emb-head-dim", str(m.qk_rope_head_dim), "--v-head-dim",
                 str(m.v_head_dim), "--position-embedding-type", "rope"]  # MLA's keys carry rotary positions
        args += ["--q-lora-rank", str(m.q_lora_rank)] if m.q_lora_rank else []
    else:
        args += ["--kv-channels", str(spec.head_size)] if spec.head_size * spec.heads != spec.hidden else []
        args += ["--group-query-attention", "--num-query-groups", str(spec.kv_heads)] if spec.kv_heads < spec.heads \
            else []
    args += ["--swiglu"] if spec.mlp == "swiglu" else []
    args += [] if spec.tied_embeddings else ["--untie-embeddings-and-output-weights"]
    if spec.sliding_window is not None and spec.layer_types:
        args += ["--window-size", f"{spec.sliding_window - 1},0", "--window-attn-skip-freq",
                 megatron_pattern([int(spec.sliding(i)) for i in range(spec.layers)])]
    if spec.moe:
        args += _megatron_experts(spec)
    if spec.mtp_layers:  # Megatron-LM's MTP needs rotary positions
        args += ["--mtp-num-layers", str(spec.mtp_layers)]
        args += [] if spec.mla else ["--position-embedding-type", "rope"]
    if not spec.dropout:  # Megatron-LM's default 0.1 would keep masks the plan does not count
        args += ["--attention-dropout", "0", "--hidden-dropout", "0"]
    args.append("--disable-bias-linear")  # the plan counts no biases (and Megatron's MoE takes none with etp > 1)
    return args + ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(spec.vocab), "--mock-data"]


def _megatron_experts(spec) -> list[str]:
    """The MoE blocks: experts, top-k, an expert's width, shared experts, which blocks are MoE, capacity."""
    moe = spec.moe
    args = ["--num-experts", str(moe.experts), "--moe-router-topk", str(moe.top_k),
            "--moe-ffn-hidden-size", str(moe.expert_ffn)]
    if moe.shared_experts:
        args += ["--moe-shared-expert-intermediate-size", str(moe.shared_experts * moe.expert_ffn)]
    kinds = [int(spec.block_kind(i) == "m") for i in range(spec.layers)]
    args += ["--moe-layer-freq", megatron_pattern(kinds)] if not all(kinds) else []
    if moe.capacity_factor is not None:
        args += ["--moe-expert-capacity-factor", f"{moe.capacity_factor:g}"]
        args += ["--moe-pad-expert-input-to-capacity"] if moe.pad else []
    return args


def megatron_pattern(bits: list[int]) -> str:
    """A per-block 0/1 list as Megatron-LM's pattern expression, the shortest of: its period repeated
    ('[1,0]*12'), its runs ('[0]*3+[1]*58'), the list itself.

    >>> megatron_pattern([1, 0] * 3), megatron_pattern([0] * 3 + [1] * 58)[:12], megatron_pattern([0, 1, 0, 0])
    ('[1,0]*3', '[0]*3+[1]*58', '[0,1,0,0]')
    """
    n = len(bits)
    period = next(k for k in range(1, n + 1) if n % k == 0 and bits == bits[:k] * (n // k))
    forms = [f"[{','.join(map(str, bits))}]", "+".join(f"[{b}]*{len(list(g))}" for b, g in groupby(bits))]
    forms += [f"[{','.join(map(str, bits[:period]))}]*{n // period}"] if period < n else []
    return min(forms, key=len)


def _megatron_precision(job: Job) -> list[str]:
    """FP8 (Transformer Engine's hybrid format), FP8 weights gathered in FP8, overlapped TP collectives."""
    out = ["--fp8-format", "hybrid"] if job.precision == "fp8" else []
    out += ["--fp8-param-gather"] if job.fp8_gather else []
    return out + (["--tp-comm-overlap"] if job.async_tp else [])


def megatron_split(counts, p: int, v: int, mtp: int = 0) -> list[str]:
    """Megatron-LM's flags for these pieces (model order, stage s on rank s mod p, chunk s // p): even blocks;
    even with the embedding and the loss counted as a layer each; uneven first and last pipeline ranks around
    even middle ones (each rank's chunks equal); else the layout string of every stage (``mtp`` MTP modules
    with the loss, as the plan costs them with the head)."""
    blocks = block_counts(tuple(counts))
    vpp = ["--num-virtual-stages-per-pipeline-rank", str(v)] if v > 1 else []
    if p == 1 or len(set(blocks)) == 1:
        return vpp
    first, last, middle = blocks[0::p], blocks[p - 1::p], [b for r in range(1, p - 1) for b in blocks[r::p]]
    if len(set(first)) == 1 and len(set(last)) == 1 and len(set(middle)) <= 1 and first[0] and last[0]:
        return ["--decoder-first-pipeline-num-layers", str(sum(first)),
                "--decoder-last-pipeline-num-layers", str(sum(last))] + vpp
    if len(set(counts)) == 1:
        return ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"] + vpp
    return ["--pipeline-model-parallel-layout", megatron_layout(blocks, mtp)]  # the layout implies v


def megatron_layout(blocks: list[int], mtp: int = 0) -> str:
    """'Et*7|t*8|...|t*7L': Megatron-LM's layout string, stages in model (= virtual) order; its ``m`` are the MTP
    modules (Megatron-LM requires them in the layout, before the loss)."""
    parts = [("t*%d" % b if b > 1 else "t" if b == 1 else "") for b in blocks]
    parts[0] = "E" + parts[0]
    parts[-1] = parts[-1] + "m" * mtp + "L"
    return "|".join(parts)


# ---- torchtitan


def torchtitan_options(c: ClusterCandidate, job: Job, csv_path: str | None) -> tuple[str | None, str]:
    """(torchtitan flags, note): the degrees, the batch, the schedule (our CSV when given, else its class),
    the planned stages by module name, activation checkpointing; None when torchtitan cannot run it."""
    g, spec, par = c.config, job.spec, c.parallelism
    why = refusal("torchtitan", par, family=g.family, v=g.v, recompute=c.recompute)
    if why:
        return None, why
    schedule, note = _torchtitan_schedule(c, csv_path)
    if schedule is None and g.p > 1:
        return None, note
    module, config = TORCHTITAN_MODELS.get(spec.name, ("MODULE", "CONFIG"))
    if module == "MODULE":
        note = f"{spec.name} is no shipped torchtitan config: give its --module and --config"
    args = ["--module", module, "--config", config,
            "--parallelism.tensor-parallel-degree", str(par.tp), "--parallelism.pipeline-parallel-degree", str(par.pp),
            "--parallelism.data-parallel-replicate-degree", str(par.dp),
            "--parallelism.data-parallel-shard-degree", str(par.fsdp * par.ep)]  # its ep borrows from dp_shard
    if par.ep > 1:
        args += ["--parallelism.expert-parallel-degree", str(par.expert_degree)]
        if par.expert_tp != par.tp:
            args += ["--parallelism.expert-tensor-parallel-degree", str(par.expert_tp)]
    if job.precision == "fp8":  # torchao Float8 linear layers (with the all-gather in FP8 under FSDP2)
        args += ["--model.converters", "quantize.linear.float8"]
        if job.fp8_gather:
            args.append("--quantize.linear.float8.enable-fsdp-float8-all-gather")
    if job.async_tp:  # AsyncTP needs torch.compile
        args += ["--parallelism.enable-async-tensor-parallel", "--compile.enable"]
    if par.tp > 1 and not job.sequence_parallel:
        args.append("--parallelism.no-enable-sequence-parallel")
    args += ["--parallelism.pipeline-parallel-microbatch-size", str(g.mbs),
             "--training.local-batch-size", str(g.m * g.mbs), "--training.global-batch-size", str(job.global_batch),
             "--training.seq-len", str(spec.seq)]
    if g.p > 1:
        args += schedule + ["--parallelism.module-fqns-per-model-part", *torchtitan_parts(c.candidate.counts),
                            "--training.disable-cuda-graphs"]
    args.append("activation-checkpoint:" + {"off": "none", "full": "full"}[c.recompute])  # refusal: no other
    return shlex.join(args), note


def _torchtitan_schedule(c: ClusterCandidate, csv_path: str | None) -> tuple[list[str] | None, str]:
    """The schedule flags: the CSV with a class that places the stages as it does, or the family's class."""
    sched, g = c.candidate.schedule, c.config
    p, stages = sched.ranks, sched.stages
    loop = all(sched.placement[s] == s % p for s in range(stages))
    vee = stages == 2 * p and all(sched.placement[s] == (s if s < p else 2 * p - 1 - s) for s in range(stages))
    if csv_path:
        if not (loop or vee):
            return None, f"{g.family} places its stages neither looped nor in a V: torchtitan cannot place them"
        name = "ZBVZeroBubble" if vee and stages > p else ("Interleaved1F1B" if stages > p else "1F1B")
        return ["--parallelism.pipeline-parallel-schedule", name,
                "--parallelism.pipeline-parallel-schedule-csv", csv_path], ""
    if g.family in TORCHTITAN_SCHEDULES:
        return ["--parallelism.pipeline-parallel-schedule", TORCHTITAN_SCHEDULES[g.family]], ""
    return None, (f"{g.family} is no torchtitan class: plan with --framework torchtitan to get its order as the "
                  "CSV")


def torchtitan_parts(counts) -> list[str]:
    """Each stage's module names, comma-separated (tyro's list of lists): tok_embeddings with the first
    stage's blocks, norm and lm_head with the last's."""
    parts, k = [], 0
    blocks = block_counts(tuple(counts))
    for n, b in enumerate(blocks):
        names = [f"layers.{i}" for i in range(k, k + b)]
        k += b
        if n == 0:
            names.insert(0, "tok_embeddings")
        if n == len(blocks) - 1:
            names += ["norm", "lm_head"]
        parts.append(",".join(names))
    return parts


# ---- DeepSpeed


def deepspeed_config(c: ClusterCandidate, job: Job) -> str:
    """DeepSpeed's pipeline engine for the layout: its JSON config (the batch its assertion checks over the
    topology's data-parallel ranks) and the PipelineModule with its topology."""
    g, par = c.config, c.parallelism
    dp = par.data_shards  # the topology's data axis: every rank that takes different rows (ep is inside it)
    config = {"train_batch_size": g.m * g.mbs * dp, "train_micro_batch_size_per_gpu": g.mbs,
              "gradient_accumulation_steps": g.m, "bf16": {"enabled": True},
              "zero_optimization": {"stage": 1 if par.zero else 0}}
    counts, blocks = c.candidate.counts, block_counts(c.candidate.counts)
    method = "uniform" if len(set(counts)) == 1 else "type:DecoderLayer" if len(set(blocks)) == 1 else None
    topology = f"PipeModelDataParallelTopology(num_pp={par.pp}, num_mp={par.tp}, num_dp={dp})"
    module = (f"PipelineModule(layers, topology={topology}, partition_method='{method or 'uniform'}'"
              + (", activation_checkpoint_interval=1" if c.recompute == "full" else "") + ")")
    split = "" if method else (f"; blocks per stage {'/'.join(map(str, blocks))} (E first, H last): no "
                               "partition_method builds this split, set PipelineModule.parts to it")
    return f"{json.dumps(config, separators=(',', ':'))} {module}{split}"


# ---- stagewise


def stagewise_train_argv(c: ClusterCandidate, job: Job, csv_path: str | None = None) -> list[str]:
    """The ``stagewise train`` options that run ``c`` (after ``stagewise train``): the model and data
    placeholders, the schedule (its CSV when it round-trips, else the family and -v), -m, the degrees
    (``Parallelism.flags``), the batch, the sequence, the dtype the plan is costed in, the split as layout
    text over the HF layers (``stagewise_split``) and the whole-stage recomputation when planned."""
    g, spec, par = c.config, job.spec, c.parallelism
    args = ["--hf", "MODEL_FOLDER", "--data", "TEXT_FILE"]
    m = g.m // c.slices  # a sliced plan's m counts units: micro-batches x slices
    if c.slices > 1:  # Seq1F1B: 1F1B's order over the slices (its CSV is of units, which train reads as slices)
        args += ["--schedule", "seq1f1b", "--slices", str(c.slices)]
    else:
        args += ["--csv", csv_path] if csv_path else ["--schedule", g.family, "-v", str(g.v)]
    args += ["-m", str(m), *par.flags(), "--batch", str(m * g.mbs * par.data_shards), "--seq", str(spec.seq),
             "--dtype", DTYPE, "--split", stagewise_split(c.candidate.counts, spec)]
    if c.recompute == "stage":
        args.append("--recompute")
    if c.offload != "none":
        args += ["--offload", "all"]
    return args


def stagewise_split(counts, spec) -> str:
    """The split as layout text over the layers ``train --hf`` names: E, each block by its kind (``t`` dense,
    ``m`` MoE: the model file's rule, as the HF config's own says for its layers), N, H; the profile's head
    piece carries the final norm."""
    symbols = ["E", *(spec.block_kind(i) for i in range(spec.layers)), "N", "H"]
    return format_layout(symbols, [*counts[:-1], counts[-1] + 1])


def stagewise_command(c: ClusterCandidate, job: Job, csv_path: str | None = None) -> str:
    """``stagewise_train_argv`` under torchrun on every node, as one shell line."""
    hw = job.hardware
    nodes = max(1, job.gpus // hw.gpus_per_node)
    return shlex.join(["torchrun", f"--nnodes={nodes}", f"--nproc-per-node={min(job.gpus, hw.gpus_per_node)}",
                       "-m", "stagewise", "train", *stagewise_train_argv(c, job, csv_path)])


def stagewise_note(c: ClusterCandidate, job: Job) -> str:
    """What the stagewise runtime runs otherwise than the plan costs it (said beside its line)."""
    if c.parallelism.tp > 1 and job.sequence_parallel:
        return ("stagewise's tensor parallel keeps norms whole (no sequence parallelism): plan with "
                "--no-sequence-parallel for its activation memory")
    return ""


def commands(best: dict, job: Job, csv_path: str | None, winner: ClusterCandidate) -> dict:
    """framework name -> (its best ClusterCandidate, command or None, note) for each framework planned."""
    out = {}
    for name, c in best.items():
        csv = csv_path if c is winner or (csv_path and c.candidate.schedule is winner.candidate.schedule) else None
        if name == "megatron":
            cmd, note = megatron_options(c, job)
        elif name == "torchtitan":
            cmd, note = torchtitan_options(c, job, csv)
        elif name == "deepspeed":
            cmd, note = deepspeed_config(c, job), ""
        elif c.slices > 1 and (c.offload != "none" or c.recompute == "stage"):  # (only stagewise's rows slice)
            cmd, note = None, ("its `train` runs sequence slices without offload or whole-stage recomputation (a "
                               "slice's keys and values are read by the later slices' backwards)")
        else:
            cmd, note = stagewise_command(c, job, csv), stagewise_note(c, job)
        out[name] = (c, cmd, note)
    return out
