"""Plan -> run: the `stagewise train` line the planner prints, shrunk to CPU size, runs and equals the unpipelined run.

Three planner requests with `--framework stagewise` (Llama 3 405B on 16,384 H100s and Llama 3 8B on 64, dense;
Mixtral 8x7B on 256, MoE): from each, the recommended row and the best row of another layout kind (schedule
family and the dimensions used), one representative per composition kind (pp x dp x tp with ZeRO-1, pp x dp
x ep with ZeRO-1, pp x dp with ZeRO-1). Each printed line is shrunk keeping the shape of its degrees (a
degree > 1 becomes 2, dp then doubled up to 8 ranks), its model a tiny Hugging Face one of the same kind
(Llama, Mixtral), its micro-batches, batch, sequence and v cut to fit, float32 instead of bfloat16 (so the
losses compare at 1e-4), and the split even; everything else is the line as printed, parsed by `stagewise
train`'s own parser. One launch of 8 ranks runs all three; each equals the unpipelined run of its model.
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
    from stagewise.plan.cluster.overlap import framework
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
