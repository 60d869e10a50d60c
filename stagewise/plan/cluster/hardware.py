"""A GPU type as the analytic planner sees it: peak rate, memory, links, and one efficiency factor.

Shipped entries (a100, h100, h200, b200) live in data/hardware/*.json with a
``sources`` object naming where every number comes from. ``efficiency`` is the
fraction of ``peak_flops`` that matrix multiplies reach; it is the only tuned
number, calibrated on at most one published row per GPU type
(benchmarks/bench_published.py --calibrate prints the value that matches it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ... import limits
from .datafile import SpecError, label, number, read, sources
from ..errors import PlanError
from ..search import Link

FORMAT = "stagewise-hardware"


@dataclass(frozen=True, kw_only=True)
class Reserve:
    """Bytes of a GPU that training cannot use: what a real run holds besides the planned tensors.

    Example:
        >>> Reserve(context=2**30, communication=2**31, fragmentation=0.05).bytes(80 * 2**30) / 2**30
        7.0
    """

    context: float = 0.0  #: bytes: the CUDA context, loaded kernels, library workspaces
    communication: float = 0.0  #: bytes: NCCL buffers of the rank's communicators
    fragmentation: float = 0.0  #: fraction of the memory the caching allocator cannot hand out

    def bytes(self, memory: float) -> float:
        return self.context + self.communication + self.fragmentation * memory

    def describe(self, memory: float) -> str:
        """'7 GiB (context 1 GiB + communication 2 GiB + fragmentation 5%)'."""
        from ..search import fmt_bytes

        parts = [f"{name} {fmt_bytes(v)}" for name, v in (("context", self.context),
                                                           ("communication", self.communication)) if v]
        if self.fragmentation:
            parts.append(f"fragmentation {self.fragmentation * 100:.3g}%")
        return fmt_bytes(self.bytes(memory)) + (f" ({' + '.join(parts)})" if parts else "")


@dataclass(frozen=True, kw_only=True)
class Fp8:
    """What FP8 training (Transformer Engine's recipes, torchao's Float8) changes on a GPU type: the linear
    layers' multiplies at the FP8 rate, their kept inputs as FP8 copies, and FP8 weight copies.

    Example:
        >>> f = Hardware.load("h100").fp8
        >>> f.peak_flops == 2 * Hardware.load("h100").peak_flops
        True
    """

    peak_flops: float  #: dense FP8 FLOP/s of one GPU
    efficiency: float  #: achievable fraction of ``peak_flops`` for the linear layers' FP8 multiplies
    activation_factor: float = 0.5  #: a linear layer's kept input, as a fraction of its bf16 bytes
    #: bytes per parameter of the FP8 weight copies kept for the step (a weight and its transpose); with the
    #: all-gather in FP8 the weights themselves are FP8 (1 byte) and nothing more is kept
    weight_bytes: float = 2.0

    @property
    def rate(self) -> float:
        return self.peak_flops * self.efficiency


#: the precisions a plan's linear layers may compute in (``--precision``)
PRECISIONS = ("bf16", "fp8")


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
    reserve: Reserve = field(default_factory=Reserve)  #: memory a run holds besides the planned tensors
    #: relative error band of a prediction (the published rows' calibration residuals); None: not calibrated
    band: float | None = None
    #: relative error band of a memory prediction (measured runs' and published rows' peaks); None: unknown
    memory_band: float | None = None
    fp8: Fp8 | None = None  #: FP8 training's rates and bytes; None: the GPU has no FP8 tensor cores
    #: the routed experts' grouped multiplies' rate relative to a dense multiply's (1: as fast)
    expert_efficiency: float = 1.0
    #: seconds a training step spends beyond its GPU work: ``step_fixed`` once a step (the framework's host work:
    #: the loss and norm reductions, logging, the data loader) and ``step_per_action`` per forward or backward
    #: a rank runs (kernel launches and each action's P2P set-up); where the pipeline barely fills they weigh most
    step_fixed: float = 0.0
    step_per_action: float = 0.0
    #: bytes/s one way between a GPU and host memory (its PCIe link): what offloaded activations move over, each
    #: direction at once; None: not given, so no plan offloads
    host_bandwidth: float | None = None
    #: bytes of host memory in a node: what its GPUs' offloaded activations must fit in; None: not checked
    host_memory: float | None = None

    def step_overhead(self, actions: int) -> float:
        """Seconds of host overhead of a step whose busiest rank runs ``actions`` forwards and backwards."""
        return self.step_fixed + self.step_per_action * actions
    sources: dict = field(default_factory=dict, compare=False)

    @property
    def rate(self) -> float:
        """FLOP/s a (bf16) matrix multiply achieves."""
        return self.peak_flops * self.efficiency

    def linear_rate(self, precision: str = "bf16") -> float:
        """FLOP/s of the linear layers' multiplies in ``precision`` (``PRECISIONS``)."""
        if precision == "bf16":
            return self.rate
        if self.fp8 is None:
            raise PlanError(f"--precision {precision}: --hardware {self.name} has no fp8 entry (FP8 tensor cores "
                            "with their rate and efficiency); plan in bf16 or give a hardware file with one")
        return self.fp8.rate

    @property
    def usable(self) -> float:
        """Bytes of one GPU a plan may fill: the memory less the reserve."""
        return self.memory - self.reserve.bytes(self.memory)

    @staticmethod
    def load(ref: str, option: str = "--hardware") -> "Hardware":
        """A shipped name (``h100``) or a path to a hardware JSON file."""
        data, where = read(ref, "hardware", option, FORMAT)
        return from_json(data, where)


