"""The Hugging Face mixtures of experts (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V3) through the HF adapter.

In one process: each family's layers equal transformers' own model (loss and every gradient), read from the
files transformers writes (one tensor per expert; hf/experts.py stacks them) or from stacked tensors, with
HF's names and parameter count; a bad MoE field is refused naming it. On 2 ranks (one launch): every family
under dualpipe-v and zb-v, and at pp 1 x ep 2 (its stacked experts sharded over the two ranks, moved by
all-to-all), and Mixtral under every other schedule, equal transformers' unpipelined model on
the whole batch, step 1's gradients and 2 SGD steps (relative 1e-4); the pipeline saved as an HF folder
loads into transformers with the pipeline's logits.
"""

import shutil
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parent))
from hf_helpers import batch, hf_model, moe_cases, plain_loop, save_and_logits, save_tiny, write_config  # noqa: E402

import stagewise  # noqa: E402
from stagewise.hf import load  # noqa: E402
from stagewise.hf.errors import HFError  # noqa: E402
from stagewise.runtime.stages.stage import stage_ranges  # noqa: E402
from stagewise.schedules.registry import whole_names  # noqa: E402

#: every family of whole micro-batches (a sliced family at one slice is its plain family: tests/test_slices.py)
FAMILIES_RUN = whole_names()

KINDS = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3")
STEPS, ROWS, SEQ, LR = 2, 8, 16, 0.1


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("hfmoe")
    text = root / "train.txt"
    text.write_text("Experts take the tokens routed to them; the rest pass them by. " * 30)
    return root, str(text), {kind: save_tiny(kind, root / kind) for kind in KINDS}


def rel(a, b) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def stagewise_grads(model, ids):
    """The adapter's layers run in one process: (loss, {HF name: gradient})."""
    layers = model.layers()
    h = ids
    for layer in layers:
        h = layer.train()(h)
    loss = model.loss(h, ids)
    loss.backward()
    return loss.item(), {hf: layer.get_parameter(local).grad for i, layer in enumerate(layers)
                         for local, hf in model.names(i, layer).items()}


@pytest.mark.parametrize("kind", KINDS)
def test_each_family_equals_transformers_with_hf_names(folders, kind):
    _, _, paths = folders
    ref = hf_model(paths[kind])
    ids = batch(2)
    out = ref(ids, labels=ids)
    out.loss.backward()
    model = load(paths[kind])
    loss, grads = stagewise_grads(model, ids)
    assert loss == pytest.approx(out.loss.item(), rel=1e-5)
    named = dict(ref.named_parameters())
    assert set(grads) == set(named) - ({"lm_head.weight"} if model.tied else set())
    for name, g in grads.items():
        assert rel(g, named[name].grad) < 1e-5, name
    assert model.parameter_count == sum(p.numel() for p in ref.parameters())
    sparse = [type(layer.mlp).__name__.endswith(("SparseMoeBlock", "MoE")) for layer in ref.model.layers]
    assert model.symbols[1:-2] == ["m" if s else "t" for s in sparse]
    assert "t" in model.symbols or kind in ("mixtral", "qwen3_moe")


def test_stacked_and_per_expert_files_give_the_same_layers(folders, tmp_path):
    from safetensors.torch import save_file

    _, _, paths = folders
    ref = hf_model(paths["mixtral"])
    files = set(__import__("safetensors").safe_open(paths["mixtral"] / "model.safetensors", "pt").keys())
    assert "model.layers.0.block_sparse_moe.experts.3.w2.weight" in files  # transformers writes Mixtral's own format
    stacked = tmp_path / "stacked"
    stacked.mkdir()
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, stacked / "model.safetensors",
              metadata={"format": "pt"})
    (stacked / "config.json").write_text((paths["mixtral"] / "config.json").read_text())
    a, b = load(paths["mixtral"]), load(stacked)
    for i in range(a.num_layers):
        sa, sb = a.layer(i).state_dict(), b.layer(i).state_dict()
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa), i
    assert torch.equal(a.layer(1).mlp.experts.gate_up_proj, ref.model.layers[0].mlp.experts.gate_up_proj)


@pytest.mark.parametrize("kind, over, needle", [
    ("mixtral", {"num_experts_per_tok": 5}, "num_experts_per_tok is 5; a token goes to at most num_local_experts (4)"),
    ("qwen2_moe", {"output_router_logits": True}, "output_router_logits is True; transformers then adds its load-bal"),
    ("qwen3_moe", {"mlp_only_layers": [7]}, "mlp_only_layers is [7]; it must list decoder layer numbers 0..1"),
    ("deepseek_v3", {"n_group": 3}, "n_group is 3; it must divide n_routed_experts (4) into groups of at least 2"),
    ("deepseek_v3", {"topk_group": 3}, "topk_group is 3; a token's experts come from at most n_group (2) groups"),
    ("mixtral", {"num_local_experts": 0}, "num_local_experts is 0; it must be a whole number >= 1"),
    ("deepseek_v3", {"routed_scaling_factor": float("nan")}, "routed_scaling_factor is nan; it must be a finite "
                                                              "number > 0"),
    ("mixtral", {"router_jitter_noise": -0.5}, "router_jitter_noise is -0.5; it must be a finite number >= 0"),
])
def test_a_bad_moe_field_is_refused_naming_it(tmp_path, kind, over, needle):
    from hf_helpers import CONFIGS

    path = write_config(tmp_path / "config.json", **{**CONFIGS[kind], **over})
    with pytest.raises(HFError) as e:
        load(path)
    assert needle in str(e.value)


