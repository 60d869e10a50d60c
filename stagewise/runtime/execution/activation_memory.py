"""Activation memory: the bytes a rank holds for in-flight micro-batches, counted, and the simulator's prediction.

Counted are (a) what autograd saves for backward during a stage's forward
(``saved_tensors_hooks``; parameters excluded) and (b) what the executor
itself keeps for a (stage, mb) between its F and its backward: the stage input
and output and, after a split backward's I, the gradients W still needs. Each
storage counts once however many hold it, and stops counting when the last
holder lets go (autograd drops saved tensors after the backward; the executor
drops its references). A storage the program offloads (offload.py) stops
counting while its bytes are on the host: the count is of device-resident
bytes. The planner's profiler counts a layer's activation
bytes with the same ``SavedBytes`` (stagewise.profiling.measure).

The prediction feeds the simulator what each (kind, stage) op was measured to
add: F's bytes as ``activation_bytes``, the replayed forward's bytes and F's
kept input as ``recompute_keep``, and the growth at I (W's gradients, minus
the output I lets go) as a negative ``free_at_i``; with memory actions in the
program, what an OFFLOAD took off the device is what its OFFLOAD and RELOAD
move in the timeline's memory, and the rest of F's bytes (the input and output
the executor keeps) stays from F to the backward.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from ..dtensor import is_dtensor

#: op kinds the prediction reads: F, I, R (the forward replayed by recomputation) and OFFLOAD (what it took off)
KINDS = ("F", "I", "R", "OFFLOAD")


@dataclass(kw_only=True)
class SavedBytes:
    """Live bytes autograd holds for backward, and their peak. Mutable: a running count."""

    live: int = 0
    peak: int = 0
    _refs: dict = field(default_factory=dict)

    def hooks(self, module: nn.Module | None = None):
        """A ``saved_tensors_hooks`` context that counts each saved storage once until it is freed.

        Storages of ``module``'s parameters are not activations (autograd saves views of
        weights, such as the transposed matrix of a Linear) and are not counted.
        """
        params = {storage_of(p).data_ptr() for p in module.parameters()} if module is not None else set()
        return self.saving(params)

    def saving(self, params: set):
        """Like ``hooks``, with the parameter storages (data pointers) given."""
        return torch.autograd.graph.saved_tensors_hooks(*self.packer(params))

    def packer(self, params: set) -> tuple:
        """The (pack, unpack) pair of ``saving``, for a hook that wraps it (offload.py)."""
        return (lambda t: self._pack(t, params)), _unpack

    def moved(self, storage, resident: bool) -> None:
        """``storage``'s bytes left the device (offloaded) or came back (reloaded); uncounted ones are ignored."""
        entry = self._refs.get(storage._cdata)
        if entry is not None and entry[2] != resident:
            entry[2] = resident
            self.live += entry[1] if resident else -entry[1]
            self.peak = max(self.peak, self.live)

    def hold(self, tensors) -> tuple:
        """Count ``tensors`` (once per storage) for as long as the returned tokens live."""
        return tuple(self._pack(t, ()) for t in tensors if isinstance(t, torch.Tensor))

    def reset_peak(self) -> None:
        self.peak = self.live

    def _pack(self, t: torch.Tensor, params):
        storage = storage_of(t)
        if is_state(t, params):
            return t  # a weight, or a view of one (a Linear's transposed matrix; FSDP's gathered ones too)
        key = storage._cdata  # the storage itself: its data pointer changes while it is offloaded
        entry = self._refs.get(key)
        if entry is None:
            entry = self._refs[key] = [0, storage.nbytes(), True]  # holders, bytes, resident on the device
            self.live += entry[1]
            self.peak = max(self.peak, self.live)
        entry[0] += 1
        # detached: holding the tensor itself would hold its grad_fn, which holds this object
        # (an output saved for its own backward): a cycle autograd never frees
        return _Held(t.detach(), key, self)

    def _release(self, key: int) -> None:
        entry = self._refs[key]
        entry[0] -= 1
        if entry[0] == 0:
            del self._refs[key]
            self.live -= entry[1] if entry[2] else 0


class _Held:
    """A counted tensor; its release (when autograd or the executor drops it) lowers the live count."""

    __slots__ = ("key", "owner", "t")

    def __init__(self, t, key, owner):
        self.t, self.key, self.owner = t, key, owner

    def __del__(self):
        self.owner._release(self.key)


def is_state(t: torch.Tensor, params) -> bool:
    """``t`` is a parameter, a view of one, or in ``params`` (data pointers of the module state's storages)."""
    return isinstance(t, nn.Parameter) or isinstance(t._base, nn.Parameter) or storage_of(t).data_ptr() in params


def storage_of(t: torch.Tensor):
    """The storage holding ``t``'s data on this rank (a DTensor's: its local shard's)."""
    return (t._local_tensor if is_dtensor(t) else t).untyped_storage()


def _unpack(x):
    return x.t if isinstance(x, _Held) else x


