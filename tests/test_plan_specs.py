"""Model and hardware files: shipped entries, their numbers, and one clear message per bad field."""

import json

import pytest

from stagewise.plan.cluster import SpecError, shipped
from stagewise.plan.cluster import Hardware
from stagewise.plan.cluster import TransformerSpec


def test_shipped_entries_load_with_sources():
    assert {"a100", "h100", "h200", "b200"} <= set(shipped("hardware"))
    assert {"gpt3-175b", "gpt-1t", "llama3-8b", "llama3-70b", "llama3-405b"} <= set(shipped("models"))
    for name in shipped("hardware"):
        hw = Hardware.load(name)
        assert 0 < hw.efficiency <= 1 and hw.gpus_per_node == 8
        assert {"peak_flops", "memory", "memory_bandwidth", "intra", "inter", "efficiency"} <= set(hw.sources)


@pytest.mark.parametrize("name, billions", [("gpt3-175b", 175), ("gpt-1t", 1008), ("gpt-145b", 145.6),
                                            ("llama3-8b", 8.0), ("llama3-70b", 70.6), ("llama3-405b", 405.9)])
def test_parameter_counts_match_the_papers(name, billions):
    assert TransformerSpec.load(name).params() / 1e9 == pytest.approx(billions, rel=0.01)


def test_model_flops_are_six_per_parameter_plus_attention():
    s = TransformerSpec.load("gpt3-175b")
    dense = 6 * s.params()  # tied: the one vocabulary matrix is a lookup in and a matmul out
    attention = 12 * s.layers * s.hidden * s.seq
    assert s.model_flops_per_token() == pytest.approx(dense + attention, rel=0.002)


def write(tmp_path, data, name="x.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


MODEL = {"format": "stagewise-model", "version": 1, "name": "tiny", "layers": 4, "hidden": 64, "heads": 4,
         "kv_heads": 2, "ffn": 256, "vocab": 100, "seq": 32}


@pytest.mark.parametrize("change, words", [
    ({"hidden": 66}, "hidden (66) must be a multiple of heads (4)"),
    ({"kv_heads": 3}, "kv_heads (3) must divide heads (4)"),
    ({"layers": 0}, "layers must be > 0; got 0"),
    ({"ffn": 2.5}, "ffn must be a whole number; got 2.5"),
    ({"seq": "long"}, "seq must be a finite number; got 'long'"),
    ({"mlp": "relu"}, "mlp must be one of gelu, swiglu; got 'relu'"),
    ({"dropout": "yes"}, "dropout must be true or false"),
    ({"format": "other"}, "not a models file"),
    ({"version": 2}, "version 2"),
])
def test_bad_model_file_names_field_value_and_rule(tmp_path, change, words):
    path = write(tmp_path, {**MODEL, **change})
    with pytest.raises(SpecError, match="--model") as e:
        TransformerSpec.load(path)
    assert words in str(e.value)


def test_missing_field_and_unknown_name(tmp_path):
    data = dict(MODEL)
    del data["vocab"]
    with pytest.raises(SpecError, match="lacks the field 'vocab'"):
        TransformerSpec.load(write(tmp_path, data))
    with pytest.raises(SpecError, match="no such file and not a shipped name; shipped: .*llama3-405b"):
        TransformerSpec.load("llama9")
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(SpecError, match="not JSON"):
        TransformerSpec.load(str(tmp_path / "bad.json"))


def test_bad_hardware_file(tmp_path):
    good = json.loads(json.dumps({"format": "stagewise-hardware", "version": 1, "peak_flops": 1e12, "memory": 1e9,
                                  "memory_bandwidth": 1e11, "gpus_per_node": 8, "efficiency": 0.5,
                                  "intra": {"bandwidth": 1e11, "latency": 1e-6},
                                  "inter": {"bandwidth": 1e10, "latency": 1e-5}}))
    assert Hardware.load(write(tmp_path, good)).rate == 0.5e12
    for change, words in [({"efficiency": 1.5}, "efficiency must be <= 1; got 1.5"),
                          ({"peak_flops": -1}, "peak_flops must be > 0"),
                          ({"gpus_per_node": 0}, "gpus_per_node must be > 0"),
                          ({"inter": {"bandwidth": 0, "latency": 0}}, "inter: bandwidth must be > 0"),
                          ({"intra": 5}, "intra must be an object")]:
        with pytest.raises(SpecError, match="--hardware") as e:
            Hardware.load(write(tmp_path, {**good, **change}))
        assert words in str(e.value)