#: physical ranges of the hardware fields (a GPU outside them is a typo, and its times would overflow)
RANGES = {"peak_flops": (1e9, 1e18, " FLOP/s"), "memory": (2.0**20, 2.0**50, " bytes"),
          "memory_bandwidth": (1e6, 1e15, " bytes/s"), "bandwidth": (1e6, 1e15, " bytes/s"),
          "host_bandwidth": (1e6, 1e15, " bytes/s"), "host_memory": (2.0**20, 2.0**60, " bytes"),
          "latency": (0.0, 1.0, " s")}


def _ranged(data: dict, key: str, where: str, **kw) -> float:
    low, high, unit = RANGES[key]
    return number(data, key, where, minimum=low or None, maximum=high, unit=unit, **kw)


#: a hardware file's fields (an unknown one is refused: a typo's value would be silently unused)
FIELDS = ("format", "version", "name", "description", "peak_flops", "memory", "memory_bandwidth", "gpus_per_node",
          "intra", "inter", "efficiency", "fp8", "step_overhead", "memory_band", "band", "reserve", "host_bandwidth", "host_memory", "sources")


def _known(raw: dict, fields, where: str) -> None:
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise SpecError(f"{where}: unknown field {unknown[0]!r}; the fields are {', '.join(fields)}")


def from_json(data: dict, where: str) -> Hardware:
    _known(data, FIELDS, where)
    links = {}
    for key in ("intra", "inter"):
        raw = data.get(key)
        if not isinstance(raw, dict):
            raise SpecError(f"{where}: {key} must be an object {{\"bandwidth\": bytes/s, \"latency\": s}}; "
                            f"got {str(raw)[:60]!r}")
        _known(raw, ("bandwidth", "latency"), f"{where}: {key}")
        links[key] = Link(bandwidth=_ranged(raw, "bandwidth", f"{where}: {key}"),
                          latency=_ranged(raw, "latency", f"{where}: {key}", positive=False))
    per_node = number(data, "gpus_per_node", where, integer=True)
    try:  # every divisor of a node is a tensor-parallel degree tried
        limits.GPUS.check(per_node, "", detail=f"{where}: gpus_per_node {per_node}")
    except limits.LimitError as e:
        raise SpecError(str(e)) from None
    memory = _ranged(data, "memory", where)
    band = number(data, "band", where, positive=False, maximum=1.0) if "band" in data else None
    mband = number(data, "memory_band", where, positive=False, maximum=1.0) if "memory_band" in data else None
    return Hardware(name=label(data, "name", where, where), peak_flops=_ranged(data, "peak_flops", where),
                    memory=memory, memory_bandwidth=_ranged(data, "memory_bandwidth", where),
                    gpus_per_node=per_node, efficiency=number(data, "efficiency", where, maximum=1.0),
                    reserve=_reserve(data, memory, where), band=band, memory_band=mband, fp8=_fp8(data, where),
                    host_bandwidth=_ranged(data, "host_bandwidth", where) if "host_bandwidth" in data else None,
                    host_memory=_ranged(data, "host_memory", where) if "host_memory" in data else None,
                    sources=sources(data, where), **_overhead(data, where), **links)


