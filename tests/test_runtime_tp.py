"""Tensor parallel's plan (runtime/parallel/tp.py): patterns, styles, the sizes `tp` must divide, said in one line."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cli_helpers import fails  # noqa: E402
from stagewise.runtime import RunConfig, RunError  # noqa: E402
from stagewise.runtime.parallel.tp import TensorParallel, check_plan, matches  # noqa: E402
from stagewise.runtime.run.models import GPTConfig  # noqa: E402
from stagewise.runtime.stages.stage import Stage  # noqa: E402


def test_a_pattern_matches_the_end_of_a_name_with_a_star_for_one_part():
    assert matches("layers.*.self_attn.q_proj", "model.layers.3.self_attn.q_proj")
    assert not matches("layers.*.self_attn.q_proj", "model.layers.3.mlp.q_proj")
    assert matches("fc", "2.fc") and not matches("fc", "2.fc2") and not matches("a.b.c", "b.c")


@pytest.mark.parametrize("plan, words", [
    ([("fc", "colwise")], "`tp_plan` must be a dict of module-name patterns to styles; got list"),
    ({"fc..x": "colwise"}, "`tp_plan` key 'fc..x' is not a module-name pattern"),
    ({"fc": "diagonal"}, "`tp_plan` 'fc': style 'diagonal' is not one of colwise, rowwise"),
    ({"fc": 3}, "`tp_plan` 'fc': a style is a name, a torch ParallelStyle or a function making one; got int"),
])
def test_a_plan_of_the_wrong_shape_is_refused_naming_the_entry(plan, words):
    with pytest.raises(RunError, match=words.replace("(", r"\(").replace(")", r"\)")):
        check_plan(plan)


class FakeMesh:
    """What TensorParallel reads of a tp sub-mesh before it splits anything."""

    def __init__(self, n: int):
        self.n = n

    def size(self) -> int:
        return self.n

    def get_group(self):
        return None


def test_tp_must_divide_the_heads_and_a_plan_is_needed():
    stages = {0: Stage(0, [torch.nn.Linear(6, 6)], 0)}
    with pytest.raises(RunError, match="`tp` 3 does not divide the model's 4 attention heads: tensor parallel gives "
                       "each tp rank the same number of them; use a `tp` that divides 4"):
        TensorParallel(stages, str, FakeMesh(3), plan={"0": "colwise"}, sizes=(("attention heads", 4),))
    with pytest.raises(RunError, match="`tp` 2 needs a `tp_plan`"):
        TensorParallel(stages, str, FakeMesh(2))
    with pytest.raises(RunError, match="give either `tp_plan` or `parallelize`, not both"):
        TensorParallel(stages, str, FakeMesh(2), plan={}, parallelize=lambda s, m: None)


def test_the_options_are_checked_before_any_rank_starts(capsys):
    with pytest.raises(RunError, match="`tp` 3 does not divide the model's 4 attention heads"):
        RunConfig(schedule="1f1b", ranks=2, tp=3, microbatches=2, batch=4, model=GPTConfig(heads=4)).check()
    with pytest.raises(RunError, match="`zero` 1 with `fsdp` 2: FSDP already shards the optimizer state"):
        RunConfig(schedule="1f1b", ranks=2, dp=2, fsdp=2, zero=1, microbatches=2, batch=8).check()
    with pytest.raises(RunError, match="`zero` 1 shards the optimizer state over the `dp` replicas: it needs `dp` >= 2"):
        RunConfig(schedule="1f1b", ranks=2, zero=1).check()
    with pytest.raises(RunError, match="`reshard_after_forward` frees FSDP's gathered layers: it needs `fsdp` >= 2"):
        RunConfig(schedule="1f1b", ranks=2, reshard_after_forward=True).check()
    with pytest.raises(RunError, match="`ep` 2 with `tp`: expert parallel is not composed with FSDP or tensor"):
        RunConfig(schedule="1f1b", ranks=2, ep=2, tp=2, microbatches=2, batch=4).check()
    with pytest.raises(RunError, match="`batch` 4 does not split into `dp` 2 x `fsdp` 2 replicas of `microbatches` 2"):
        RunConfig(schedule="1f1b", ranks=2, dp=2, fsdp=2, microbatches=2, batch=4).check()
    tiny = ["train", "--schedule", "1f1b", "-p", "2", "-m", "2", "--layers", "2", "--d-model", "32"]
    assert "--tp 3 does not divide the model's 4 attention heads" in fails(capsys, *tiny, "--tp", "3")
    assert "--zero 1 shards the optimizer state over the --dp replicas" in fails(capsys, *tiny, "--zero", "1")
    assert "--fsdp 2 needs a --schedule run on ranks" in fails(capsys, "train", "--schedule", "none", "--fsdp", "2")
    assert "argument --fsdp: must be >= 1; got 0" in fails(capsys, *tiny, "--fsdp", "0")


def test_a_hugging_face_model_says_which_heads_tp_must_divide(tmp_path):
    pytest.importorskip("transformers")
    from hf_helpers import CONFIGS, write_config
    from stagewise.hf.hf_run import HFRun

    model = HFRun(source=str(write_config(tmp_path / "config.json", **CONFIGS["llama"])), seq=16)
    assert model.layers().tp_plan["layers.*.self_attn.q_proj"] == "colwise"  # the model's own base_model_tp_plan
    with pytest.raises(RunError, match="`tp` 4 does not divide the model's 2 key/value heads"):
        RunConfig(schedule="1f1b", ranks=2, tp=4, microbatches=2, batch=4, model=model).check()


def test_a_plan_that_matches_nothing_and_bad_optimizer_state_are_refused_naming_them():
    """One launch of 2 ranks: tp_plan patterns that match no module (every rank's layers counted), and the
    optimizer and optimizer-state arguments of Pipeline.optimizer_state_dict / load_optimizer_state_dict."""
    import stagewise
    from api_helpers import state_and_plan_mistakes

    got = stagewise.launch(state_and_plan_mistakes, 2, threads=1)
    name = got["exp_avg"].removeprefix("state.").removesuffix(".exp_avg")
    expected = {
        "empty plan": "`tp_plan` is empty, so tensor parallel would shard nothing",
        "no match": "`tp_plan` pattern 'nope' matches no module of the model",
        "one of two": "`tp_plan` pattern 'head.out' matches no module of the model",
        "stray optimizer": "`optimizer` holds a tensor of shape (3,) that is not one of this pipeline rank's "
                           "parameters (its state would not be saved); build it over pipe.parameters()",
        "not an optimizer": "`optimizer` must be a torch.optim.Optimizer over this rank's parameters; got Pipeline",
        "state 5": "`state` key 'state' is not state.NAME.KEY or param_groups.NAME.KEY",
        "not a dict": "`state` must be a dict in optimizer_state_dict's form",
        "wrong shape": f"`state` 'state.{name}.exp_avg' has shape (7,); the optimizer's is ",
        "not a tensor": f"`state` 'state.{name}.exp_avg' is str; the optimizer keeps a tensor of shape",
        "missing": f"`state` has no 'state.{name}.exp_avg' (AdamW keeps it for every parameter)",
    }
    for label, words in expected.items():
        assert got[label] is not None and words in got[label], (label, got[label])
    assert got["round trip"] is None
