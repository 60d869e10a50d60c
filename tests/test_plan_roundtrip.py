"""Plan -> run: the `stagewise train` line the planner prints, shrunk to CPU size, runs and equals the unpipelined run.

Three planner requests with `--framework stagewise` (Llama 3 405B on 16,384 H100s and Llama 3 8B on 64, dense;
Mixtral 8x7B on 256, MoE): from each, the recommended row and the best row of another layout kind (schedule
family and the dimensions used), one representative per composition kind (pp x dp x tp with ZeRO-1, pp x dp
x ep with ZeRO-1, pp x dp with ZeRO-1). Each printed line is shrunk keeping the shape of its degrees (a
degree > 1 becomes 2, dp then doubled up to 8 ranks), its model a tiny Hugging Face one of the same kind
(Llama, Mixtral), its micro-batches, batch, sequence and v cut to fit, float32 instead of bfloat16 (so the
losses compare at 1e-4), and the split even; everything else is the line as printed, parsed by `stagewise
train`'s own parser. One launch of 8 ranks runs all three; each equals the unpipelined run of its model.

MoE model files (a Qwen3-MoE-like one, every block MoE, and a DeepSeek-V3-like one, a dense block first) are
planned at 8 GPUs through `stagewise plan --json` and their lines run as printed, the split included (its
symbols must be the ones `train --hf` names: `m` for an MoE block), only the placeholders and the dtype replaced.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from hf_helpers import save_tiny  # noqa: E402

from stagewise import Parallelism  # noqa: E402
from stagewise.parallelism import DIMS  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

REQUESTS = [("llama3-405b", 16384, "16M", "llama"), ("mixtral-8x7b", 256, "4M", "mixtral"),
            ("llama3-8b", 64, "2M", "llama")]
WORLD, M, SEQ = 8, 4, 16


@lru_cache(maxsize=None)
def planned(model: str, gpus: int, tokens: str):
    from stagewise.cli.plan_cluster import parse_tokens
    from stagewise.plan.cluster import Hardware, Job, TransformerSpec, cluster_search
    from stagewise.plan.cluster.overlap_rules import framework
    from stagewise.plan.search import Space

    job = Job(spec=TransformerSpec.load(model), hardware=Hardware.load("h100"), gpus=gpus,
              global_batch_tokens=parse_tokens(tokens), space=Space(chunks=(2, 4, 8)),
              frameworks=(framework("stagewise"),))
    return job, cluster_search(job, keep=12).ranking


def kind(c) -> tuple:
    """A row's layout kind: its schedule family and the dimensions it uses."""
    return (c.config.family, *composition(c.parallelism))


def composition(par: Parallelism) -> tuple:
    """What composes: the dimensions used besides pp, and ZeRO."""
    return tuple(d for d in par.dims() if d != "pp"), par.zero


def shrink(par: Parallelism) -> Parallelism:
    """The same shape at CPU size: each degree > 1 becomes 2, then dp doubles while the world is under 8."""
    small = dataclasses.replace(par, **{d: 2 if getattr(par, d) > 1 else 1 for d in DIMS})
    while small.world < WORLD and small.dp > 1 and par.dp % (2 * small.dp) == 0:
        small = dataclasses.replace(small, dp=2 * small.dp)
    return small


def shrunk_argv(argv: list[str], par: Parallelism, small: Parallelism, folder: str, text: str) -> list[str]:
    """The printed options with the sizes replaced: the degrees (as ``Parallelism.flags`` printed them), the
    model and data placeholders, -m, -v, --batch, --seq, --dtype; --split dropped (tiny models split evenly)."""
    flags = par.flags()
    assert " ".join(flags) in " ".join(argv), (flags, argv)  # the line carries the candidate's degrees as such
    sizes = {"--hf": folder, "--data": text, "-m": str(M), "--seq": str(SEQ), "--dtype": "float32",
             "--batch": str(M * small.data_shards)}
    out, k = [], 0
    while k < len(argv):
        a = argv[k]
        if argv[k:k + len(flags)] == flags:
            out += small.flags()
            k += len(flags)
        elif a == "--split":
            k += 2
        elif a == "-v":
            out += ["-v", str(min(int(argv[k + 1]), 2))]
            k += 2
        elif a in sizes:
            out += [a, sizes[a]]
            k += 2
        else:
            out.append(a)
            k += 1
    return out


def run_config(argv: list[str]):
    """The RunConfig `stagewise train ARGV` runs (its own parser and option handling)."""
    from stagewise.cli import build_parser, train, train_moe, train_safety, train_scale

    args = build_parser().parse_args(["train", *argv])
    return train_scale.apply(train_moe.apply(train_safety.apply(train.config_from(args), args), args), args)


