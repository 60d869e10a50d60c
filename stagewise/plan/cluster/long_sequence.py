"""Long sequences: sequence slices (Seq1F1B) and activation offload (PipeOffload) as options of the cluster search.

Slices (Sun et al., Seq1F1B, NAACL 2025, arXiv:2406.03488): each micro-batch is cut into k sequence slices that
flow through the pipeline as units (``Schedule.slices``' units: m k of them). The cut is Seq1F1B's
computation-wise one (a later slice attends to more keys, so it is shorter), so a unit costs 1/k of its
micro-batch's compute and keeps about 1/k of its activations: its own (the keys and values it attends to are the
earlier slices' own kept tensors, held anyway until their backwards, which run after its backward). On a stage a
micro-batch's first backward (its last slice's) waits for all k of its forwards, so 1F1B's warm-up of p - r
micro-batches on rank r becomes p - r + k - 1 units: rank 0 holds (p + k - 1) / k micro-batches' worth where
1F1B holds p (the paper's Sec. 3: the first stage's activations fall to (p + k - 1) / (k p) of 1F1B's). The step
is played as 1F1B over the m k units (bubble (p - 1) / (m k + p - 1)), which the order of Seq1F1B's backwards
within a micro-batch does not lengthen in the steady state; ``sliced_holding`` raises the holding by k - 1 units.

Offload (Wan et al., PipeOffload, ICML 2025, arXiv:2503.01328): after a unit's forward its rank copies what the
unit keeps to host memory over the GPU's PCIe link (``Hardware.host_bandwidth``, each direction at once) on its
own stream, and copies it back before the unit's backward (SPEC: OFFLOAD after F, RELOAD before B). A rank then
holds at most two units' activations, the one just made while it streams out and the one streamed back for the
next backward, instead of its in-flight count (``offloaded_holding``); a rank that holds two or fewer (1F1B's last
stage) offloads nothing. The link carries each offloaded unit's bytes out and back once; where that takes longer
than the rank's compute of its units, the difference is exposed (``offload_exposure``), as the paper's condition
for a free offload says (transfer time at most the compute between a forward and its backward). The node's host
memory (``Hardware.host_memory``) holds what its GPUs offload (``offloaded_bytes``); a plan that needs more does
not fit.
"""

from __future__ import annotations

from dataclasses import replace

from ..search import Holding, Profile, peak_activation_bytes

#: the offload policies searched: none, or every unit of a rank that holds more than two (``offloaded_holding``)
OFFLOAD = ("none", "all")
#: the families sequence slices are planned for: Seq1F1B is 1F1B over slices
SLICED_FAMILIES = ("1f1b",)
#: what each framework can run of the two options (said beside its command; ``notes``)
SLICES_NOTE = {
    "megatron": "Megatron-LM has no sequence-slice pipeline schedule (Seq1F1B's code is a fork of it)",
    "torchtitan": "torchtitan has no sequence-slice pipeline schedule",
    "deepspeed": "DeepSpeed's pipeline engine has no sequence-slice schedule",
}
OFFLOAD_NOTE = {
    "torchtitan": "torchtitan has no activation offload (its activation-checkpoint modes only recompute)",
    "deepspeed": "DeepSpeed offloads no saved activations (activation_checkpointing.cpu_checkpointing moves only "
                 "checkpointed block inputs, with partition_activations)",
}
#: Megatron-Core's fine-grained activation offloading (Megatron-LM d98e8a6, TransformerConfig
#: ``fine_grained_activation_offloading`` / ``offload_modules``; docs/user-guide/features/
#: fine_grained_activation_offloading.md): the inputs of these modules go to host memory. Its layer-wise
#: ``--cpu-offloading-num-layers`` refuses pipeline parallelism (TransformerConfig.__post_init__).
MEGATRON_OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm")
MEGATRON_MOE_OFFLOAD_MODULES = ("expert_fc1", "moe_act")


def sliced_profile(profile: Profile, k: int) -> Profile:
    """``profile`` with each micro-batch cost and size for one of its k equal-cost slices (1/k of each)."""
    if k == 1:
        return profile
    per = ("t_f", "t_b", "t_i", "t_w", "activation_bytes", "input_bytes", "output_bytes", "a2a", "a2a_b")
    layers = tuple(replace(x, **{n: tuple(v / k for v in getattr(x, n)) for n in per}) for x in profile.layers)
    return replace(profile, layers=layers, meta={**profile.meta, "slices": k})


