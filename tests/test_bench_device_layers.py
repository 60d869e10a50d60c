"""benchmarks/bench_device_layers.py, the GPU check, runs end to end at tiny widths on CPU between loans."""

import json
import sys

import pytest

import docs_helpers as docs

pytest.importorskip("transformers")
sys.path.insert(0, str(docs.ROOT / "benchmarks"))
import bench_device_layers as bench  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def test_tiny_run_measures_and_prices_every_case(tmp_path, capsys):
    out = tmp_path / "rows.json"
    assert bench.main(["--tiny", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["model"], r["experts"], r["mbs"]) for r in rows] == [
        ("llama3-8b", None, 1), ("llama3-8b", None, 2), ("qwen3-235b-a22b", 16, 1), ("qwen3-235b-a22b", 16, 2),
        ("qwen3-235b-a22b", 4, 1), ("qwen3-235b-a22b", 4, 2)]
    # an EP rank's work: 16 tokens x top-8 over 16 local experts, x top-4 over 4
    assert [r["tokens_per_expert"] for r in rows[2:]] == [8, 16, 16, 32]
    for r in rows:
        for measured, predicted in (r["f"], r["b"], r["kept"]):
            assert measured > 0 and predicted > 0
    # twice the micro-batch keeps about twice the bytes, measured and predicted alike
    for one, two in zip(rows[::2], rows[1::2]):
        for k in (0, 1):
            assert two["kept"][k] == pytest.approx(2 * one["kept"][k], rel=0.15)
    assert "qwen3-235b-a22b 16 experts top-8 s16" in capsys.readouterr().out


def test_the_hf_config_has_the_spec_widths():
    spec = bench.spec_for(bench.CASES[1], tiny=False)
    raw = bench.hf_config(spec)
    assert raw["model_type"] == "qwen3_moe" and raw["num_hidden_layers"] == 2
    assert (raw["hidden_size"], raw["head_dim"], raw["num_key_value_heads"]) == (4096, 128, 4)
    assert (raw["num_experts"], raw["num_experts_per_tok"], raw["moe_intermediate_size"]) == (16, 8, 1536)
    assert bench.hf_config(bench.spec_for(bench.CASES[0], tiny=False))["intermediate_size"] == 14336


def test_without_cuda_it_says_so_and_stops(capsys, monkeypatch):
    monkeypatch.setattr(bench, "_has_cuda", lambda: False)
    assert bench.main([]) == 0
    assert "no CUDA device here" in capsys.readouterr().out
