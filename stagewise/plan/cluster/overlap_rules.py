"""What overlaps with what, by training framework: the rules a cluster plan is costed under.

A data-parallel step has four things besides the pipeline's compute: the gradient
reduction (all-reduce, or reduce-scatter when the optimizer state is sharded), the
all-gather of sharded weights, the optimizer step and the pipeline's point-to-point
messages. Frameworks schedule them differently, each as its documentation says (its
``Framework.source``): Megatron-LM reduce-scatters in buckets during the last backward and
gathers ahead of the next forwards; DeepSpeed reduces after the pipeline drains, gathers
after the optimizer step and blocks its senders; torchtitan (FSDP2 per block) and stagewise
reduce a stage after its last backward, FSDP2 gathering a block ahead (block by block again
for the backward without pipeline parallelism: ``Framework.per_block``), stagewise a stage
ahead. The optimizer step is exposed in all four (it needs the reduced gradients).

The rules are data: each ``Framework`` holds the lowering's ``Overlap``
(``lowering.FRAMEWORKS``, where they are written once) beside what it runs (families,
shardings, recomputation), replaced field by field for a variant (the Megatron-LM 2021 runs
of the published rows reduce without ZeRO).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...lowering.options import FRAMEWORKS as OVERLAPS, Overlap
from ...schedules import whole_names
from ...parallelism import SHARDINGS, Parallelism
from ..errors import PlanError

#: when FSDP frees each block after its forward (of torchtitan's ``--parallelism.fsdp_reshard_after_forward``
#: policies): never, or by default only without pipeline parallelism (its "always" under PP is not planned)
RESHARD_AFTER_FORWARD = ("never", "default")


@dataclass(frozen=True, kw_only=True)
class Framework:
    """One framework's overlap rules and what it can run.

    Example:
        >>> FRAMEWORKS["deepspeed"].overlap.reduce, FRAMEWORKS["megatron"].overlap.reduce
        ('drain', 'layer')
    """

    name: str  #: the --framework value
    title: str  #: as people write it
    families: tuple[str, ...] | None  #: the pipeline schedules it runs (None: any, through torch's CSV)
    sharding: tuple[str, ...]  #: of ``parallelism.SHARDINGS``, the data-parallel modes it runs
    default_sharding: tuple[str, ...]  #: searched unless the job names its own
    #: when reductions start, gathers are issued and whether sends block (``lowering.FRAMEWORKS[name]``)
    overlap: Overlap
    #: of RESHARD_AFTER_FORWARD: where FSDP runs block by block (``per_block``) instead of keeping a stage
    #: gathered for the step
    reshard_after_forward: str = "never"
    recompute: tuple[str, ...] = ("off", "selective", "full")  #: of analytic.RECOMPUTE
    #: "full" replays a whole stage in its backward (the stage's activations rebuilt at once), not block by block
    stage_recompute: bool = False
    #: overlaps tensor-parallel collectives with the multiplies (Megatron-LM --tp-comm-overlap, torchtitan AsyncTP)
    async_tp: bool = False
    #: the device orders it runs an MoE model's expert groups in (``expert_parallel.PLACEMENTS``)
    expert_placements: tuple[str, ...] = ("within",)
    source: str = ""

    def __post_init__(self) -> None:
        bad = ([x for x in self.sharding + self.default_sharding if x not in SHARDINGS]
               + [x for x in (self.reshard_after_forward,) if x not in RESHARD_AFTER_FORWARD])
        if bad:
            raise ValueError(f"Framework {self.name}: unknown rule {bad[0]!r}")

    def runs(self, family: str) -> bool:
        return self.families is None or family in self.families

    def per_block(self, p: int) -> bool:
        """Whether FSDP runs block by block at pipeline degree ``p``: each block gathered one ahead of its
        forward and freed after it, gathered again one ahead of its backward, its gradients reduce-scattered
        as every backward leaves it (FSDP2's own hooks, outside torch.distributed.pipelining; torchtitan's
        gradient accumulation leaves the gradient sync on, trainer.py ``train_step``). Else a stage stays
        gathered from its first forward to its last backward.

        >>> TORCHTITAN.per_block(1), TORCHTITAN.per_block(8), STAGEWISE.per_block(1)
        (True, False, False)
        """
        return self.reshard_after_forward == "default" and p == 1


MEGATRON = Framework(
    name="megatron", title="Megatron-LM", families=("1f1b", "interleaved-1f1b"), sharding=("zero1", "ddp"),
    default_sharding=("zero1",), overlap=OVERLAPS["megatron"], async_tp=True,
    expert_placements=("within", "across"),
    source="Megatron-LM --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather "
           "(docs/source/distrib_optimizer.md: reduce-scatter in buckets during the backward, all-gather "
           "overlapped with the next forward); P2P overlapped")
DEEPSPEED = Framework(
    name="deepspeed", title="DeepSpeed", families=("1f1b",), sharding=("zero1", "ddp"), default_sharding=("zero1",),
    overlap=OVERLAPS["deepspeed"], recompute=("off", "full"),
    source="DeepSpeed runtime/pipe/schedule.py TrainSchedule: ReduceTiedGrads, ReduceGrads, OptimizerStep after "
           "the last backward; SendActivation/SendGrad block the sender; ZeRO stage <= 1 with pipeline parallelism")
TORCHTITAN = Framework(
    name="torchtitan", title="torchtitan", families=tuple(f for f in whole_names() if f != "dualpipe"),
    sharding=("fsdp", "hsdp", "ddp"), default_sharding=("fsdp",), overlap=OVERLAPS["torchtitan"],
    recompute=("off", "full"), async_tp=True,
    reshard_after_forward="default",
    source="torchtitan: FSDP2 fully_shard per transformer block in each stage, reshard_after_forward = not "
           "pp_enabled (torchtitan/distributed/fsdp.py get_fsdp_reshard_after_forward_policy, 'default'; "
           "Dec 2024 parallelize_llama.apply_fsdp alike); torch.distributed.pipelining reduce-scatters a stage's gradients after its last backward; any "
           "family but DualPipe (two model copies) through torch's CSV; its selective activation checkpointing "
           "is per operator (every second matmul recomputed), not the attention core, so it is not searched")
STAGEWISE = Framework(
    name="stagewise", title="stagewise", families=None, sharding=("zero1", "ddp", "fsdp"),
    default_sharding=("zero1",), overlap=OVERLAPS["stagewise"], recompute=("off", "full"), stage_recompute=True, expert_placements=("across",),
    source="stagewise runtime: a stage's reduction starts at its last B or W; FSDP gathers a stage ahead of "
           "its first forward (one stage ahead) and reduce-scatters after its last backward")
FRAMEWORKS: dict[str, Framework] = {f.name: f for f in (MEGATRON, TORCHTITAN, DEEPSPEED, STAGEWISE)}


def framework(name: str) -> Framework:
    """The framework called ``name`` (``--framework``)."""
    try:
        return FRAMEWORKS[name]
    except KeyError:
        raise PlanError(f"--framework {name!r}: choose one of {', '.join(FRAMEWORKS)}") from None


# ---- what each framework cannot express


def refusal(framework: str, par: Parallelism, *, family: str | None = None, v: int = 1, recompute: str = "off",
            hf: bool = True) -> str | None:
    """Why ``framework`` cannot run this layout as planned (None: it can). The search offers no such row for
    that framework and the plan names the reason. ``hf``: stagewise runs a Hugging Face model (``--hf``)."""
    if par.pp == 1 and v > 1:
        return (f"v={v} on one pipeline stage: an interleaved schedule on one stage is gradient accumulation "
                "(plan it as p=1, v=1)")
    if framework == "stagewise":
        return par.unsupported() or (par.unsupported_by_hf() if hf else None)
    if framework == "torchtitan" and recompute == "selective":
        return ("torchtitan's selective activation checkpointing is per operator (every second matmul "
                "recomputed), not the attention core the plan costs")
    if framework == "torchtitan" and par.ep > 1 and par.fsdp == 1:
        return (f"torchtitan's expert parallel borrows its ranks from FSDP and TP (efsdp = dp_shard x tp / ep): "
                f"`ep` {par.ep} over replicated data-parallel ranks is not a torchtitan layout (plan --sharding "
                "fsdp)")
    return None
