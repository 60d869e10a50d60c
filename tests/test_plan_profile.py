"""Profiles: JSON round-trip, clear errors for bad files, and measuring a user model's layers."""

import json
import sys
from pathlib import Path

import pytest

from stagewise.plan.search import Profile, ProfileError

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
    (lambda d: {**d, "layers": [{**d["layers"][0], "t_b": [1.0, -2.0]}]}, "t_b must be finite numbers from 0 to 1e+06 seconds"),
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
    from stagewise.plan.cluster import ExpertParallel, TensorParallel, analytic_profile
    from stagewise.plan.cluster import Hardware
    from stagewise.plan.cluster import TransformerSpec

    prof = analytic_profile(TransformerSpec.load("deepseek-v3"), Hardware.load("h800"), TensorParallel(t=1), (1, 2),
                            expert=ExpertParallel(ep=8))
    prof.save(tmp_path / "moe.json")
    back = Profile.load(tmp_path / "moe.json")
    assert back.layers == prof.layers and back.layers[10].a2a and back.layers[10].expert_param_bytes > 0


def test_unknown_micro_batch_size():
    with pytest.raises(ProfileError, match="micro-batch size 3 was not profiled; the profile has 1, 2"):
        gpt_profile().size_index(3)
