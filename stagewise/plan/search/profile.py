"""A measured profile of a model: per-layer times and bytes, and the link between ranks.

Written by ``stagewise profile`` (stagewise.profiling.measure, which needs torch),
read by the planner with no torch at all. Times are seconds per layer for one
micro-batch of each measured size; bytes are per micro-batch too. Loading is
strict: a file that does not parse or lacks a field names the field and where.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ... import jsonout, limits
from ..errors import PlanError

FORMAT = "stagewise-profile"
VERSION = 1
#: per-layer lists with one value per micro-batch size
PER_SIZE = ("t_f", "t_b", "t_i", "t_w", "activation_bytes", "input_bytes", "output_bytes")
#: the largest time (seconds) and size (bytes) a profile may hold: a layer taking days, or more than an
#: exabyte, is no measurement, and sums of squares of such values overflow the partitioner's floats
MAX_SECONDS = 1e6
MAX_BYTES = 2.0**60


class ProfileError(PlanError):
    """A profile that cannot be read or lacks a field."""


#: the largest spread a profile holds (half-range over median): beyond it a band says nothing more, and
#: `profile` caps what it measured there (a repeat many times the median on a loaded machine)
MAX_SPREAD = 10.0

@dataclass(frozen=True, kw_only=True)
class LayerProfile:
    """One layer; each per-size tuple has one value per ``Profile.micro_batch_sizes``."""

    name: str
    symbol: str  #: letter used in layout strings: E embedding, t block, H head
    param_bytes: float
    t_f: tuple[float, ...]  #: forward (the head's includes the loss)
    t_b: tuple[float, ...]  #: full backward
    t_i: tuple[float, ...]  #: input-gradient part of the backward
    t_w: tuple[float, ...]  #: weight-gradient part
    activation_bytes: tuple[float, ...]  #: kept from F until the backward frees it
    input_bytes: tuple[float, ...]  #: what the layer receives (kept alone when recomputing)
    output_bytes: tuple[float, ...]  #: what it sends on when a stage boundary follows it
    t_opt: float = 0.0  #: optimizer step over the layer's parameters (once per step)
    #: per size, the measured spread of F + B over the timed repeats, relative to the median: half of
    #: (slowest - fastest) / median; empty in profiles made before it was measured (no band then)
    spread: tuple[float, ...] = ()
    #: expert-parallel all-to-all of a forward and of a backward (per size; empty: none), beside compute
    a2a: tuple[float, ...] = ()
    a2a_b: tuple[float, ...] = ()
    #: of ``param_bytes``, the routed experts' share held on this GPU (their optimizer state and gradients
    #: go over the data-parallel peers that hold the same experts, dp / ep of them)
    expert_param_bytes: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Link:
    """Point-to-point time between two ranks: latency + bytes / bandwidth (seconds, bytes/s)."""

    latency: float
    bandwidth: float
    samples: tuple[tuple[float, float], ...] = ()  #: measured (bytes, seconds) it was fitted to
    backend: str = ""

    def time(self, nbytes: float) -> float:
        return self.latency + nbytes / self.bandwidth


@dataclass(frozen=True, kw_only=True)
class Profile:
    """Everything the planner reads about a model on a device."""

    model: str
    device: str
    micro_batch_sizes: tuple[int, ...]
    layers: tuple[LayerProfile, ...]
    link: Link | None = None
    #: layers that share a parameter (a tied embedding and head): (layer indices, bytes shared)
    tied: tuple[tuple[tuple[int, ...], float], ...] = ()
    meta: dict = field(default_factory=dict, compare=False)  #: dtype, threads, command, torch version

    @property
    def symbols(self) -> tuple[str, ...]:
        return tuple(layer.symbol for layer in self.layers)

    def size_index(self, micro_batch_size: int) -> int:
        try:
            return self.micro_batch_sizes.index(micro_batch_size)
        except ValueError:
            raise ProfileError(f"micro-batch size {micro_batch_size} was not profiled; the profile has "
                               f"{', '.join(map(str, self.micro_batch_sizes))}") from None

    def to_json(self) -> dict:
        d = asdict(self)
        return {"format": FORMAT, "version": VERSION, **d}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(jsonout.dumps(self.to_json(), indent=1) + "\n")

    @staticmethod
    def load(path: str | Path) -> "Profile":
        path = Path(path)
        try:
            text = limits.read_text(path, "--profile")
        except limits.LimitError as e:
            raise ProfileError(str(e)) from None
        return Profile.loads(text, str(path))

    @staticmethod
    def loads(text: str, where: str = "profile") -> "Profile":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ProfileError(f"--profile {where}: not JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
        except RecursionError:
            raise ProfileError(f"--profile {where}: not JSON this reader accepts: nested too deeply") from None
        except ValueError:  # int() refuses more than 4,300 digits
            raise ProfileError(f"--profile {where}: not JSON this reader accepts: a number of more than "
                               f"{sys.get_int_max_str_digits()} digits") from None
        try:
            return from_json(data, where)
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as e:
            if isinstance(e, ProfileError):
                raise
            raise ProfileError(f"--profile {where}: not a valid profile ({type(e).__name__}: {str(e)[:120]}); "
                               "make one with `stagewise profile`") from None


def from_json(data, where: str = "profile") -> Profile:
    """A Profile from parsed JSON; every missing or malformed field is named."""
    ctx = f"--profile {where}"
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ProfileError(f"{ctx}: not a stagewise profile (no \"format\": \"{FORMAT}\"); make one with "
                           "`stagewise profile`")
    if data.get("version") != VERSION:
        raise ProfileError(f"{ctx}: version {data.get('version')!r}; this stagewise reads version {VERSION}")
    sizes = _get(data, "micro_batch_sizes", list, ctx)
    if not sizes or any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in sizes):
        raise ProfileError(f"{ctx}: micro_batch_sizes must be a non-empty list of whole numbers >= 1; got "
                           f"{str(sizes)[:80]}")
    if len(set(sizes)) != len(sizes):
        twice = next(b for b in sizes if sizes.count(b) > 1)
        raise ProfileError(f"{ctx}: micro_batch_sizes lists {twice} more than once; each size is measured once")
    raw_layers = _get(data, "layers", list, ctx)
    if not raw_layers:
        raise ProfileError(f"{ctx}: layers is empty")
    try:
        limits.LAYERS.check(len(raw_layers), "", detail=f"{ctx}: {len(raw_layers)} layers")
        limits.MICROBATCHES.check(max(sizes), "", detail=f"{ctx}: micro-batch size {max(sizes)}")
    except limits.LimitError as e:
        raise ProfileError(str(e)) from None
    layers = tuple(_layer(x, k, len(sizes), ctx) for k, x in enumerate(raw_layers))
    link = None
    if data.get("link") is not None:
        raw = _get(data, "link", dict, ctx)
        lat = _number(raw, "latency", f"{ctx}: link", MAX_SECONDS)
        bw = _number(raw, "bandwidth", f"{ctx}: link", MAX_BYTES)
        if bw <= 0:
            raise ProfileError(f"{ctx}: link.bandwidth must be > 0; got {bw}")
        link = Link(latency=lat, bandwidth=bw, samples=tuple(tuple(s) for s in raw.get("samples", ())),
                    backend=str(raw.get("backend", "")))
    tied = tuple(_tied(x, len(layers), ctx) for x in data.get("tied") or ())
    meta = data.get("meta") or {}
    if not isinstance(meta, dict):
        raise ProfileError(f"{ctx}: meta must be an object; got {type(meta).__name__}")
    _check_overhead(meta.get("step_overhead"), ctx)
    return Profile(model=str(data.get("model", "?")), device=str(data.get("device", "?")),
                   micro_batch_sizes=tuple(sizes), layers=layers, link=link, tied=tied, meta=dict(meta))


def _check_overhead(fit, ctx: str) -> None:
    """The measured per-step overhead (``overhead.KEY``): absent, or finite seconds and a bounded slowdown."""
    if fit is None:
        return
    if not isinstance(fit, dict):
        raise ProfileError(f"{ctx}: meta.step_overhead must be an object; got {type(fit).__name__}")
    for key, top in (("fixed_s", MAX_SECONDS), ("per_action_s", MAX_SECONDS), ("slowdown", 1e3)):
        if key in fit:
            _number(fit, key, f"{ctx}: meta.step_overhead", top)


def _tied(raw, n_layers: int, ctx: str):
    if (not isinstance(raw, (list, tuple)) or len(raw) != 2 or not isinstance(raw[0], (list, tuple))
            or any(not isinstance(i, int) or not 0 <= i < n_layers for i in raw[0])
            or isinstance(raw[1], bool) or not isinstance(raw[1], (int, float)) or not 0 <= raw[1] <= MAX_BYTES):
        raise ProfileError(f"{ctx}: tied entry {raw!r} must be [[layer, layer, ...], bytes] with layers "
                           f"0..{n_layers - 1}")
    return tuple(raw[0]), float(raw[1])


def _layer(raw, k: int, n_sizes: int, ctx: str) -> LayerProfile:
    where = f"{ctx}: layers[{k}]"
    if not isinstance(raw, dict):
        raise ProfileError(f"{where} is not an object")
    symbol = _get(raw, "symbol", str, where)
    if not symbol.isidentifier() or not symbol[0].isalpha():
        raise ProfileError(f"{where}: symbol {symbol!r} must be letters and digits, starting with a letter")
    per = {}
    for name in PER_SIZE:
        vals = _get(raw, name, list, where)
        if len(vals) != n_sizes:
            raise ProfileError(f"{where}: {name} has {len(vals)} values; micro_batch_sizes has {n_sizes}")
        top = MAX_SECONDS if name.startswith("t_") else MAX_BYTES
        if any(not isinstance(x, (int, float)) or isinstance(x, bool) or not 0 <= x <= top for x in vals):
            unit = "seconds" if name.startswith("t_") else "bytes"
            raise ProfileError(f"{where}: {name} must be finite numbers from 0 to {top:g} {unit}; "
                               f"got {str(vals)[:120]}")
        per[name] = tuple(float(x) for x in vals)
    t_opt = _number(raw, "t_opt", where, MAX_SECONDS) if "t_opt" in raw else 0.0
    spread = ()
    if raw.get("spread") not in (None, []):  # optional: older profiles have none (and save it empty)
        vals = _get(raw, "spread", list, where)
        if len(vals) != n_sizes or any(isinstance(x, bool) or not isinstance(x, (int, float))
                                       or not 0 <= x <= MAX_SPREAD for x in vals):
            raise ProfileError(f"{where}: spread must be {n_sizes} fractions from 0 to {MAX_SPREAD:g}, one per "
                               f"micro-batch size; got {str(vals)[:80]}")
        spread = tuple(float(x) for x in vals)
    for name in ("a2a", "a2a_b"):  # optional: an MoE layer's all-to-all
        vals = raw.get(name) or []
        if not isinstance(vals, list) or (vals and len(vals) != n_sizes) or any(
                not isinstance(x, (int, float)) or isinstance(x, bool) or not 0 <= x <= MAX_SECONDS for x in vals):
            raise ProfileError(f"{where}: {name} must be {n_sizes} finite numbers >= 0, at most {MAX_SECONDS:g} s "
                               f"(one per micro-batch size) or absent; got {str(vals)[:80]}")
        per[name] = tuple(float(x) for x in vals)
    experts = _number(raw, "expert_param_bytes", where, MAX_BYTES) if "expert_param_bytes" in raw else 0.0
    return LayerProfile(name=str(raw.get("name", symbol)), symbol=symbol,
                        param_bytes=_number(raw, "param_bytes", where, MAX_BYTES), t_opt=t_opt, spread=spread,
                        expert_param_bytes=experts, **per)


def _get(d: dict, key: str, typ, where: str):
    if key not in d:
        raise ProfileError(f"{where} lacks the field {key!r}")
    if not isinstance(d[key], typ):
        want = typ.__name__ if isinstance(typ, type) else "number"
        raise ProfileError(f"{where}: {key} must be a {want}; got {type(d[key]).__name__}")
    return d[key]


def _number(d: dict, key: str, where: str, top: float = math.inf) -> float:
    v = _get(d, key, (int, float), where)
    if isinstance(v, bool) or not 0 <= v < math.inf:
        raise ProfileError(f"{where}: {key} must be a finite number >= 0; got {v}")
    if v > top:
        raise ProfileError(f"{where}: {key} must be at most {top:g}; got {v:g}")
    return float(v)
