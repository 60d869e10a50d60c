"""A cluster-scale planning job: the model, the GPUs, the batch in tokens, and the rules it must meet.

The global batch is fixed in tokens, as in the papers: m x micro-batch size x dp
= global batch tokens / sequence length.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ... import limits
from .analytic import DEFAULT_MODULES, RECOMPUTE, Compute
from .data_parallel import state_factor
from .placement import PLACEMENTS
from ..errors import PlanError
from .hardware import Hardware, Reserve
from .long_sequence import OFFLOAD
from ...parallelism import SHARDINGS
from .overlap_rules import FRAMEWORKS, Framework
from ..search import Space
from .transformer import TransformerSpec

__all__ = ["Job", "check_job", "shardings", "state_factor", "tensor_degrees"]


@dataclass(frozen=True, kw_only=True)
class Job:
    """What to lay out and on what.

    Example:
        >>> job = Job(spec=TransformerSpec.load("llama3-8b"), hardware=Hardware.load("h100"), gpus=64,
        ...           global_batch_tokens=4 * 2**20)
        >>> job.global_batch
        512
    """

    spec: TransformerSpec
    hardware: Hardware
    gpus: int
    global_batch_tokens: int
    sequence_parallel: bool = True
    zero: bool = True  #: ZeRO-1: optimizer state sharded over dp (False: replicated, gradients all-reduced)
    tensor: tuple[int, ...] | None = None  #: t tried; None = every divisor of a node that the heads allow
    pipeline: tuple[int, ...] | None = None  #: p tried; None = every p that divides gpus / t
    micro_batch_sizes: tuple[int, ...] = (1, 2, 4)
    #: expert-parallel degrees tried for an MoE model; None = every one that divides the experts and dp
    expert: tuple[int, ...] | None = None
    #: recomputation tried, of ``analytic.RECOMPUTE`` ("off", "selective", "full"); it replaces space.recompute
    recompute: tuple[str, ...] = RECOMPUTE
    #: families and v searched (chunks None: every v that fits the layers)
    space: Space = field(default_factory=lambda: Space(chunks=None))
    #: the frameworks whose rules a layout is costed under (``overlap.FRAMEWORKS``), each with what it can run
    frameworks: tuple[Framework, ...] = tuple(FRAMEWORKS.values())
    #: data-parallel sharding tried, of ``parallelism.SHARDINGS`` (None: each framework's default; ``zero`` False: ddp)
    sharding: tuple[str, ...] | None = None
    hsdp_shards: tuple[int, ...] = (2, 4, 8, 16, 32, 64)  #: HSDP shard-group sizes tried (those that divide dp)
    reserve: Reserve | None = None  #: memory kept free per GPU (None: the hardware file's reserve)
    #: expert tensor-parallel degrees tried for an MoE model; None = t (as attention) and 1 (MoE parallel folding)
    expert_tensor: tuple[int, ...] | None = None
    #: device orders tried for an MoE model, of ``expert_parallel.PLACEMENTS``
    expert_placement: tuple[str, ...] = ("within", "across")
    precision: str = "bf16"  #: the linear layers' multiplies, of ``hardware.PRECISIONS``
    fp8_gather: bool = False  #: FP8 weights, all-gathered in FP8 (torchao Float8 FSDP2, Megatron --fp8-param-gather)
    async_tp: bool = False  #: tensor-parallel collectives overlapped with the multiplies (AsyncTP, --tp-comm-overlap)
    recompute_modules: tuple[str, ...] = DEFAULT_MODULES  #: what "selective" recomputes (``activations``)
    #: sequence slices per micro-batch tried (Seq1F1B, ``long_sequence``); (1,): whole micro-batches only
    slices: tuple[int, ...] = (1,)
    #: activation offload tried, of ``long_sequence.OFFLOAD`` (over the hardware file's ``host_bandwidth``)
    offload: tuple[str, ...] = ("none",)

    @property
    def global_batch(self) -> int:
        """Sequences per step."""
        return self.global_batch_tokens // self.spec.seq

    @property
    def usable(self) -> float:
        """Bytes per GPU a plan may fill: the GPU's memory less the reserve."""
        hw = self.hardware
        return hw.memory - (self.reserve if self.reserve is not None else hw.reserve).bytes(hw.memory)

    @property
    def memory_reserve(self) -> Reserve:
        return self.reserve if self.reserve is not None else self.hardware.reserve

    @property
    def compute(self) -> Compute:
        """The layers' precision and what selective recomputation drops."""
        return Compute(precision=self.precision, modules=self.recompute_modules)

    @property
    def linear_factor(self) -> float:
        """A linear layer's kept input as a fraction of its bf16 bytes (the hardware's FP8 factor)."""
        return self.hardware.fp8.activation_factor if self.precision == "fp8" else 1.0

    @property
    def weight_extra(self) -> float:
        """Bytes per bf16 parameter byte that FP8 adds to the state: the FP8 weight copies of FP8 compute
        (the hardware file's ``fp8.weight_bytes`` per parameter), or with FP8 weights gathered in FP8 the half
        of the bf16 weights they replace (-0.5)."""
        if self.fp8_gather:
            return -0.5
        return self.hardware.fp8.weight_bytes / 2 if self.precision == "fp8" else 0.0

    @property
    def gather_scale(self) -> float:
        """Bytes all-gathered per bf16 weight byte: halved when the weights are gathered in FP8."""
        return 0.5 if self.fp8_gather else 1.0


