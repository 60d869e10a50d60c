"""The manifest's schema and the run identity it records (no torch, no ranks: checkpoint_manifest.py)."""

from __future__ import annotations

import doctest
import json
from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from stagewise.runtime import RunConfig
from stagewise.runtime.resilience import checkpoint_manifest as manifests
from stagewise.runtime.run.models import GPTConfig

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                 max_size=4), max_leaves=20)


def valid() -> dict:
    """A manifest of the shape a save writes (one layer file, one rank)."""
    cfg = RunConfig(model=GPTConfig(layers_n=1))
    params = {"0.tok.weight": {"layer": 0, "shape": [64, 32], "dtype": "torch.float32"}}
    return {"format": manifests.FORMAT, "step": 2, "world": 1, "optimizer": "AdamW", "layers": 3,
            "saved_at": "2026-01-01T00:00:00+0000",
            "layout": {"schedule": "1f1b", "ranks": 2, "replicas": 1, "microbatches": 4, "stages": 2},
            "data": {"next_step": 2, "batch": 8, "sequences": 16}, "params": params,
            "files": {"layer-00000.pt": {"bytes": 10, "sha256": "a" * 64}},
            "run": manifests.run_section(cfg, manifests.new_run_id(), params, "AdamW")}


def test_a_saved_shape_passes_and_its_run_section_counts_the_parameters():
    m = valid()
    assert manifests.problem(json.loads(json.dumps(m)), "step-00000002") == ""
    assert m["run"]["parameters"] == 64 * 32
    assert m["run"]["model"] == {"class": "GPTConfig", "--layers": 1, "--d-model": 32, "--heads": 4, "--seq": 16,
                                 "--vocab": 64, "--dtype": "float32"}
    assert (m["run"]["seed"], m["run"]["data"]) == (0, {"source": "synthetic"})


@given(JSON)
def test_any_json_value_gets_an_answer_never_an_exception(value):
    assert isinstance(manifests.problem(value, "step-00000002"), str)


@given(st.sampled_from(["step", "world", "layout", "data", "params", "files", "run", "optimizer"]), JSON)
def test_any_value_in_place_of_a_section_is_judged(key, value):
    m = {**valid(), key: value}
    why = manifests.problem(m, "step-00000002")
    assert isinstance(why, str)
    if why:
        assert key in why or why.startswith("step ")


def test_the_differences_name_the_options_and_both_values():
    cfg = RunConfig(model=GPTConfig(layers_n=1))
    run = manifests.run_section(cfg, manifests.new_run_id(), {}, "AdamW")
    assert manifests.differences(run, cfg) == []
    other = RunConfig(model=GPTConfig(layers_n=2, seed=3), schedule="zb-v", ranks=8, batch=64, lr=0.5)
    assert manifests.differences(run, other) == ["--layers 1 there, 2 here", "`seed` 0 there, 3 here"]


@dataclass(frozen=True, kw_only=True)
class OwnModel:
    width: int = 8
    seed: int = 1
    data: str | None = None


def test_a_model_of_its_own_is_identified_by_its_class_and_fields():
    assert manifests.model_identity(OwnModel()) == {"class": "OwnModel", "width": 8}
    assert manifests.model_identity(object()) == {"class": "object"}
    run = manifests.run_section(RunConfig(model=OwnModel()), manifests.new_run_id(), {}, "SGD")
    assert manifests.differences(run, RunConfig(model=OwnModel(width=9))) == ["width 8 there, 9 here"]


def test_the_docstring_example_holds():
    assert doctest.testmod(manifests).failed == 0