def representatives():
    """(label, planned Parallelism, printed argv, model kind): the recommended row and the best row of another
    kind of each request, one per composition kind."""
    from stagewise.plan.cluster.frameworks import stagewise_train_argv

    out, seen = [], set()
    for model, gpus, tokens, tiny in REQUESTS:
        job, ranking = planned(model, gpus, tokens)
        rows = [c for c in ranking if c.framework == "stagewise"]
        other = next((c for c in rows if composition(c.parallelism) != composition(rows[0].parallelism)), None) \
            or next(c for c in rows if kind(c) != kind(rows[0]))  # another composition, else another family
        for role, c in (("recommended", rows[0]), ("another kind", other)):
            if composition(c.parallelism) not in seen:
                seen.add(composition(c.parallelism))
                out.append((f"{model} {role}: {c.parallelism} {c.config.family}", c.parallelism,
                            stagewise_train_argv(c, job, None), tiny))
    return out


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("roundtrip")
    text = root / "train.txt"
    text.write_text("A pipeline keeps every rank busy when the schedule is good. " * 40)
    return {k: str(save_tiny(k, root / k, num_hidden_layers=4)) for k in ("llama", "mixtral")}, str(text)


def test_the_printed_lines_shrunk_run_and_equal_the_unpipelined_run(folders):
    from stagewise.runtime.run.train import train, train_many

    paths, text = folders
    reps = representatives()
    assert {composition(p) for _, p, _, _ in reps} >= {(("dp", "tp"), 1), (("dp", "ep"), 1), (("dp",), 1)}
    cfgs = []
    for label, par, argv, tiny in reps:
        small = shrink(par)
        assert small.world == WORLD and small.dims() == par.dims() and small.zero == par.zero, (label, small)
        cfg = run_config(shrunk_argv(argv, par, small, paths[tiny], text))
        assert cfg.parallelism == small, (label, cfg.parallelism)
        cfgs.append(dataclasses.replace(cfg, steps=2, measure_memory=False, timeout=120))
    got = train_many(cfgs)
    for (label, *_), cfg, res in zip(reps, cfgs, got):
        alone = train(dataclasses.replace(cfg, schedule=None, csv=None, chunks=None, parallelism=Parallelism(pp=1),
                                          recompute=False))
        assert res.parallelism == cfg.parallelism
        for a, b in zip(res.losses, alone.losses, strict=True):
            assert abs(a - b) <= 1e-4 * abs(b), (label, res.losses, alone.losses)


#: model files of the tiny HF MoE models' shape: every block MoE (Qwen3-MoE), and a dense first block before
#: MoE ones with MLA and a shared expert (DeepSeek-V3), so the printed split names both kinds of block
MODEL_FILES = {
    "qwen3_moe": {"layers": 2, "head_dim": 16, "kv_heads": 2, "moe": {"experts": 4, "top_k": 2, "expert_ffn": 32}},
    "deepseek_v3": {"layers": 3, "kv_heads": 4, "moe": {"experts": 4, "top_k": 2, "expert_ffn": 32, "shared_experts": 1,
                                                        "dense_layers": 1},
                    "mla": {"q_lora_rank": 32, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
                            "v_head_dim": 16}},
}


def test_a_moe_model_files_printed_line_runs_as_printed_and_equals_the_unpipelined_run(tmp_path, folders):
    """`plan --model FILE.json` of an MoE model file -> its stagewise line, split and all (only the placeholders
    and the dtype replaced), through `stagewise train`'s parser -> equal to the unpipelined run."""
    import json
    import shlex

    from stagewise.cli import main
    from stagewise.runtime.run.train import train, train_many

    _, text = folders
    cfgs, splits = [], []
    for kind, shape in MODEL_FILES.items():
        hf = save_tiny(kind, tmp_path / kind, num_hidden_layers=shape["layers"])
        model = tmp_path / f"{kind}.json"
        model.write_text(json.dumps({"format": "stagewise-model", "version": 1, "name": f"tiny-{kind}", "hidden": 64,
                                     "heads": 4, "ffn": 128, "vocab": 256, "seq": SEQ, "mlp": "swiglu",
                                     "tied_embeddings": False, **shape}))
        out = tmp_path / f"{kind}-plan.json"
        assert main(["plan", "--model", str(model), "--hardware", "h100", "--gpus", str(WORLD), "--pipeline", "2",
                     "--global-batch-tokens", "512", "--framework", "stagewise", "--json", "-o", str(out)]) == 0
        line = shlex.split(json.loads(out.read_text())["frameworks"]["stagewise"]["command"])
        argv = line[line.index("train") + 1:]
        splits.append(argv[argv.index("--split") + 1])
        sizes = {"MODEL_FOLDER": str(hf), "TEXT_FILE": text, "bfloat16": "float32"}
        cfg = run_config([sizes.get(a, a) for a in argv])
        assert cfg.parallelism.world == WORLD, (kind, cfg.parallelism)
        cfgs.append(dataclasses.replace(cfg, steps=2, measure_memory=False, timeout=120))
    assert "m" in splits[0] and "t" not in splits[0] and "E+t+m" in splits[1].replace(" ", ""), splits
    for kind, cfg, res in zip(MODEL_FILES, cfgs, train_many(cfgs)):
        alone = train(dataclasses.replace(cfg, schedule=None, csv=None, chunks=None, parallelism=Parallelism(pp=1),
                                          recompute=False))
        for a, b in zip(res.losses, alone.losses, strict=True):
            assert abs(a - b) <= 1e-4 * abs(b), (kind, res.losses, alone.losses)