class ActivationMeter:
    """One rank's activation bytes: live, the peak, and what each (kind, stage) op adds.

    Mutable: running counts. ``added[kind][stage]`` is the largest change of the live
    count over one such op (F: what the forward leaves held; I: W's gradients minus
    the output let go; R: the replayed forward, held until its backward).
    """

    def __init__(self, stages: dict[int, nn.Module]):
        self.count = SavedBytes()
        self.stages = stages
        self.added: dict[str, dict[int, int]] = {k: {} for k in KINDS}
        self.peak = 0  #: the largest live count over the steps so far

    def start_step(self) -> None:
        self.count.reset_peak()

    def end_step(self) -> None:
        self.peak = max(self.peak, self.count.peak)

    def saving(self):
        """Count what autograd saves inside the block (the parameters' storages, read now: a checkpoint load may
        replace them, and FSDP registers its gathered ones while a stage is gathered, its shards otherwise)."""
        return self.count.saving(self.params())

    def params(self) -> set:
        """The data pointers of the stages' parameters, now."""
        return {storage_of(p).data_ptr() for st in self.stages.values() for p in st.parameters()}

    def hold(self, *tensors) -> tuple:
        return self.count.hold(tensors)

    @contextmanager
    def op(self, kind: str, stage: int):
        """Record how much the block changes the live count, as op ``kind`` of ``stage``."""
        before = self.count.live
        yield
        grew = self.count.live - before
        table = self.added.setdefault(kind, {})
        table[stage] = max(table.get(stage, grew), grew)

    def report(self) -> dict:
        """What rank 0 gathers: the peak and the per-op growth (plain data)."""
        return {"peak": self.peak, "added": {k: dict(v) for k, v in self.added.items()}}


def merge_added(reports: list[dict]) -> dict[str, dict[int, int]]:
    """The per-(kind, stage) growth of all ranks' reports (each stage lives on one rank)."""
    out: dict[str, dict[int, int]] = {k: {} for k in KINDS}
    for rep in reports:
        for kind, grew in rep["added"].items():
            merged = out.setdefault(kind, {})
            for s, v in grew.items():
                merged[int(s)] = max(merged.get(int(s), v), v)
    return out


def predicted_peaks(schedule, added: dict[str, dict[int, int]], recompute: frozenset = frozenset()) -> list[float]:
    """The simulator's peak activation bytes per rank, from what each (kind, stage) op was measured to add.

    F's bytes are held from F to the backward. A recomputed stage holds its
    input only (``recompute_keep``), and the largest replayed forward of the
    rank's recomputed stages is added to its peak as a transient (the planner's
    model: stagewise.plan.search.profile_costs.rank_transient_bytes); a placed
    RECOMPUTE holds the replayed forward from where it runs (the timeline's
    memory). A split stage's I changes what it holds until W (W's gradients in,
    the output out): one ``free_at_i`` for all split stages, from their sums.
    An offloaded stage's units hold what its OFFLOAD left on the device from F
    to the backward, and the rest between F and the OFFLOAD's end and from the
    RELOAD's start (the timeline's memory). Not modelled: a recomputed *split*
    stage holds its replayed forward from I to W, so with zero-bubble schedules
    the prediction is a lower bound.
    """
    from dataclasses import replace

    from ...actions import OFFLOAD, RECOMPUTE
    from ...costs import Costs
    from ...simulate import simulate
    from ...timeline import metrics

    S = schedule.stages
    F, I, R, O = (added.get(k, {}) for k in KINDS)
    kinds = {(a.kind, a.stage) for a in schedule.actions()}
    placed = {s for s in range(S) if (RECOMPUTE, s) in kinds}
    redone = set(recompute) | placed
    # sequence slices: F's growth is the largest slice's (the last, which also holds the earlier slices' keys and
    # values), and the simulator keeps 1/k of a micro-batch per slice: every slice counted as that one (an upper
    # bound; tests/test_runtime_kv.py checks the slice model from an unsliced run's bytes)
    held = [float(F.get(s, 0)) * schedule.slices for s in range(S)]
    full = [held[s] + R.get(s, 0) if s in redone else held[s] for s in range(S)]
    keep = [held[s] / full[s] if s in redone and full[s] else 0.0 for s in range(S)]
    split = [s for s in I if s not in redone and held[s]]
    free_at_i = min(1.0, -sum(I[s] for s in split) / sum(held[s] for s in split)) if split else 0.0
    costs = Costs(activation_bytes=full, recompute=[s in recompute for s in range(S)], recompute_keep=keep,
                  free_at_i=free_at_i)
    tl = simulate(schedule, costs)
    transient = [max((full[s] - held[s] for s in schedule.stages_of_rank(r) if s in recompute), default=0.0)
                 for r in range(schedule.ranks)]
    if not schedule.memory_actions:
        return [p + t for p, t in zip(metrics(tl).peak_activation_bytes, transient)]
    offloaded = {s for s in range(S) if (OFFLOAD, s) in kinds}
    moved = [float(-O.get(s, 0)) if s in offloaded else 0.0 for s in range(S)]
    # two views of one timeline: the moved bytes with their OFFLOADs and RELOADs, and the rest without them
    # (``transfers=False``); at one instant what ends frees before what
    # starts allocates, as the rank runs its program in order (a RELOAD issued after a backward follows its free)
    away = replace(tl, activation_bytes=tuple(moved))
    stays = replace(tl, activation_bytes=tuple(f - m for f, m in zip(full, moved)))
    peaks = []
    for r in range(schedule.ranks):
        events = away.memory_events(r, True) + stays.memory_events(r, True, transfers=False)
        live = peak = 0.0
        for _, _, delta in sorted(events, key=lambda e: (e[0], e[2] > 0, e[1])):
            live += delta
            peak = max(peak, live)
        peaks.append(peak + transient[r])
    return peaks
