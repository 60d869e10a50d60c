"""FSDP2 driven by the lowered program's actions (runtime/parallel/fsdp.py), on a group of one rank: gathered at
UNSHARD, gradients accumulated across micro-batches and reduced into the shards only at REDUCE_GRAD."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from stagewise.actions import Action  # noqa: E402
from stagewise.runtime.parallel.fsdp import Sharded  # noqa: E402
from stagewise.runtime.stages.stage import Stage  # noqa: E402


def layers():
    torch.manual_seed(0)
    return [torch.nn.Linear(4, 6), torch.nn.LayerNorm(6)]


def test_gathered_before_its_forward_reduced_into_the_shards_after_its_last_backward(one_rank_group):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",))
    stage = Stage(0, layers(), 0)
    fsdp = Sharded({0: stage}, mesh)
    plain = torch.nn.Sequential(*layers())
    xs = [torch.randn(3, 4, generator=torch.Generator().manual_seed(k)) for k in range(2)]
    shards = list(stage.parameters())  # what the optimizer holds: the DTensor shards
    fsdp.start_step()
    for k, x in enumerate(xs):
        if k == 0:
            fsdp.unshard(0)  # 0UNSHARD before the first forward
        fsdp.ready(Action("F", 0, k))
        assert type(stage.layers[0].weight) is torch.nn.Parameter  # gathered: the whole weight, not a DTensor
        stage(x).pow(2).mean().backward()
        plain(x).pow(2).mean().backward()
        assert all(p.grad is None for p in shards)  # accumulated in the gathered weights only
        if k == 1:  # after the last backward: 0REDUCE_GRAD 0RESHARD
            fsdp.reduce(0)
            fsdp.reshard(0)
    assert type(stage.layers[0].weight).__name__ == "DTensor"  # freed: its shards are the parameters again
    assert list(stage.parameters()) == shards
    for p, q in zip(shards, plain.parameters()):
        assert torch.allclose(p.grad.full_tensor(), q.grad, atol=1e-6)
    fsdp.finish()
    assert not fsdp.gathered and not fsdp.pending


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_tensor_handed_through_layers_under_fsdp_warns_nothing_and_trains_as_data_parallel():
    """A timestep embedding handed on unchanged made torch warn 4-8 times a run that the layer "returned a view
    tensor" (FSDP's own pre-forward makes the input a view); the gradients were right, so the warning goes."""
    import stagewise
    from api_helpers import passthrough_runs

    got = stagewise.launch(passthrough_runs, 4, threads=1)
    (sharded, warned), (replicated, _) = got["fsdp"], got["dp"]
    assert not [w for w in warned if "view tensor" in w], warned
    assert sharded == pytest.approx(replicated, rel=1e-5)
