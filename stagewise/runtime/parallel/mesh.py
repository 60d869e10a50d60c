"""Where one process sits among the ranks: a grid of named dimensions, pipeline parallel being one of them.

The dimensions are torch DeviceMesh's (``init_device_mesh(device, shape, mesh_dim_names=...)``), named in
any order from ``DIMS``: ``pp`` (pipeline stages), ``dp`` (replicas: gradients summed), ``fsdp`` (sharded
data parallel), ``tp`` (tensor parallel), ``ep`` (expert parallel). ``Topology`` reads a mesh (or sizes
given as integers: ``dp=2``) and answers every question the runtime asks of it: this rank's coordinates,
the global ranks of its pipeline (whom it messages), of each data-parallel group, and this rank's share of
a step's batch. A dimension of size 1 may be left out. No torch here beyond reading a mesh: the process
groups and DeviceMeshes over the grid are made by grid.py alone.

Example:
    >>> t = Topology.of_sizes(world=8, rank=5, dp=2)     # pp = 8 / 2 = 4, mesh (dp, pp)
    >>> t.p, t.dp, t.pipe, t.replica, t.pipe_ranks
    (4, 2, 1, 1, (4, 5, 6, 7))
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product

from ...parallelism import DATA_DIMS, DIMS, Parallelism, ParallelismError  # noqa: F401 - DIMS read here
from ..config import RunError


@dataclass(frozen=True, kw_only=True)
class Topology:
    """A rank's place in a grid of named dimensions. Immutable."""

    dims: tuple[str, ...]  #: dimension names, outermost first
    shape: tuple[int, ...]  #: size of each dimension
    ranks: tuple[int, ...]  #: the global rank at each grid point, row-major (a mesh's ``mesh.flatten()``)
    rank: int  #: this process's global rank

    @classmethod
    def of_parallelism(cls, par: Parallelism, rank: int) -> "Topology":
        """The grid of ``par`` over ranks 0..world-1, its dimensions in ``DIMS`` order (size 1 left out, pp kept)."""
        dims = par.dims()
        return cls(dims=dims, shape=tuple(par.size(d) for d in dims), ranks=tuple(range(par.world)), rank=rank)

    @classmethod
    def of_sizes(cls, *, world: int, rank: int, **degrees) -> "Topology":
        """The grid of ``world`` ranks with these degrees (dp, fsdp, tp, ep), pp the rest (``Parallelism.of_world``)."""
        try:
            par = Parallelism.of_world(world, **degrees)
        except ParallelismError as e:
            raise RunError(str(e)) from None
        return cls.of_parallelism(par, rank)

    @classmethod
    def of_mesh(cls, mesh, world: int, rank: int) -> "Topology":
        """The grid of a torch DeviceMesh: its dimension names must come from ``DIMS`` and include ``pp``."""
        names = getattr(mesh, "mesh_dim_names", None)
        ranks = mesh.mesh
        try:
            Parallelism.of_mesh(names or (), tuple(ranks.shape))
        except ParallelismError as e:
            raise RunError(str(e)) from None
        flat = ranks.flatten().tolist()
        if len(flat) != world or sorted(flat) != list(range(world)):
            raise RunError(f"mesh {dict(zip(names, ranks.shape))} holds {len(flat)} ranks; the world has {world}: "
                           "a mesh must cover every rank once")
        return cls(dims=tuple(names), shape=tuple(int(n) for n in ranks.shape), ranks=tuple(flat), rank=rank)

    # ---- sizes and coordinates

    def size(self, dim: str) -> int:
        return self.shape[self.dims.index(dim)] if dim in self.dims else 1

    @property
    def world(self) -> int:
        return len(self.ranks)

    @property
    def coords(self) -> dict[str, int]:
        """This rank's coordinate along each dimension."""
        return self.coords_of(self.rank)

    def coords_of(self, rank: int) -> dict[str, int]:
        at = self.ranks.index(rank)
        out = {}
        for d, n in reversed(list(zip(self.dims, self.shape))):
            out[d] = at % n
            at //= n
        return out

    def rank_at(self, **coords: int) -> int:
        """The global rank at this rank's coordinates with ``coords`` changed (``rank_at(pp=0)``)."""
        c = {**self.coords, **coords}
        at = 0
        for d, n in zip(self.dims, self.shape):
            at = at * n + c[d]
        return self.ranks[at]

    @property
    def p(self) -> int:
        """Ranks of one pipeline."""
        return self.size("pp")

    @property
    def dp(self) -> int:
        """Pipeline replicas whose gradients are summed (the ``dp`` dimension)."""
        return self.size("dp")

    @property
    def pipe(self) -> int:
        """This rank's place in its pipeline: the rank of the schedule's programs."""
        return self.coords["pp"]

    @property
    def replica(self) -> int:
        """This rank's index along ``dp``."""
        return self.coords.get("dp", 0)

    @property
    def data_shards(self) -> int:
        """How many different shares of a step's batch there are (dp x fsdp x ep)."""
        return math.prod(self.size(d) for d in DATA_DIMS)

    @property
    def data_index(self) -> int:
        """Which share of a step's batch this rank takes."""
        at = 0
        for d in DATA_DIMS:
            at = at * self.size(d) + self.coords.get(d, 0)
        return at

    # ---- groups

    @property
    def pipe_ranks(self) -> tuple[int, ...]:
        """The global rank of each rank of this rank's pipeline, in pipeline order (whom P2P messages)."""
        return tuple(self.rank_at(pp=k) for k in range(self.p))

    def global_rank(self, pipe: int, replica: int) -> int:
        """The global rank of pipeline rank ``pipe`` in data-parallel replica ``replica`` (this rank's other
        coordinates)."""
        return self.rank_at(pp=pipe, **({"dp": replica} if "dp" in self.dims else {}))

    def groups(self, dim: str | tuple[str, ...]) -> list[tuple[int, ...]]:
        """Every group of ranks that differ only along ``dim`` (or along each of several dimensions: row-major
        over them), in one order on every rank: what each rank passes to ``new_group`` one by one."""
        along = (dim,) if isinstance(dim, str) else tuple(dim)
        others = [d for d in self.dims if d not in along]
        out = []
        for point in product(*(range(self.size(d)) for d in others)):
            fixed = dict(zip(others, point))
            out.append(tuple(self._at({**fixed, **dict(zip(along, inner))})
                             for inner in product(*(range(self.size(d)) for d in along))))
        return out

    def group_of(self, dim: str | tuple[str, ...]) -> tuple[int, ...]:
        """This rank's group along ``dim`` (or several dimensions, as ``groups`` orders them)."""
        along = (dim,) if isinstance(dim, str) else tuple(dim)
        return tuple(self.rank_at(**dict(zip(along, inner)))
                     for inner in product(*(range(self.size(d)) for d in along)))

    def _at(self, coords: dict[str, int]) -> int:
        at = 0
        for d, n in zip(self.dims, self.shape):
            at = at * n + coords[d]
        return self.ranks[at]

    def describe(self) -> str:
        """``pp 2 x dp 2`` (the dimensions in order)."""
        return " x ".join(f"{d} {n}" for d, n in zip(self.dims, self.shape))
