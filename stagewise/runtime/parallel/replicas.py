"""Step-end collectives: replica gradients, the loss on every rank, global-norm clipping.

A logical parameter with several copies (a tied embedding and head, or a layer
held by both DualPipe lanes) gets the sum of all copies' gradients on every
copy, like a tied weight in one process; identical values, gradients and
optimizer updates then keep the copies equal. A process group per set of ranks
that share copies (grid.py makes them, for every pipeline, in one order).
With dp pipeline replicas (dp.py) each replica has its own groups, and the
global norm sums over one pipeline (the replicas' gradients are equal by then).
"""

from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from ..resilience.flight import NO_FLIGHT
from ..stages.stage import StageMap, Stage
from ..dtensor import is_dtensor, local


class Replicas:
    """Sums replica gradients. Mutable: owns the process groups it created."""

    flight = NO_FLIGHT  #: the rank's flight.Recorder (the pipeline sets it): each sum as ``0TIE_GRAD``

    def __init__(self, lay: StageMap, stages: dict[int, Stage], placement: tuple[int, ...], rank: int, device,
                 grid):
        """``rank``: in the pipeline; ``grid`` (grid.Grid) places the pipeline among the other ranks and makes
        the groups (each pipeline's tie groups, then the pipeline's own)."""
        self.rank, self.device = rank, device
        topo = grid.topo
        self._glob = lambda r: topo.pipe_ranks[r]
        self.groups = grid.ties(sorted({r.ranks for r in lay.replicas if len(r.ranks) > 1}))
        # without other dimensions the global norm is a sum over one pipeline
        self.pipeline = grid.group("pp") if topo.world > topo.p else None
        self.lay, self.stages, self.placement, self.topo = lay, stages, placement, topo
        self.capture()

    def capture(self) -> None:
        """Read this rank's copies from the stages (again after FSDP or tensor parallel replaced the parameters
        with their sharded DTensors: those stay the parameters between steps)."""
        lay, stages, rank = self.lay, self.stages, self.rank
        self.local = []  # (rank set, local copies) per replica held here
        self.tie_stage: dict[tuple, int] = {}  # rank set -> this rank's first stage holding a copy (its TIE_GRAD)
        for rep in lay.replicas:
            here = [h for h in rep.holders if h.stage in stages]
            if here:
                self.local.append((rep.ranks, [stages[h.stage].param(h) for h in here]))
                s = min(h.stage for h in here)
                self.tie_stage[rep.ranks] = min(s, self.tie_stage.get(rep.ranks, s))
        # each logical parameter's gradient counts once in the global norm: on its lowest rank's first copy
        self.owned = []
        for holders in lay.params.values():
            owner = min(self.placement[h.stage] for h in holders)
            if owner == rank:
                h = next(h for h in holders if self.placement[h.stage] == rank)
                self.owned.append(stages[h.stage].param(h))

    def make_equal(self) -> None:
        """Every copy takes the value of the copy on the lowest rank (a layer factory builds each copy apart)."""
        by_ranks: dict[tuple, list] = {}
        for ranks, copies in self.local:
            by_ranks.setdefault(ranks, []).append(copies)
        for ranks, items in sorted(by_ranks.items()):
            values = [c[0].detach() for c in items]
            if len(ranks) > 1:
                flat = _flatten_dense_tensors(values)
                dist.broadcast(flat, src=self._glob(ranks[0]), group=self.groups[ranks])
                values = _unflatten_dense_tensors(flat, values)
            with torch.no_grad():
                for copies, value in zip(items, values):
                    for p in copies:
                        p.copy_(value)

    @property
    def sets(self) -> frozenset:
        """Every set of pipeline ranks that holds copies of one logical parameter (of every rank, not only this)."""
        return frozenset(frozenset(rep.ranks) for rep in self.lay.replicas if len(rep.ranks) > 1)

    def ties_lane_ends(self, lanes) -> bool:
        """Some parameter has copies on a lane's first and last stage (a tied embedding and head): the
        lowering's tie rule (``Sizes.tie``)."""
        return any({lane.stage_lo, lane.stage_hi - 1} <= {h.stage for h in rep.holders}
                   for rep in self.lay.replicas for lane in lanes)

    def sync_grads(self) -> None:
        """Every copy's gradient becomes the sum over all copies (local sum, then within its rank set). Sharded
        copies (FSDP, tensor parallel) are summed shard by shard: the copies of one logical parameter are
        sharded alike (the same coordinates of the grid on every rank of its set)."""
        self.sum_local()
        for ranks in list(self._sums):
            self._tie(ranks, f"{self.tie_stage[ranks]}TIE_GRAD")

    def sum_local(self) -> None:
        """The step's end before the ties: each rank set's copies here summed; a set of this rank alone is done,
        the others wait for their ``tie`` (a TIE_GRAD of the program)."""
        self._sums: dict[tuple, list] = {}
        for ranks, copies in self.local:
            total = sum(_grad(p) for p in copies)
            self._sums.setdefault(ranks, []).append((copies, total))
        for ranks in [r for r in self._sums if len(r) == 1]:
            self._assign(self._sums.pop(ranks))

    def tie(self, action) -> None:
        """A TIE_GRAD of the lowered program (comm_actions.CommAction): the sums of the set of this rank and its
        ``peer`` all-reduced over that set (after ``sum_local``)."""
        ranks = next(r for r in self._sums if set(r) == {self.rank, action.peer})
        self._tie(ranks, str(action))

    def _tie(self, ranks: tuple, name: str) -> None:
        items = self._sums.pop(ranks)
        self.flight.comm(name)
        t0 = time.perf_counter()
        shards = [local(t) for _, t in items]
        flat = _flatten_dense_tensors(shards)
        dist.all_reduce(flat, group=self.groups[ranks])
        self.flight.done(name, time.perf_counter() - t0)
        for t, g in zip(shards, _unflatten_dense_tensors(flat, shards)):
            t.copy_(g)
        self._assign(items)

    @staticmethod
    def _assign(items: list) -> None:
        for copies, total in items:
            for p in copies:
                p.grad = total.clone()

    def clip(self, params: list[torch.Tensor], max_norm: float, sharded=None) -> float:
        """Scale all gradients so the global norm (each logical parameter once) is at most ``max_norm``.

        Each rank adds the squares of its owned parameters' local gradient shards, divided by the number of
        ranks holding that same shard (data-parallel replicas, and tp, fsdp or ep ranks a parameter is not split
        over), so one all-reduce over every rank gives each logical parameter's squares once. ``sharded``: (ids
        of parameters, group) held in shares over the ``ep`` group (ep.py's experts): each rank's share is its
        own."""
        ids = sharded[0] if sharded is not None else ()
        sq = torch.zeros((), dtype=torch.float64, device=self.device)
        for p in self.owned:
            if p.grad is not None:
                sq += local(p.grad).detach().double().pow(2).sum() / self._holding(p, id(p) in ids)
        dist.all_reduce(sq, group=self.pipeline if self._one_pipeline else None)
        norm = math.sqrt(float(sq))
        coef = min(1.0, max_norm / (norm + 1e-6))  # torch.nn.utils.clip_grad_norm_'s rule
        for p in params:
            if p.grad is not None:
                p.grad.mul_(coef)
        return norm

    @property
    def _one_pipeline(self) -> bool:
        """The grid is pipelines and replicas only: the norm sums over this rank's pipeline."""
        return all(d in ("pp", "dp") or self.topo.size(d) == 1 for d in self.topo.dims)

    def _holding(self, p, experts: bool = False) -> int:
        """How many ranks of the grid (all of it, or of one pipeline) hold the same values as this rank's
        shard of ``p``: every dimension but pp that ``p`` is not split along (``experts``: nor ep)."""
        if self._one_pipeline:
            return 1
        split = {"ep"} if experts else set()
        if is_dtensor(p):
            names = p.device_mesh.mesh_dim_names or ()
            split |= {d for d, pl in zip(names, p.placements) if not pl.is_replicate()}
        return math.prod(self.topo.size(d) for d in self.topo.dims if d != "pp" and d not in split)


def _grad(p: torch.Tensor) -> torch.Tensor:
    return p.grad if p.grad is not None else torch.zeros_like(p)
