"""Profiles: JSON round-trip, clear errors for bad files, and measuring a user model's layers."""

import json
import sys
from pathlib import Path

import pytest

from stagewise.plan.profile import Profile, ProfileError

sys.path.insert(0, str(Path(__file__).parent))
from plan_fixtures import gpt_profile  # noqa: E402


def test_save_load_round_trip(tmp_path):
    prof = gpt_profile(blocks=3)
    path = tmp_path / "p.json"
    prof.save(path)
    back = Profile.load(path)
    assert back == prof
    assert back.symbols == ("E", "t", "t", "t", "H")


@pytest.mark.parametrize("mutate, words", [
    (lambda d: "{not json", "not JSON"),
    (lambda d: {**d, "format": "other"}, "not a stagewise profile"),
    (lambda d: {k: v for k, v in d.items() if k != "layers"}, "lacks the field 'layers'"),
    (lambda d: {**d, "layers": [{k: v for k, v in d["layers"][0].items() if k != "t_w"}]},
     "layers[0] lacks the field 't_w'"),
    (lambda d: {**d, "layers": [{**d["layers"][0], "t_f": [1.0]}]}, "t_f has 1 values; micro_batch_sizes has 2"),
    (lambda d: {**d, "layers": [{**d["layers"][0], "t_b": [1.0, -2.0]}]}, "t_b must be finite numbers >= 0"),
    (lambda d: {**d, "micro_batch_sizes": []}, "micro_batch_sizes must be a non-empty list"),
    (lambda d: {**d, "link": {"latency": 0.0, "bandwidth": 0}}, "link.bandwidth must be > 0"),
    (lambda d: {**d, "version": 9}, "version 9"),
    (lambda d: {**d, "layers": [{**d["layers"][0], "a2a": [1.0]}]}, "a2a must be 2 finite numbers >= 0"),
])
def test_bad_profiles_are_named(mutate, words):
    data = gpt_profile(blocks=1).to_json()
    data = json.loads(json.dumps(data))
    bad = mutate(data)
    text = bad if isinstance(bad, str) else json.dumps(bad)
    with pytest.raises(ProfileError) as e:
        Profile.loads(text, "x.json")
    assert words in str(e.value) and "x.json" in str(e.value)


def test_an_moe_profile_keeps_its_all_to_all_and_expert_bytes_through_a_file(tmp_path):
    from stagewise.plan.analytic import ExpertParallel, TensorParallel, analytic_profile
    from stagewise.plan.hardware import Hardware
    from stagewise.plan.transformer import TransformerSpec

    prof = analytic_profile(TransformerSpec.load("deepseek-v3"), Hardware.load("h800"), TensorParallel(t=1), (1, 2),
                            expert=ExpertParallel(ep=8))
    prof.save(tmp_path / "moe.json")
    back = Profile.load(tmp_path / "moe.json")
    assert back.layers == prof.layers and back.layers[10].a2a and back.layers[10].expert_param_bytes > 0


def test_unknown_micro_batch_size():
    with pytest.raises(ProfileError, match="micro-batch size 3 was not profiled; the profile has 1, 2"):
        gpt_profile().size_index(3)


def test_measure_a_user_sequence_of_layers():
    """Any sequence of layers: times > 0, split backward parts measured, bytes counted, same-shape layers shared."""
    torch = pytest.importorskip("torch")
    from torch import nn

    from stagewise.runtime.profiling.measure import profile_model
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
    Profile.loads(json.dumps(prof.to_json()))  # what it writes, it reads


def test_measure_finds_the_tied_embedding_of_the_built_in_gpt():
    pytest.importorskip("torch")
    from stagewise.runtime.profiling.measure import profile_model
    from stagewise.runtime.run.models import GPTConfig

    gpt = GPTConfig(layers_n=1, d_model=16, heads=2, seq=8, vocab=32)
    prof = profile_model(gpt, (1,), repeats=1, warmup=0)
    assert prof.tied == (((0, 2), 32 * 16 * 4.0),)
    assert prof.meta["gpt"]["layers_n"] == 1 and prof.symbols == ("E", "t", "H")
    assert Profile.loads(json.dumps(prof.to_json())).tied == prof.tied


def test_link_fit():
    from stagewise.runtime.profiling.link import fit_link

    lat, bw = fit_link([(1e3, 1e-5 + 1e3 / 1e9), (1e6, 1e-5 + 1e6 / 1e9), (4e6, 1e-5 + 4e6 / 1e9)])
    assert lat == pytest.approx(1e-5, rel=1e-6) and bw == pytest.approx(1e9, rel=1e-6)
    lat, bw = fit_link([(1e3, 2e-3), (4e6, 2e-3)])  # latency-bound: the bandwidth is only bounded below
    assert lat == pytest.approx(2e-3) and bw >= 4e6 / 2e-3
