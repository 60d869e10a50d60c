"""The one maker of process groups and sub-meshes: a ``Grid`` of a run's ranks, made once per Pipeline.

A ``Grid`` is made from a ``Parallelism`` (``Grid.of_parallelism``: the mesh in ``DIMS`` order, replicas
outermost, tensor parallel innermost) or from the user's own DeviceMesh (``Grid.of_mesh``: kept as it is,
``Pipeline(..., mesh=m).mesh is m``). It answers where this rank sits (``topo``, mesh.Topology) and hands out
every group the runtime uses: ``group("dp")`` (the dp reduction's and a ZeroRedundancyOptimizer's),
``group(("dp", "ep"))`` (an expert-parallel stage's dense gradients), ``group("ep")``, ``group("pp")`` (the
global norm of one pipeline), ``ties(sets)`` (tied and duplicated copies within each pipeline) and
``sub_mesh("tp")`` / ``sub_mesh(("dp", "fsdp"))`` (the DeviceMeshes torch's tensor parallel and FSDP2 take).

Each group is made once (the same ranks never get two groups) and every rank asks for the same groups in the
same order (making a group is a collective). A group along one dimension of a DeviceMesh is the mesh's own
(``mesh.get_group``); dimensions of size 1 are dropped first, so ``("dp", "ep")`` with dp 1 is the ep group.
No other module calls ``new_group``, ``init_device_mesh`` or ``DeviceMesh(`` (tests/test_architecture.py).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ...parallelism import DIMS, Parallelism
from ..config import RunError
from .mesh import Topology


class Grid:
    """This rank's place among the ranks, and every process group over them. Mutable: owns the groups it made.

    Build it on every rank alike (``of_parallelism`` / ``of_mesh``); ask for groups in the same order on every
    rank.
    """

    def __init__(self, topo: Topology, parallelism: Parallelism, device_type: str, mesh=None):
        self.topo, self.parallelism, self.device_type = topo, parallelism, device_type
        self.given = mesh is not None  #: the mesh is the user's own
        self._mesh = mesh
        self._groups: dict[tuple[str, ...], object] = {}
        self._ties: dict[tuple[int, ...], object] | None = None

    @classmethod
    def of_parallelism(cls, parallelism: Parallelism, rank: int, device_type: str) -> "Grid":
        """The grid of ``parallelism`` over ranks 0..world-1, its dimensions in ``DIMS`` order."""
        return cls(Topology.of_parallelism(parallelism, rank), parallelism, device_type)

    @classmethod
    def of_mesh(cls, mesh, world: int, rank: int) -> "Grid":
        """The grid of the user's DeviceMesh (named from ``DIMS``, any order), which stays the grid's mesh."""
        topo = Topology.of_mesh(mesh, world, rank)
        return cls(topo, Parallelism.of_mesh(topo.dims, topo.shape), mesh.device_type, mesh)

    # ---- meshes

    @property
    def mesh(self):
        """The grid as a torch DeviceMesh: the user's own, or made when first asked for (a collective)."""
        if self._mesh is None:
            from torch.distributed.device_mesh import DeviceMesh

            order = [d for d in DIMS if d in self.topo.dims]
            ranks = torch.tensor(self.topo.ranks).view(self.topo.shape)
            grid = ranks.permute([self.topo.dims.index(d) for d in order]).contiguous()
            self._mesh = DeviceMesh(self.device_type, grid, mesh_dim_names=tuple(order))
        return self._mesh

    @property
    def made_mesh(self):
        """The DeviceMesh if one exists already (the user's, or made for tensor parallel or FSDP), else None."""
        return self._mesh

    def sub_mesh(self, dims: str | tuple[str, ...]):
        """The sub-mesh over ``dims`` (in the mesh's order: for HSDP the mesh must name ``dp`` before ``fsdp``,
        replicas outside shards, as FSDP2's 2-D mesh is read)."""
        dims = (dims,) if isinstance(dims, str) else tuple(dims)
        names = tuple(self.mesh.mesh_dim_names)
        missing = [d for d in dims if d not in names]
        if missing:
            raise RunError(f"`dim` {missing[0]!r} is not a dimension of this pipeline's grid ({self.topo.describe()})")
        if list(dims) != sorted(dims, key=names.index):
            raise RunError(f"mesh {names}: {' before '.join(repr(d) for d in dims)} is the order needed here "
                           f"(replicas outside shards); name the mesh's dimensions in that order")
        return self.mesh[dims if len(dims) > 1 else dims[0]]

    # ---- groups

    def group(self, dims: str | tuple[str, ...]):
        """This rank's process group over ``dims`` (one dimension, or several), made once: the mesh's own
        group along one dimension when a DeviceMesh exists, else ``new_group`` for every such group of the
        grid in one order (a collective the first time)."""
        dims = (dims,) if isinstance(dims, str) else tuple(dims)
        unknown = [d for d in dims if d not in DIMS]
        if unknown:
            raise RunError(f"`dim` {unknown[0]!r} is not one of {', '.join(DIMS)}")
        wide = tuple(d for d in DIMS if d in dims and self.topo.size(d) > 1) or dims[:1]
        if wide[0] not in self.topo.dims:
            raise RunError(f"`dim` {wide[0]!r} is not a dimension of this pipeline's grid ({self.topo.describe()})")
        if wide not in self._groups:
            self._groups[wide] = self._make(wide)
        return self._groups[wide]

    def _make(self, dims: tuple[str, ...]):
        if self._mesh is not None and len(dims) == 1 and dims[0] in (self._mesh.mesh_dim_names or ()):
            return self._mesh.get_group(dims[0])
        mine, group = self.topo.group_of(dims), None
        for ranks in self.topo.groups(dims):  # every rank, same order
            g = dist.new_group(list(ranks))
            if ranks == mine:
                group = g
        return group

    def ties(self, sets: list[tuple[int, ...]]) -> dict[tuple[int, ...], object]:
        """The groups of the pipeline ranks in each of ``sets`` (the copies of one tied or duplicated parameter,
        as pipeline positions) within this rank's pipeline, made once for every pipeline of the grid in one
        order; only this rank's sets are returned."""
        if self._ties is None:
            pipelines = self.topo.groups("pp")
            here = pipelines.index(self.topo.pipe_ranks)
            made = [{ranks: dist.new_group([pipe[r] for r in ranks]) for ranks in sets} for pipe in pipelines]
            self._ties = made[here]
        return {ranks: g for ranks, g in self._ties.items() if self.topo.pipe in ranks}

    def describe(self) -> str:
        return self.topo.describe()