def shardings(job: Job, fw: Framework) -> tuple[str, ...]:
    """The data-parallel modes searched for ``fw``: the job's (those ``fw`` runs), else its default."""
    if job.sharding is not None:
        return tuple(m for m in job.sharding if m in fw.sharding)
    return ("ddp",) if not job.zero else fw.default_sharding


def tensor_degrees(job: Job) -> list[int]:
    """t that divide a node and the GPU count, and split the heads (and the KV heads, or replicate them)."""
    spec, node = job.spec, job.hardware.gpus_per_node
    cands = job.tensor or tuple(t for t in range(1, node + 1) if node % t == 0)
    return [t for t in cands if job.gpus % t == 0 and t <= node and spec.heads % t == 0
            and (spec.kv_heads % t == 0 or t % spec.kv_heads == 0)]


def check_job(job: Job) -> None:
    """The rules a job must meet before anything is searched; each message names the value and the rule (the
    degrees tried by their ``Job`` argument in backticks, which the CLI says as its flag: `tensor` is --tp)."""
    seq = job.spec.seq
    if job.gpus < 1:
        raise PlanError(f"--gpus must be >= 1; got {job.gpus}")
    try:  # every divisor of the GPU count is a layout
        limits.GPUS.check(job.gpus, "--gpus")
    except limits.LimitError as e:
        raise PlanError(str(e)) from None

    if job.space.recompute != Space().recompute:
        raise PlanError("Job.space.recompute is not read at cluster scale; give Job.recompute "
                        f"(of {', '.join(RECOMPUTE)})")
    bad = [m for m in job.recompute if m not in RECOMPUTE]
    if bad or not job.recompute:
        raise PlanError(f"--recompute {','.join(job.recompute)}: each must be one of {', '.join(RECOMPUTE)}")
    bad = [m for m in job.sharding or () if m not in SHARDINGS]
    if bad or job.sharding == ():
        raise PlanError(f"--sharding {','.join(job.sharding)}: each must be one of {', '.join(SHARDINGS)}")
    if not job.frameworks:
        raise PlanError("--framework: give at least one framework")
    if not any(shardings(job, fw) for fw in job.frameworks):
        runs = "; ".join(f"{fw.name}: {', '.join(fw.sharding)}" for fw in job.frameworks)
        raise PlanError(f"--sharding {','.join(job.sharding or ())}: no framework asked for runs it ({runs})")
    if job.usable <= 0:
        raise PlanError(f"--memory-reserve {job.memory_reserve.describe(job.hardware.memory)} leaves nothing of "
                        f"--hardware {job.hardware.name}'s memory")
    if job.global_batch_tokens % seq:
        raise PlanError(f"--global-batch-tokens {job.global_batch_tokens} must be a multiple of the model's "
                        f"sequence length {seq} (whole sequences per step)")
    most = limits.MICROBATCHES.value * max(job.micro_batch_sizes) * job.gpus  # the fewest micro-batches possible
    if job.global_batch > most:
        raise PlanError(f"--global-batch-tokens {job.global_batch_tokens}: {job.global_batch} sequences of {seq} are "
                        f"more than {limits.MICROBATCHES.value} micro-batches of {max(job.micro_batch_sizes)} on each "
                        f"of {job.gpus} GPUs; set {limits.MICROBATCHES.env}=N to raise the limit")
    if job.expert is not None:
        if job.spec.moe is None:
            raise PlanError(f"`expert` {','.join(map(str, job.expert))}: {job.spec.name} has no experts (a model "
                            "file with an \"moe\" object has)")
        bad = [e for e in job.expert if not isinstance(e, int) or e < 1 or job.spec.moe.experts % e]
        if bad or not job.expert:
            raise PlanError(f"`expert` {bad[0] if bad else ''}: each expert-parallel degree must be >= 1 and divide "
                            f"the {job.spec.moe.experts} experts of {job.spec.name}")
    _check_precision(job)
    _check_long(job)
    degrees = tensor_degrees(job)
    if not degrees:
        node = job.hardware.gpus_per_node
        tried = f" with `tensor` {','.join(map(str, job.tensor))}" if job.tensor else ""
        raise PlanError(f"--gpus {job.gpus}{tried}: no tensor-parallel degree divides both the GPU count and a node "
                        f"of {node} GPUs while splitting {job.spec.heads} heads and {job.spec.kv_heads} KV heads")
    if job.pipeline is not None and not any(job.gpus % (t * p) == 0 for t in degrees for p in job.pipeline):
        raise PlanError(f"`pipeline` {','.join(map(str, job.pipeline))}: no pipeline degree divides --gpus {job.gpus} "
                        f"/ t for t in {', '.join(map(str, degrees))} (t x p x dp = --gpus)")


