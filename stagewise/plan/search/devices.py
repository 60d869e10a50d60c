"""The devices a plan runs on: how many, how they are grouped in nodes, memory and links.

Device numbering: pipeline ranks are consecutive (replica d's rank r is device
``d * p + r``), so a pipeline stays inside a node when it fits, and data-parallel
peers sit ``p`` devices apart. A link between two devices is the node-internal
one when both are in one node, the cross-node one otherwise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import PlanError
from .profile import Link

_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE_RE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*([a-z]*)\s*(?:/s)?\s*", re.I)


def parse_bytes(text: str, option: str) -> float:
    """'80GiB' -> 85899345920.0; '25GB/s' -> 25e9; a plain number is bytes."""
    m = _SIZE_RE.fullmatch(str(text))
    if not m or m[2].lower() not in _UNITS:
        raise PlanError(f"{option} {text!r}: expected a size such as 80GiB, 512MiB, 25GB or a number of bytes")
    value = float(m[1]) * _UNITS[m[2].lower()]
    if value <= 0:
        raise PlanError(f"{option} must be > 0; got {text!r}")
    return value


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """N devices in nodes of ``per_node``, each with ``memory`` bytes."""

    devices: int
    per_node: int
    memory: float | None  #: bytes per device; None = no limit
    intra: Link  #: between two devices of one node
    inter: Link  #: between nodes
    state_factor: float = 4.0  #: bytes kept per parameter byte: weights, grads, Adam's two moments (fp32)
    #: the same for routed experts' parameters (ZeRO-1 shards theirs over dp / ep peers); None: state_factor
    expert_state_factor: float | None = None

    def expert_surplus(self, expert_bytes: float) -> float:
        """What routed experts' parameter bytes keep beyond ``state_factor`` x them."""
        if self.expert_state_factor is None or not expert_bytes:
            return 0.0
        return expert_bytes * (self.expert_state_factor - self.state_factor)

    def __post_init__(self) -> None:
        if self.devices < 1:
            raise PlanError(f"--devices must be >= 1; got {self.devices}")
        if self.per_node < 1:
            raise PlanError(f"--per-node must be >= 1; got {self.per_node}")

    def layouts(self) -> list[tuple[int, int]]:
        """Every (p, dp) with p * dp = devices."""
        return [(p, self.devices // p) for p in range(1, self.devices + 1) if self.devices % p == 0]

    def link(self, p: int, dp: int, a: int, b: int) -> Link:
        """The slowest link between pipeline ranks a and b over all replicas."""
        node = self.per_node
        crosses = any((d * p + a) // node != (d * p + b) // node for d in range(dp))
        return self.inter if crosses else self.intra

    def small_allreduce(self, group: int, link: Link, nbytes: float = 0.0) -> float:
        """A ring all-reduce of ``nbytes`` among ``group`` ranks over ``link`` (the loss, a tied weight)."""
        if group < 2:
            return 0.0
        return 2 * (group - 1) * (link.latency + nbytes / group / link.bandwidth)
