"""The cost and memory model the simulator plays a schedule against.

Durations are per action (one stage, one micro-batch). The seed convention is
``t_f = 1, t_b = 2``; ``t_i`` and ``t_w`` default to half of ``t_b`` and an
overlapped pair ``t_fb`` to the sum of its halves (no overlap gain unless
given). Any duration may be one number or one number per stage, which is how
uneven layers (a heavy embedding or head) reach the simulator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence, Union

Num = Union[float, int]
PerStage = Union[Num, Sequence[Num], None]


class CostError(ValueError):
    """A cost option that makes no sense (negative, wrong length)."""


@dataclass(frozen=True, kw_only=True)
class Costs:
    """Per-action durations, links and activation sizes. Field docs give units."""

    t_f: PerStage = 1.0  #: forward time of one stage for one micro-batch
    t_b: PerStage = 2.0  #: full backward (input + weight gradients)
    t_i: PerStage = None  #: input-gradient backward; default t_b / 2
    t_w: PerStage = None  #: weight-gradient backward; default t_b / 2
    t_fb: PerStage = None  #: overlapped F&B pair, by forward stage; default sum of halves
    latency: float = 0.0  #: fixed time of one point-to-point message between ranks
    bandwidth: float | None = None  #: bytes per time unit of a link; None = free
    boundary_bytes: PerStage = 0.0  #: bytes of the activation a stage sends on (= its gradient back)
    activation: PerStage = 1.0  #: activations one stage keeps per micro-batch (chunk-units)
    activation_bytes: PerStage = None  #: the same in bytes, when known
    #: fraction of a stage's activations freed at I (rest at W); negative when I holds more until W
    #: (the output gradients W needs: the runtime measures about -0.6 on its GPT)
    free_at_i: float = 0.0
    recompute: Union[bool, Sequence[bool]] = False  #: stages that keep only their input and redo F in B
    recompute_keep: PerStage = 0.0  #: activation (chunk-units) kept by a recomputed stage

    def resolve(self, stages: int) -> "StageCosts":
        """Per-stage lists for a schedule with ``stages`` stages."""
        f = per_stage("t_f", self.t_f, stages)
        b = per_stage("t_b", self.t_b, stages)
        i = per_stage("t_i", self.t_i, stages, [x / 2 for x in b])
        w = per_stage("t_w", self.t_w, stages, [x / 2 for x in b])
        rec = _bools("recompute", self.recompute, stages)
        # recomputation re-runs the forward inside the backward (B, or I when split)
        b = [x + fx if r else x for x, fx, r in zip(b, f, rec)]
        i = [x + fx if r else x for x, fx, r in zip(i, f, rec)]
        fb = per_stage("t_fb", self.t_fb, stages, None) if self.t_fb is not None else None
        act = per_stage("activation", self.activation, stages)
        keep = per_stage("recompute_keep", self.recompute_keep, stages)
        act = [k if r else a for a, k, r in zip(act, keep, rec)]
        act_b = None
        if self.activation_bytes is not None:
            act_b = per_stage("activation_bytes", self.activation_bytes, stages)
            ratio = [k / a if a else 0.0 for k, a in zip(keep, per_stage("activation", self.activation, stages))]
            act_b = [x * q if r else x for x, q, r in zip(act_b, ratio, rec)]
        link = per_stage("boundary_bytes", self.boundary_bytes, stages)
        if not 0 <= self.latency < math.inf:  # also rejects NaN
            raise CostError(f"--latency must be a finite number >= 0; got {self.latency}")
        if self.bandwidth is not None and not self.bandwidth > 0:
            raise CostError(f"--bandwidth must be > 0; got {self.bandwidth}")
        if not math.isfinite(self.free_at_i):
            raise CostError(f"--free-at-i must be a finite number; got {self.free_at_i}")
        if self.free_at_i > 1.0:
            raise CostError(f"--free-at-i must be <= 1; got {self.free_at_i}")
        msg = [self.latency + (x / self.bandwidth if self.bandwidth else 0.0) for x in link]
        return StageCosts(f=f, b=b, i=i, w=w, fb=fb, message=msg, activation=act,
                          activation_bytes=act_b, free_at_i=self.free_at_i)


@dataclass(frozen=True, kw_only=True)
class StageCosts:
    """Costs resolved to one value per stage (what the simulator reads)."""

    f: list[float]
    b: list[float]
    i: list[float]
    w: list[float]
    fb: list[float] | None  #: None: a pair costs the sum of its halves
    message: list[float]  #: time to send stage s's activation (or gradient) to a neighbour rank
    activation: list[float]
    activation_bytes: list[float] | None
    free_at_i: float

    def duration(self, kind: str, stage: int) -> float:
        return {"F": self.f, "B": self.b, "I": self.i, "W": self.w}[kind][stage]


def per_stage(name: str, value: PerStage, stages: int, default: list[float] | None = None) -> list[float]:
    """One float per stage from a number or a sequence; checks sign and length."""
    if value is None:
        if default is None:
            raise CostError(f"--{_opt(name)} is required")
        return list(default)
    if isinstance(value, (int, float)):
        vals = [float(value)] * stages
    else:
        vals = [float(x) for x in value]
        if len(vals) != stages:
            raise CostError(f"--{_opt(name)} has {len(vals)} per-stage values; the schedule has {stages} stages")
    for s, x in enumerate(vals):
        if not 0 <= x < math.inf:  # also rejects NaN: every time and size must be a finite number
            raise CostError(f"--{_opt(name)} must be a finite number >= 0; got {x} (stage {s})")
    return vals


def _bools(name: str, value, stages: int) -> list[bool]:
    if isinstance(value, bool):
        return [value] * stages
    vals = [bool(x) for x in value]
    if len(vals) != stages:
        raise CostError(f"--{_opt(name)} has {len(vals)} per-stage values; the schedule has {stages} stages")
    return vals


def _opt(name: str) -> str:
    return {"t_f": "tf", "t_b": "tb", "t_i": "ti", "t_w": "tw", "t_fb": "tfb"}.get(name, name.replace("_", "-"))


def rank_share_weights(schedule) -> list[float]:
    """Cost factor per stage when durations describe one rank's share of the model.

    A stage holding 1/n of its model copy (its lane) costs ``ranks / n`` of a
    rank's share: 1 for one stage per rank, 1/v for v chunks, so schedules with
    different v are compared on the same model.
    """
    weights = [1.0] * schedule.stages
    for lane in schedule.lanes:
        for s in lane.stages:
            weights[s] = schedule.ranks / len(lane.stages)
    return weights


def scaled(costs: Costs, weights: list[float], *, durations: bool = True, activation: bool = True) -> Costs:
    """``costs`` with its durations and/or activation sizes times a per-stage weight.

    A uniform weight keeps scalars scalar, so the closed forms still apply.
    """
    from dataclasses import replace

    uniform = len(set(weights)) == 1

    def times(x):
        if x is None:
            return None
        if isinstance(x, (int, float)):
            return x * weights[0] if uniform else [x * w for w in weights]
        return [v * w for v, w in zip(per_stage("cost", x, len(weights)), weights)]

    fields = {k: times(getattr(costs, k)) for k in ("t_f", "t_b", "t_i", "t_w", "t_fb")} if durations else {}
    if activation:
        fields["activation"] = times(costs.activation)
        if costs.activation_bytes is not None:
            fields["activation_bytes"] = times(costs.activation_bytes)
    return replace(costs, **fields)