def _check_precision(job: Job) -> None:
    """``precision``, ``fp8_gather``, ``async_tp``, the recomputation modules and the expert layout options."""


    job.compute  # checks precision and modules (their messages name the options)
    hw = job.hardware
    if (job.precision == "fp8" or job.fp8_gather) and hw.fp8 is None:
        raise PlanError(f"--precision fp8: --hardware {hw.name} has no fp8 entry (the FP8 rate, its efficiency and "
                        "sources); give a hardware file with one, or plan in bf16")
    if job.fp8_gather and job.precision != "fp8":
        raise PlanError("--fp8-all-gather keeps the weights in FP8, which FP8 compute reads: give --precision fp8 too")
    if job.async_tp and not any(fw.async_tp for fw in job.frameworks):
        raise PlanError("--async-tp: none of the frameworks asked for overlaps tensor-parallel collectives with "
                        f"the multiplies ({', '.join(fw.name for fw in job.frameworks)}); Megatron-LM "
                        "(--tp-comm-overlap) and torchtitan (AsyncTP) do")
    bad = [x for x in job.expert_placement if x not in PLACEMENTS]
    if bad or not job.expert_placement:
        raise PlanError(f"--expert-placement {','.join(job.expert_placement)}: each must be one of "
                        f"{', '.join(PLACEMENTS)}")
    if job.expert_tensor is not None:
        if job.spec.moe is None:
            raise PlanError(f"`expert_tensor` {','.join(map(str, job.expert_tensor))}: {job.spec.name} has no experts")
        bad = [e for e in job.expert_tensor if not isinstance(e, int) or e < 1 or job.hardware.gpus_per_node % e]
        if bad or not job.expert_tensor:
            raise PlanError(f"`expert_tensor` {bad[0] if bad else ''}: each expert tensor-parallel degree must be >= 1 "
                            f"and divide a node of {job.hardware.gpus_per_node} GPUs")


def _check_long(job: Job) -> None:
    """``slices`` and ``offload``: whole slice counts that cut a sequence, known policies, a host link to offload
    over."""
    bad = [k for k in job.slices if not isinstance(k, int) or k < 1 or k > job.spec.seq]
    if bad or not job.slices:
        raise PlanError(f"--slices {','.join(map(str, job.slices))}: each must be a whole number from 1 to the "
                        f"sequence length {job.spec.seq}")
    bad = [x for x in job.offload if x not in OFFLOAD]
    if bad or not job.offload:
        raise PlanError(f"--offload {','.join(job.offload)}: each must be one of {', '.join(OFFLOAD)}")
    if "all" in job.offload and job.hardware.host_bandwidth is None:
        raise PlanError(f"--offload all: --hardware {job.hardware.name} gives no host_bandwidth (bytes/s each way "
                        "between a GPU and host memory); add it to the hardware file, or plan with --offload none")


def _nothing_to_search(job: Job, skipped: dict) -> str:
    B, N = job.global_batch, job.gpus
    why = "; ".join(f"{k} ({n}x)" for k, n in sorted(skipped.items(), key=lambda kn: -kn[1]))  # the most first
    sizes = "/".join(map(str, job.micro_batch_sizes))
    return (f"no configuration: --global-batch-tokens {job.global_batch_tokens} is {B} sequences of "
            f"{job.spec.seq}, and no t x p x dp = --gpus {N} with dp x micro-batch size ({sizes}) dividing {B} "
            f"fits and meets the schedules' rules (e.g. m >= p)" + (f"; skipped: {why}" if why else "")
            + "; give a larger batch (a multiple of the data-parallel degree) or fewer GPUs")