def test_a_deepseek_folder_without_its_router_bias_is_refused_naming_it(folders, tmp_path, capsys):
    """The router's ``e_score_correction_bias`` is learned state (a persistent buffer transformers saves): a folder
    with weights but without it is incomplete, refused before any rank, never trained from zeros."""
    from safetensors.torch import load_file, save_file

    from cli_helpers import fails

    root, text, paths = folders
    bare = shutil.copytree(paths["deepseek_v3"], tmp_path / "bare")
    tensors = load_file(str(bare / "model.safetensors"))
    assert "model.layers.1.mlp.gate.e_score_correction_bias" in tensors  # what save_pretrained wrote
    save_file({k: v for k, v in tensors.items() if "e_score_correction_bias" not in k}, str(bare / "model.safetensors"),
              metadata={"format": "pt"})
    with pytest.raises(HFError, match="tensor model.layers.1.mlp.gate.e_score_correction_bias is missing"):
        load(bare)
    err = fails(capsys, "train", "--hf", str(bare), "--data", text, "--schedule", "1f1b", "-p", "2", "--seq", "16",
                "-m", "2", "--batch", "4", "--steps", "1")
    assert "e_score_correction_bias is missing from the checkpoint" in err


# ---- pipelined on 2 ranks (one launch)

CASES = [(name, 4, 2 if name in ("interleaved-1f1b", "looped-bfs") else None) for name in FAMILIES_RUN] \
    + [("1f1b", 4, None, 2)]  # pp 1 x ep 2: the stacked experts sharded over the two ranks


@pytest.fixture(scope="module")
def pipelined(folders):
    _, text, paths = folders
    wanted = {kind: (str(paths[kind]), {"dualpipe-v", "zb-v", "ep"} | (set(FAMILIES_RUN) if kind == "mixtral" else set()))
              for kind in KINDS}
    return stagewise.launch(moe_cases, 2, wanted, text, CASES, STEPS, ROWS, SEQ, LR, threads=1, timeout=120)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", KINDS)
def test_every_moe_family_pipelined_equals_transformers(folders, pipelined, kind):
    _, text, paths = folders
    want_losses, want_grads, want_state = plain_loop(paths[kind], text, STEPS, ROWS, SEQ, LR)
    got = pipelined[kind]["cases"]
    assert {c[0] for c in got} == ({"dualpipe-v", "zb-v", "1f1b"} | (set(FAMILIES_RUN) if kind == "mixtral" else set()))
    assert ("1f1b", 4, None, 2) in got
    for case, (losses, grads, state, _) in got.items():
        if len(case) == 4:  # ep: each rank's gradient of its experts' share; the shares in ep order are the whole
            grads = {n: [torch.cat(c)] if ".experts." in n else c for n, c in grads.items()}
        for a, b in zip(losses, want_losses, strict=True):
            assert abs(a - b) <= 1e-4 * abs(b), (case, losses, want_losses)
        assert set(grads) == set(want_grads) - {"lm_head.weight"} or set(grads) == set(want_grads), case
        for name, copies in grads.items():
            for g in copies:
                assert rel(g, want_grads[name]) < 1e-4, (case, name, rel(g, want_grads[name]))
        for name, ref in want_state.items():
            if name in state:
                assert rel(state[name], ref) < 1e-4, (case, name)
        assert {n for n in want_state if ".experts." in n} <= set(state), case
    model = load(paths[kind])
    for case, names_per_rank in pipelined[kind]["reads"].items():  # each rank read its own layers' pieces only
        if len(case) == 4:
            continue  # pp 1 x ep 2: both ranks read every layer
        sched = stagewise.generate(case[0], 2, case[1], case[2])
        ranges = stage_ranges(sched, model.num_layers)
        for r, names in enumerate(names_per_rank):
            mine = {i for s in sched.stages_of_rank(r) for i in ranges[s]}
            assert set(names) == stored_pieces(model, mine), (kind, case, r)


def stored_pieces(model, layers) -> set:
    """The folder's tensors that make these layers (per-expert pieces of the stacked experts, stored buffers)."""
    from stagewise.hf.experts import sources

    ck, out = model.checkpoint(), set()
    for i in layers:
        module = model.layer(i, "meta")
        for local, p in module.named_parameters():
            hf = model.source(f"{model.prefixes[i]}.{local}")
            out |= {piece.name for piece in sources(model.config.model_type, hf, tuple(p.shape), ck.tensors)}
        out |= {f"{model.prefixes[i]}.{b}" for b, _ in module.named_buffers()
                if f"{model.prefixes[i]}.{b}" in ck.tensors}
    return out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_pipelined_mixtral_saved_as_an_hf_folder_loads_into_transformers(folders):
    from transformers import AutoModelForCausalLM

    root, text, paths = folders
    out = root / "saved-mixtral"
    got = stagewise.launch(save_and_logits, 2, str(paths["mixtral"]), text, str(out), "dualpipe-v", 4, SEQ, threads=1)
    back = AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        assert rel(back(got["ids"]).logits, got["logits"]) < 1e-6
    assert "model.layers.0.mlp.experts.gate_up_proj" in back.state_dict()
