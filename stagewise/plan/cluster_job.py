"""A cluster-scale planning job: the model, the GPUs, the batch in tokens, and the rules it must meet.

The global batch is fixed in tokens, as in the papers: m x micro-batch size x dp
= global batch tokens / sequence length.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .analytic import RECOMPUTE
from .errors import PlanError
from .hardware import Hardware
from .search import Space
from .transformer import TransformerSpec


def state_factor(dp: int, zero: bool) -> float:
    """Bytes per bf16 parameter byte held on a GPU: weights (1) + fp32 gradients (2) + fp32 master
    weights and Adam's two moments (6), sharded over the dp replicas with ZeRO-1."""
    return 1 + 2 + 6 / (dp if zero else 1)


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
    space: Space = field(default_factory=lambda: Space(chunks=(2, 4, 8)))

    @property
    def global_batch(self) -> int:
        """Sequences per step."""
        return self.global_batch_tokens // self.spec.seq


def tensor_degrees(job: Job) -> list[int]:
    """t that divide a node and the GPU count, and split the heads (and the KV heads, or replicate them)."""
    spec, node = job.spec, job.hardware.gpus_per_node
    cands = job.tensor or tuple(t for t in range(1, node + 1) if node % t == 0)
    return [t for t in cands if job.gpus % t == 0 and t <= node and spec.heads % t == 0
            and (spec.kv_heads % t == 0 or t % spec.kv_heads == 0)]


def check_job(job: Job) -> None:
    """The rules a job must meet before anything is searched; each message names the value and the rule."""
    seq = job.spec.seq
    if job.gpus < 1:
        raise PlanError(f"--gpus must be >= 1; got {job.gpus}")
    if job.space.recompute != Space().recompute:
        raise PlanError("Job.space.recompute is not read at cluster scale; give Job.recompute "
                        f"(of {', '.join(RECOMPUTE)})")
    bad = [m for m in job.recompute if m not in RECOMPUTE]
    if bad or not job.recompute:
        raise PlanError(f"--recompute {','.join(job.recompute)}: each must be one of {', '.join(RECOMPUTE)}")
    if job.global_batch_tokens % seq:
        raise PlanError(f"--global-batch-tokens {job.global_batch_tokens} must be a multiple of the model's "
                        f"sequence length {seq} (whole sequences per step)")
    if job.expert is not None:
        if job.spec.moe is None:
            raise PlanError(f"--expert {','.join(map(str, job.expert))}: {job.spec.name} has no experts (a model "
                            "file with an \"moe\" object has)")
        bad = [e for e in job.expert if not isinstance(e, int) or e < 1 or job.spec.moe.experts % e]
        if bad or not job.expert:
            raise PlanError(f"--expert {bad[0] if bad else ''}: each expert-parallel degree must be >= 1 and divide "
                            f"the {job.spec.moe.experts} experts of {job.spec.name}")
    if not tensor_degrees(job):
        node = job.hardware.gpus_per_node
        tried = f" with --tensor {','.join(map(str, job.tensor))}" if job.tensor else ""
        raise PlanError(f"--gpus {job.gpus}{tried}: no tensor-parallel degree divides both the GPU count and a node "
                        f"of {node} GPUs while splitting {job.spec.heads} heads and {job.spec.kv_heads} KV heads")


def _nothing_to_search(job: Job, skipped: dict) -> str:
    B, N = job.global_batch, job.gpus
    why = "; ".join(f"{k} ({n}x)" for k, n in skipped.items())
    sizes = "/".join(map(str, job.micro_batch_sizes))
    return (f"no configuration: --global-batch-tokens {job.global_batch_tokens} is {B} sequences of "
            f"{job.spec.seq}, and no t x p x dp = --gpus {N} with dp x micro-batch size ({sizes}) dividing {B} "
            f"fits and meets the schedules' rules (e.g. m >= p)" + (f"; skipped: {why}" if why else "")
            + "; give a larger batch (a multiple of the data-parallel degree) or fewer GPUs")
