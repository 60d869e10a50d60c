"""The Grid (runtime/parallel/grid.py): the one maker of process groups and sub-meshes.

One launch of 4 ranks: pp 2 x dp 2 from degrees (``pipe.group("dp")`` is the group the dp reduction sums
over, made once) and from the user's own DeviceMesh (kept: ``pipe.mesh is m``; its groups are the ones used).
The rest without ranks: what a grid refuses before any group is made.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import stagewise  # noqa: E402
from composed_helpers import grid_facts  # noqa: E402
from stagewise import Parallelism  # noqa: E402
from stagewise.runtime.parallel.grid import Grid  # noqa: E402
from stagewise.runtime.pipeline import _grid  # noqa: E402
from stagewise.runtime.config import RunError  # noqa: E402

CPU = torch.device("cpu")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_dp_group_is_made_once_and_the_users_mesh_is_kept():
    got = stagewise.launch(grid_facts, 4, timeout=60)
    deg, mesh = got["degrees"], got["mesh"]
    assert deg["parallelism"] == "pp 2 x dp 2" and deg["mesh"] is None  # no DeviceMesh needed: none made
    assert deg["dp reduction's group"] and deg["made once"] and deg["dp ranks"] == (0, 2)
    assert mesh["parallelism"] == "pp 2 x dp 2" and mesh["mesh is the user's"]
    assert mesh["dp group is the mesh's"] and mesh["dp reduction's group"]
    assert mesh["dp ranks"] == (0, 1)  # named (pp, dp): the replicas are neighbours
    assert abs(deg["loss"] - mesh["loss"]) <= 1e-6 * abs(deg["loss"])  # the same run, laid out two ways


def test_a_grid_of_a_parallelism_has_its_dimensions_in_mesh_order():
    grid = Grid.of_parallelism(Parallelism(pp=2, dp=2, tp=2), 5, "cpu")
    assert grid.topo.dims == ("dp", "pp", "tp") and grid.topo.coords == {"dp": 1, "pp": 0, "tp": 1}
    assert grid.made_mesh is None and grid.describe() == "dp 2 x pp 2 x tp 2"


@pytest.mark.parametrize("mesh, parallelism, degrees, world, needle", [
    ((2, 1), None, {}, 4, "`mesh` must be a torch DeviceMesh with named dimensions"),
    (None, None, {"dp": 3}, 8, "`dp` 3 = 3 does not divide the 8 ranks"),
    (None, None, {"dp": 0}, 8, "`dp` must be a whole number >= 1; got 0"),
    (None, Parallelism(pp=2, dp=2), {}, 8, "is 4 ranks; the world has 8"),
    (None, Parallelism(pp=2, dp=2), {"tp": 2}, 8, "give either `parallelism` or `tp`, not both"),
    (None, Parallelism(pp=1, ep=2, tp=2), {}, 4, "expert parallel is not composed with FSDP or tensor parallel"),
    (None, "pp 2", {}, 2, "`parallelism` must be a stagewise.Parallelism; got str"),
])
def test_a_layout_that_cannot_run_is_refused_before_any_group_is_made(mesh, parallelism, degrees, world, needle):
    sizes = {"dp": 1, "fsdp": 1, "tp": 1, "ep": 1, **degrees}
    with pytest.raises(RunError, match=needle.replace("(", r"\(")):
        _grid(mesh, parallelism, sizes, world, 0, CPU)


def test_hsdp_needs_the_replicas_named_before_the_shards():
    class Mesh:  # what a grid reads of a DeviceMesh; slicing is not reached
        mesh = torch.arange(8).reshape(2, 2, 2)
        mesh_dim_names = ("fsdp", "dp", "pp")
        device_type = "cpu"

    grid = Grid.of_mesh(Mesh(), 8, 0)
    with pytest.raises(RunError, match="'dp' before 'fsdp' is the order needed here"):
        grid.sub_mesh(("dp", "fsdp"))
    with pytest.raises(RunError, match="`dim` 'tp' is not a dimension of this pipeline's grid"):
        grid.sub_mesh("tp")
