"""A cluster plan's row: the simulated configuration with its layout, figures, bands and memory by kind."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ...parallelism import Parallelism
from ..search import Candidate, Config


class MemoryParts(NamedTuple):
    """What the fullest GPU holds at its peak, by kind (bytes)."""

    state: float  #: weights, gradients and optimizer state kept all step (sharded ones: this GPU's share)
    gathered: float  #: a sharded stage's bf16 weights and fp32 gradients while it is gathered (FSDP, HSDP)
    activations: float  #: the schedule's peak of in-flight micro-batches
    transient: float  #: a recomputed micro-batch's rebuilt activations, the block being replayed

    def to_dict(self) -> dict:
        return self._asdict()


@dataclass(frozen=True, kw_only=True)
class ClusterCandidate:
    """A simulated configuration with its layout and cluster figures."""

    #: the layout (``Parallelism.of_plan`` of the search's degrees): what every printed command and run is built from
    parallelism: Parallelism
    candidate: Candidate
    exposed_dp: float  #: seconds of gradient reduction not hidden behind the backward
    mfu: float  #: model FLOPs per second / (GPUs x peak)
    tokens_per_second: float
    #: what the blocks recompute: of ``RECOMPUTE`` (the profile's), or "stage" (the runtime's whole stage)
    recompute: str = "off"
    framework: str = "stagewise"  #: whose overlap rules it is costed under (``overlap.FRAMEWORKS``)
    #: of ``parallelism.SHARDINGS``: the mode searched (with one data rank ``parallelism.sharding`` reads ddp)
    sharding: str = "zero1"
    exposed_gather: float = 0.0  #: seconds the step waits for all-gathered weights
    usable: float = float("inf")  #: bytes per GPU the plan may fill (the memory less the reserve)
    band: float | None = None  #: relative half-width of the prediction's error band (None: unknown)
    #: a long step costed from ``mc`` and 2 mc micro-batches (``steady``); ``candidate.schedule`` is the 2 mc one
    costed_from: int | None = None
    ep_nodes: int = 1  #: nodes one expert-parallel group spans (1: its all-to-all stays inside a node)
    #: relative half-width of the memory prediction's band (the hardware file's ``memory_band``; None: unknown)
    memory_band: float | None = None
    fragmentation: float = 0.0  #: bytes the caching allocator holds beside the planned tensors (the reserve's)
    memory_parts: MemoryParts | None = None  #: the fullest GPU's bytes by kind
    expert_placement: str = "within"  #: the device order of an MoE layout (``expert_parallel.PLACEMENTS``)
    #: the step is the lowered program's (``lowered``: the data-parallel traffic played as actions); False: the
    #: O(stages) rules' of ``data_parallel``, the search's bound before a configuration is lowered
    lowered: bool = False
    slices: int = 1  #: sequence slices per micro-batch (Seq1F1B; ``config.m`` counts the m x slices units)
    offload: str = "none"  #: of ``long_sequence.OFFLOAD``: activations moved to host memory after each forward
    offloaded: float = 0.0  #: the most bytes one GPU keeps in host memory at once (``Prepared.offloaded``)

    @property
    def config(self) -> Config:
        return self.candidate.config

    @property
    def step_time(self) -> float:
        return self.candidate.step_time

    @property
    def fits(self) -> bool:
        return self.candidate.fits

    @property
    def headroom(self) -> float:
        """Bytes left on the fullest GPU under the usable memory."""
        return self.usable - max(self.candidate.memory)

    @property
    def reserved(self) -> float:
        """The allocator's predicted peak on the fullest GPU (what ``torch.cuda.max_memory_reserved`` reads):
        the planned tensors plus the fragmentation the hardware file's reserve sets aside."""
        return max(self.candidate.memory) + self.fragmentation

    @property
    def reserved_band(self) -> tuple[float, float] | None:
        """(least, most) the allocator's peak may be, by the memory band."""
        w = self.memory_band
        return None if w is None else (self.reserved * (1 - w), self.reserved * (1 + w))

    @property
    def step_band(self) -> tuple[float, float] | None:
        """(fastest, slowest) step the band allows."""
        w = self.band
        return None if w is None else (self.step_time * (1 - w), self.step_time * (1 + w))

    @property
    def mfu_band(self) -> tuple[float, float] | None:
        w = self.band
        return None if w is None else (self.mfu / (1 + w), self.mfu / (1 - w) if w < 1 else float("inf"))

    def sharding_label(self) -> str:
        """``zero1``, ``hsdp/4`` (HSDP with its shard group)."""
        return self.sharding + (f"/{self.parallelism.fsdp}" if self.sharding == "hsdp" else "")

    def label(self) -> str:
        par = self.parallelism
        ep = f" ep={par.expert_degree}" if par.expert_degree > 1 else ""
        if par.etp is not None:
            ep += f" etp={par.etp}"
        extra = (f" slices={self.slices}" if self.slices > 1 else "") + \
            (f" offload={self.offload}" if self.offload != "none" else "")
        return f"t={par.tp}{ep} {self.config.label()} recompute={self.recompute}{extra} {self.sharding_label()} " \
               f"({self.framework})"

    def to_dict(self) -> dict:
        band, par = self.step_band, self.parallelism
        return {"t": par.tp, "ep": par.expert_degree, "ep_nodes": self.ep_nodes, "etp": par.expert_tp,
                "expert_placement": self.expert_placement, **self.candidate.to_dict(), "parallelism": par.to_dict(),
                "recompute": self.recompute, "slices": self.slices, "offload": self.offload,
                "offloaded_bytes": self.offloaded, "framework": self.framework, "sharding": self.sharding,
                "shard": par.fsdp if self.sharding == "hsdp" else None,
                "exposed_dp": self.exposed_dp, "exposed_gather": self.exposed_gather, "lowered": self.lowered,
                "mfu": self.mfu,
                "tokens_per_second": self.tokens_per_second, "usable_memory": self.usable,
                "costed_from_microbatches": self.costed_from,
                "headroom": self.headroom, "band": self.band,
                "peak_memory_reserved": self.reserved, "memory_band": self.memory_band,
                "peak_memory_reserved_band": list(self.reserved_band) if self.reserved_band else None,
                "memory_parts": self.memory_parts.to_dict() if self.memory_parts else None,
                "step_time_band": list(band) if band else None,
                "mfu_band": list(self.mfu_band) if band else None}