def sliced_holding(h: Holding, k: int, units: int) -> Holding:
    """A 1F1B holding of ``units`` units with each rank's in-flight count raised by k - 1 (Seq1F1B's warm-up)."""
    if k == 1:
        return h
    live = tuple(tuple(tuple(min(n + k - 1, units) for n in vec) for vec in vecs) for vecs in h.live)
    return replace(h, live=live)


def offloading_ranks(h: Holding) -> tuple[bool, ...]:
    """Per rank, whether it offloads: it holds more than two units at its peak."""
    return tuple(max((sum(v) for v in vecs), default=0) > 2 for vecs in h.live)


def offloaded_holding(h: Holding) -> Holding:
    """``h`` with an offloading rank's peak counts scaled to two units in all (the same mix of its stages)."""
    live = tuple(tuple(tuple(n * 2 / sum(v) for n in v) if sum(v) > 2 else v for v in vecs)
                 for vecs in h.live)
    return replace(h, live=live)


def offload_exposure(h: Holding, offloads: tuple[bool, ...], sc, units: int, bandwidth: float) -> float:
    """Seconds the busiest offloading rank's host link adds to the step: each unit's kept bytes go out and come
    back once (the two directions at once), hidden behind that rank's forwards and backwards of the same units."""
    worst = 0.0
    for r, stages in enumerate(h.rank_stages):
        if not offloads[r]:
            continue
        moved = sum(units * h.stage_share[s] * sc.activation_bytes[s] for s in stages) / bandwidth
        busy = sum(units * h.stage_share[s] * (sc.f[s] + sc.b[s]) for s in stages)
        worst = max(worst, moved - busy)
    return worst


def offloaded_bytes(kept: Holding, held: Holding, activation_bytes) -> float:
    """The most bytes one GPU has in host memory at once: what its rank would hold (``kept``, before offload)
    less what it holds (``held``)."""
    before, after = peak_activation_bytes(kept, activation_bytes), peak_activation_bytes(held, activation_bytes)
    return max((b - a for b, a in zip(before, after)), default=0.0)


def megatron_offload_flags(moe: bool) -> list[str]:
    """Megatron-LM's flags for fine-grained activation offloading of every module it can offload."""
    return ["--fine-grained-activation-offloading", "--offload-modules", *MEGATRON_OFFLOAD_MODULES,
            *(MEGATRON_MOE_OFFLOAD_MODULES if moe else ())]


#: the Transformer Engine setting Megatron-LM asserts with fine-grained offload (megatron/training/arguments.py)
MEGATRON_OFFLOAD_ENV = "NVTE_CPU_OFFLOAD_V1=1"


def option_commands(slices: int, offload: str, moe: bool) -> dict:
    """For the options a plan uses: {option: {framework: (flags or None, note)}}; empty for neither.

    Megatron-LM offloads by module (its inputs), not every saved tensor, so its line says what stays."""
    out: dict = {}
    if offload != "none":
        kept = "a dense MLP's hidden tensors" + (" and the routed experts' second multiply's input" if moe else "")
        out["offload"] = {
            "megatron": (" ".join(megatron_offload_flags(moe)),
                         f"{MEGATRON_OFFLOAD_ENV} in the environment with Transformer Engine >= 2.10; it offloads these "
                         f"modules' inputs only ({kept} stay on the GPU), so it holds more than this plan's row; "
                         "--cpu-offloading-num-layers refuses pipeline parallelism"),
            "torchtitan": (None, OFFLOAD_NOTE["torchtitan"]),
            "deepspeed": (None, OFFLOAD_NOTE["deepspeed"]),
            "stagewise": ("--offload all", "OFFLOAD and RELOAD actions placed into the schedule "
                                           "(stagewise.memory_actions); every saved activation but the stage's input "
                                           "and output moves"),
        }
    if slices > 1:
        out["slices"] = {**{name: (None, note) for name, note in SLICES_NOTE.items()},
                         "stagewise": (f"--schedule seq1f1b --slices {slices}",
                                       "Seq1F1B over the slices; not with --offload or --recompute")}
    return out
