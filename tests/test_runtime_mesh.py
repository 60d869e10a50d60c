"""Where a rank sits in a grid of named dimensions (runtime/parallel/mesh.py): a DeviceMesh read by name."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from stagewise.runtime.parallel.mesh import Topology  # noqa: E402
from stagewise.runtime.config import RunError  # noqa: E402


class Mesh:
    """What Topology reads of a torch DeviceMesh: its rank grid and its dimension names."""

    def __init__(self, shape, names):
        self.mesh = torch.arange(int(torch.tensor(shape).prod())).reshape(shape)
        self.mesh_dim_names = names
        self.device_type = "cpu"


def test_a_mesh_is_read_by_its_names_in_any_order():
    dp_pp = Topology.of_mesh(Mesh((2, 3), ("dp", "pp")), 6, 4)
    pp_dp = Topology.of_mesh(Mesh((3, 2), ("pp", "dp")), 6, 4)
    assert (dp_pp.p, dp_pp.dp, dp_pp.pipe, dp_pp.replica, dp_pp.pipe_ranks) == (3, 2, 1, 1, (3, 4, 5))
    # the same sizes named the other way round: the pipeline runs down the columns
    assert (pp_dp.p, pp_dp.dp, pp_dp.pipe, pp_dp.replica, pp_dp.pipe_ranks) == (3, 2, 2, 0, (0, 2, 4))
    assert pp_dp.groups("dp") == [(0, 1), (2, 3), (4, 5)] and pp_dp.group_of("dp") == (4, 5)


def test_sizes_make_the_default_grid():
    t = Topology.of_sizes(world=8, rank=5, dp=2)
    assert (t.dims, t.shape, t.pipe_ranks, t.data_shards, t.data_index) == (("dp", "pp"), (2, 4), (4, 5, 6, 7), 2, 1)
    assert t.global_rank(1, 0) == 1 and t.global_rank(3, 1) == 7 and t.describe() == "dp 2 x pp 4"


@pytest.mark.parametrize("mesh, world, words", [
    (Mesh((2, 2), ("dp", "pipe")), 4, "mesh dimension 'pipe' (of ('dp', 'pipe')) is not one of dp, fsdp, ep, pp, tp"),
    (Mesh((2, 2), ("dp", "tp")), 4, "has no 'pp' dimension"),
    (Mesh((2, 2), None), 4, "its dimensions need names"),
    (Mesh((2, 2), ("dp", "pp")), 8, "holds 4 ranks; the world has 8"),
    (Mesh((2, 2), ("pp", "pp")), 4, "names the dimension 'pp' twice"),
])
def test_a_mesh_that_cannot_be_read_says_why(mesh, world, words):
    with pytest.raises(RunError, match=words.replace("(", r"\(").replace(")", r"\)")):
        Topology.of_mesh(mesh, world, 0)


def test_sizes_that_do_not_divide_the_world_are_refused():
    with pytest.raises(RunError, match="`dp` 3 = 3 does not divide the 8 ranks"):
        Topology.of_sizes(world=8, rank=0, dp=3)
    with pytest.raises(RunError, match="`dp` must be a whole number >= 1; got '2'"):
        Topology.of_sizes(world=8, rank=0, dp="2")


def test_fsdp_and_tp_sizes_make_the_grid_with_tp_innermost():
    t = Topology.of_sizes(world=8, rank=5, fsdp=2, tp=2)
    assert (t.dims, t.shape, t.coords) == (("fsdp", "pp", "tp"), (2, 2, 2), {"fsdp": 1, "pp": 0, "tp": 1})
    assert t.pipe_ranks == (5, 7) and t.data_shards == 2 and t.data_index == 1  # tp ranks take the same rows
    assert t.group_of("tp") == (4, 5) and t.group_of("fsdp") == (1, 5)
    with pytest.raises(RunError, match="`fsdp` 2 x `tp` 2 = 4 does not divide the 6 ranks"):
        Topology.of_sizes(world=6, rank=0, fsdp=2, tp=2)


def test_a_mesh_and_sizes_together_are_refused():
    from stagewise.runtime.pipeline import _grid

    cpu = torch.device("cpu")
    with pytest.raises(RunError, match="give either `mesh` or `fsdp`, `tp`, not both"):
        _grid(Mesh((2, 2), ("pp", "fsdp")), None, {"dp": 1, "fsdp": 2, "tp": 2}, 4, 0, cpu)
    topo = _grid(Mesh((2, 1, 2), ("tp", "dp", "pp")), None, {"dp": 1, "fsdp": 1, "tp": 1}, 4, 3, cpu).topo
    assert (topo.p, topo.size("tp"), topo.pipe, topo.coords["tp"], topo.pipe_ranks) == (2, 2, 1, 1, (2, 3))
