"""A GPU type as the analytic planner sees it: peak rate, memory, links, and one efficiency factor.

Shipped entries (a100, h100, h200, b200) live in data/hardware/*.json with a
``sources`` object naming where every number comes from. ``efficiency`` is the
fraction of ``peak_flops`` that matrix multiplies reach; it is the only tuned
number, calibrated on at most one published row per GPU type
(benchmarks/bench_published.py --calibrate prints the value that matches it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .datafile import SpecError, number, read
from .profile import Link

FORMAT = "stagewise-hardware"


@dataclass(frozen=True, kw_only=True)
class Hardware:
    """One GPU type in nodes of ``gpus_per_node``.

    Example:
        >>> Hardware.load("h100").peak_flops
        989400000000000.0
    """

    name: str
    peak_flops: float  #: dense bf16 FLOP/s of one GPU
    memory: float  #: HBM bytes of one GPU
    memory_bandwidth: float  #: HBM bytes/s (what element-wise kernels are bound by)
    gpus_per_node: int
    intra: Link  #: GPU to GPU inside a node, one direction
    inter: Link  #: GPU to GPU across nodes (the GPU's own adapter), one direction
    efficiency: float  #: achievable fraction of peak_flops for matrix multiplies
    sources: dict = field(default_factory=dict, compare=False)

    @property
    def rate(self) -> float:
        """FLOP/s a matrix multiply achieves."""
        return self.peak_flops * self.efficiency

    @staticmethod
    def load(ref: str, option: str = "--hardware") -> "Hardware":
        """A shipped name (``h100``) or a path to a hardware JSON file."""
        data, where = read(ref, "hardware", option, FORMAT)
        return from_json(data, where)


def from_json(data: dict, where: str) -> Hardware:
    links = {}
    for key in ("intra", "inter"):
        raw = data.get(key)
        if not isinstance(raw, dict):
            raise SpecError(f"{where}: {key} must be an object {{\"bandwidth\": bytes/s, \"latency\": s}}; "
                            f"got {raw!r}")
        links[key] = Link(bandwidth=number(raw, "bandwidth", f"{where}: {key}"),
                          latency=number(raw, "latency", f"{where}: {key}", positive=False))
    return Hardware(name=str(data.get("name", where)), peak_flops=number(data, "peak_flops", where),
                    memory=number(data, "memory", where), memory_bandwidth=number(data, "memory_bandwidth", where),
                    gpus_per_node=number(data, "gpus_per_node", where, integer=True),
                    efficiency=number(data, "efficiency", where, maximum=1.0), sources=dict(data.get("sources") or {}),
                    **links)
