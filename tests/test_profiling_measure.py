"""Measuring a model layer by layer (profiling/measure.py): one layer built at a time."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from stagewise.plan.search.profile import Profile  # noqa: E402


def test_measure_a_user_sequence_of_layers():
    """Any sequence of layers: times > 0, split backward parts measured, bytes counted, same-shape layers shared."""
    torch = pytest.importorskip("torch")
    from torch import nn

    from stagewise.profiling.measure import profile_model
    from stagewise.runtime.run.models import LayerModel

    torch.manual_seed(0)
    layers = [nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 4)]
    model = LayerModel(name="mlp", layer_list=layers,
                       make_batch=lambda step, n: (torch.randn(n, 16), torch.randn(n, 4)),
                       loss_fn=nn.functional.mse_loss, symbols=["a", "r", "b", "b", "o"])
    prof = profile_model(model, (1, 4), repeats=2, warmup=1)
    assert prof.symbols == ("a", "r", "b", "b", "o")
    a, relu, b1, b2, out = prof.layers
    assert a.param_bytes == (16 * 32 + 32) * 4 and relu.param_bytes == 0
    assert all(x > 0 for layer in prof.layers for x in layer.t_f + layer.t_b)
    assert b1.t_f == b2.t_f  # same structure: measured once
    assert a.output_bytes == (32 * 4, 4 * 32 * 4) and a.input_bytes == (16 * 4, 4 * 16 * 4)
    # the first Linear keeps its input (autograd saves it for the weight gradient); ReLU keeps its output
    assert a.activation_bytes[0] >= 16 * 4 and relu.activation_bytes[0] >= 32 * 4
    assert relu.t_w == (0.0, 0.0) or all(x < 1e-3 for x in relu.t_w)
    assert out.t_opt > 0 and relu.t_opt == 0.0
    assert prof.tied == ()
    assert all(len(x.spread) == 2 and all(0 <= v < 10 for v in x.spread) for x in prof.layers)  # the band's source
    back = Profile.loads(json.dumps(prof.to_json()))  # what it writes, it reads
    assert back.layers[0].spread == prof.layers[0].spread


def test_measure_finds_the_tied_embedding_of_the_built_in_gpt():
    pytest.importorskip("torch")
    from stagewise.profiling.measure import profile_model
    from stagewise.runtime.run.models import GPTConfig

    gpt = GPTConfig(layers_n=1, d_model=16, heads=2, seq=8, vocab=32)
    prof = profile_model(gpt, (1,), repeats=1, warmup=0)
    assert prof.tied == (((0, 2), 32 * 16 * 4.0),)
    assert prof.meta["gpt"]["layers_n"] == 1 and prof.symbols == ("E", "t", "H")
    assert Profile.loads(json.dumps(prof.to_json())).tied == prof.tied


def test_a_spread_measured_on_a_loaded_machine_is_capped_where_a_profile_reads_it():
    """One repeat 80x the median (another process took the core) gives a spread a profile holds, not one the
    planner refuses: profile's output always loads."""
    from stagewise.plan.search import MAX_SPREAD
    from stagewise.profiling.measure import _spread

    assert _spread([1.0, 1.0, 1.0]) == 0.0
    assert _spread([1.0, 1.1, 1.2]) == pytest.approx(0.1 / 1.1)
    assert _spread([1.0, 1.0, 80.0]) == MAX_SPREAD