def _overhead(data: dict, where: str) -> dict:
    """The optional ``step_overhead`` object: ``fixed`` seconds a step, ``per_action`` seconds an action."""
    raw = data.get("step_overhead")
    if raw is None:
        return {}
    ctx = f"{where}: step_overhead"
    if not isinstance(raw, dict) or set(raw) - {"fixed", "per_action"}:
        raise SpecError(f"{ctx} must be an object {{\"fixed\": seconds, \"per_action\": seconds}}; "
                        f"got {str(raw)[:60]!r}")
    return {f"step_{k}": number(raw, k, ctx, positive=False, maximum=10.0) for k in ("fixed", "per_action") if k in raw}


def _fp8(data: dict, where: str) -> Fp8 | None:
    """The optional ``fp8`` object: peak FP8 FLOP/s, its efficiency, the kept-input and weight-copy bytes."""
    raw = data.get("fp8")
    if raw is None:
        return None
    ctx = f"{where}: fp8"
    if not isinstance(raw, dict):
        raise SpecError(f"{ctx} must be an object {{\"peak_flops\": FLOP/s, \"efficiency\": fraction, ...}}; "
                        f"got {str(raw)[:60]!r}")
    unknown = sorted(set(raw) - {"peak_flops", "efficiency", "activation_factor", "weight_bytes"})
    if unknown:
        raise SpecError(f"{ctx}: unknown field {unknown[0]!r}; the fields are peak_flops, efficiency, "
                        "activation_factor, weight_bytes")
    extra = {k: number(raw, k, ctx, positive=False, maximum=m) for k, m in (("activation_factor", 1.0),
                                                                           ("weight_bytes", 8.0)) if k in raw}
    return Fp8(peak_flops=_ranged(raw, "peak_flops", ctx), efficiency=number(raw, "efficiency", ctx, maximum=1.0),
               **extra)


def _reserve(data: dict, memory: float, where: str) -> Reserve:
    """The optional ``reserve`` object: context and communication bytes, fragmentation as a fraction."""
    raw = data.get("reserve", {})
    if not isinstance(raw, dict):
        raise SpecError(f"{where}: reserve must be an object {{\"context\": bytes, \"communication\": bytes, "
                        f"\"fragmentation\": fraction}}; got {str(raw)[:60]!r}")
    ctx = f"{where}: reserve"
    _known(raw, ("context", "communication", "fragmentation"), ctx)
    got = Reserve(**{k: number(raw, k, ctx, positive=False, maximum=memory if k != "fragmentation" else 0.5)
                     for k in ("context", "communication", "fragmentation") if k in raw})
    if got.bytes(memory) >= memory:
        raise SpecError(f"{ctx}: {got.describe(memory)} leaves nothing of the memory ({memory:g} bytes)")
    return got


def parse_reserve(text: str, memory: float, option: str = "--memory-reserve") -> Reserve:
    """``--memory-reserve``: a size ('6GiB', '0') or a percentage of the memory ('10%') kept free per GPU."""
    from ..search import parse_bytes

    raw = str(text).strip()
    if len(raw) > 32:
        raise PlanError(f"{option}: expected a size such as 6GiB or a percentage such as 10%; got {raw[:32]!r}...")
    if raw.endswith("%"):
        try:
            pct = float(raw[:-1])
        except ValueError:
            pct = float("nan")
        if not 0 <= pct < 100:
            raise PlanError(f"{option} {raw!r}: a percentage must be from 0 to below 100")
        return Reserve(fragmentation=pct / 100)
    got = Reserve() if raw in ("0", "0.0") else Reserve(context=parse_bytes(raw, option))
    if got.bytes(memory) >= memory:
        raise PlanError(f"{option} {raw}: leaves nothing of the GPU's {memory:g} bytes")
    return got
