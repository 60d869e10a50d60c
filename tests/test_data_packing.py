"""The packer (stagewise.data): rows of a token budget, balance across ranks and micro-batches, the tensors a
packed micro-batch is, and the built-in GPT's packed attention equal to each document run alone."""

from __future__ import annotations

import doctest
import random
import subprocess
import sys
from pathlib import Path

import pytest

from stagewise.data import DataError, fitting, pack, packing, wikipedia

ROOT = Path(__file__).parents[1]


def test_the_modules_examples_hold():
    from stagewise.data import tensors

    for mod in (packing, tensors, wikipedia):
        assert doctest.testmod(mod).failed == 0, mod.__name__


def test_the_planning_part_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "from stagewise.data import pack, fitting; from stagewise.data import wikipedia\n"
            "print(pack([3, 5, 2], budget=8, microbatches=2).tokens)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "10", done.stderr[-2000:]


def test_every_document_lands_once_within_the_budget():
    rng = random.Random(0)
    for _ in range(200):
        budget = rng.randint(4, 64)
        lengths = [rng.randint(1, budget) for _ in range(rng.randint(0, 40))]
        p = pack(lengths, budget, ranks=rng.randint(1, 3), microbatches=rng.randint(1, 4))
        placed = sorted(d for row in p.rows for d in row.documents)
        assert placed == list(range(len(lengths)))
        assert all(row.tokens <= budget and row.lengths == tuple(lengths[d] for d in row.documents)
                   for row in p.rows)
        assert p.tokens == sum(lengths) and len(p.rows) % (p.ranks * p.microbatches) == 0


def test_tokens_balance_across_ranks_and_across_each_ranks_microbatches():
    """The rule: ranks' tokens differ by at most one row's (budget), and so do one rank's micro-batches; and
    dealing beats handing rows out in their first-fit order."""
    rng = random.Random(1)
    better = 0
    for _ in range(300):
        budget, ranks, m = rng.choice((16, 64, 512)), rng.randint(1, 4), rng.randint(1, 6)
        lengths = [wikipedia.length(rng, budget) for _ in range(rng.randint(1, 120))]
        p = pack(lengths, budget, ranks=ranks, microbatches=m)
        per_rank = p.rank_tokens()
        assert max(per_rank) - min(per_rank) <= budget, (per_rank, budget)
        for mbs in p.microbatch_tokens():
            assert max(mbs) - min(mbs) <= budget, (mbs, budget)
        rows = sorted(p.rows, key=lambda r: -r.tokens)  # in order, un-dealt: groups of consecutive rows
        per = p.rows_per_microbatch
        naive = [sum(r.tokens for r in rows[g * per:(g + 1) * per]) for g in range(ranks * m)]
        flat = [t for mbs in p.microbatch_tokens() for t in mbs]
        assert max(flat) - min(flat) <= max(naive) - min(naive)
        better += max(flat) - min(flat) < max(naive) - min(naive)
    assert better > 100


def test_first_fit_decreasing_fills_rows():
    p = pack([6, 2, 5, 3, 4, 4], budget=8)
    assert sorted(row.lengths for row in p.rows) == [(4, 4), (5, 3), (6, 2)] and p.padding_fraction == 0.0


def test_a_document_longer_than_the_budget_is_one_line_naming_the_argument_or_is_split():
    with pytest.raises(DataError) as e:
        pack([3, 40], budget=16)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("`budget` 16: document 1 has 40 tokens") and "split=True" in msg
    with pytest.raises(DataError, match=r"^`seq` 16: document 0"):
        pack([17], budget=16, argument="seq")
    p = pack([3, 40], budget=16, split=True)
    assert sorted(r.tokens for r in p.rows) == [11, 16, 16] and p.tokens == 43
    assert p.sources is not None and sorted(p.sources) == [0, 1, 1, 1]


@pytest.mark.parametrize("kw, words", [(dict(rows=3, microbatches=2), "`rows` 3: must split into"),
                                       (dict(rows=1), "`rows` 1: the documents need 2 rows"),
                                       (dict(ranks=0), "`ranks` 0"), (dict(budget=0), "`budget` 0")])
def test_bad_arguments_are_one_line(kw, words):
    args = dict(budget=8)
    args.update(kw)
    with pytest.raises(DataError) as e:
        pack([6, 6], **args)
    assert str(e.value).startswith(words) and "\n" not in str(e.value)
    with pytest.raises(DataError, match=r"^`lengths` item 1 is 0"):
        pack([1, 0], budget=8)


def test_fitting_takes_the_longest_prefix_that_packs():
    lengths = [wikipedia.length(random.Random(k), 64) for k in range(50)]
    k = fitting(lengths, 64, rows=8)
    pack(lengths[:k], 64, rows=8)
    if k < len(lengths):
        with pytest.raises(DataError):
            pack(lengths[:k + 1], 64, rows=8)


def test_the_published_histogram_is_half_padding_at_512():
    """Krell et al.: at 512, padding is in excess of 50% of BERT's Wikipedia set; the binned copy keeps it."""
    rng = random.Random(0)
    drawn = [wikipedia.length(rng) for _ in range(20000)]
    assert abs((1 - sum(drawn) / (512 * len(drawn))) - wikipedia.PADDING_AT_512) < 0.01
    assert sum(wikipedia.BINS) + wikipedia.AT_LIMIT == 16279552


# ---- the tensors, and the built-in GPT on them (one process)

def test_packed_rows_carry_positions_documents_and_ignored_padding():
    import torch

    from stagewise.data.tensors import IGNORE, block_mask, build, tokens

    docs = [torch.arange(1, 6), torch.arange(10, 13), torch.arange(20, 27)]
    p = pack([5, 3, 7], budget=8, microbatches=2)
    x, y = build(p, docs, [d + 100 for d in docs])
    for r, row in enumerate(p.rows):
        at = 0
        for k, (d, n) in enumerate(zip(row.documents, row.lengths)):
            assert x["input_ids"][r, at:at + n].tolist() == docs[d].tolist()
            assert x["position_ids"][r, at:at + n].tolist() == list(range(n))
            assert (x["document_ids"][r, at:at + n] == k).all()
            at += n
        assert (y[r, at:] == IGNORE).all()
    assert tokens(y) == (15, 16)
    mask = block_mask(x["document_ids"])
    assert mask.shape == (2, 1, 8, 8) and mask.any(-1).all()  # every query attends somewhere


def test_packed_attention_equals_each_document_alone_and_the_loss_counts_real_tokens():
    """The built-in GPT on a packed batch gives each document's tokens what the model gives that document run
    alone, and its mean loss is the mean over real tokens (padding targets -100 are skipped)."""
    import torch

    from stagewise.data.tensors import build
    from stagewise.runtime.run.models import GPTConfig

    cfg = GPTConfig(layers_n=2, d_model=32, heads=4, seq=16, vocab=64, pack=True)
    model = torch.nn.Sequential(*cfg.layers().build_all())
    g = torch.Generator().manual_seed(0)
    lengths = [5, 9, 3, 7, 12, 1]
    docs = [torch.randint(0, 64, (n + 1,), generator=g) for n in lengths]
    p = pack(lengths, 16, microbatches=2)
    x, y = build(p, [d[:-1] for d in docs], [d[1:] for d in docs])
    out = model(x)
    alone = [model(d[None, :-1])[0] for d in docs]
    for r, row in enumerate(p.rows):
        at = 0
        for d, n in zip(row.documents, row.lengths):
            torch.testing.assert_close(out[r, at:at + n], alone[d], rtol=1e-5, atol=1e-5)
            at += n
    per_token = torch.cat([torch.nn.functional.cross_entropy(a, d[1:], reduction="none")
                           for a, d in zip(alone, docs)])
    torch.testing.assert_close(cfg.loss(out, y), per_token.mean(), rtol=1e-5, atol=1e-6)


def test_the_gpts_packed_step_is_the_same_documents_for_any_shares():
    import torch

    from stagewise.runtime.run.models import GPTConfig

    cfg = GPTConfig(seq=32, pack=True)
    (a, ya), (b, yb) = cfg.batch(3, 8, shares=(1, 1)), cfg.batch(3, 8, shares=(2, 2))

    def docs(x, y):
        out = set()
        for r in range(x["input_ids"].shape[0]):
            for k in x["document_ids"][r].unique().tolist():
                sel = x["document_ids"][r] == k
                if k >= 0:
                    out.add((tuple(x["input_ids"][r][sel].tolist()), tuple(y[r][sel].tolist())))
        return out

    assert docs(a, ya) == docs(b, yb) and len(docs(a, ya)) > 8
    assert (ya != -100).sum() == (yb != -100).sum()
    assert not torch.equal(cfg.batch(4, 8)[0]["input_ids"], a["input_ids"])


@pytest.mark.parametrize("kind", ["llama", "gpt2", "mistral"])
def test_hf_packed_attention_equals_each_document_alone(kind, tmp_path):
    """An HF model (rotary or learned positions; Mistral's sliding window) on packed rows: each document's logits
    are its own run's, and transformers' loss is the mean over the real predictions."""
    import torch

    from hf_helpers import save_tiny
    from stagewise.data.tensors import IGNORE, build
    from stagewise.hf.hf_run import HFRun

    run = HFRun(source=str(save_tiny(kind, tmp_path / kind)), seq=16, pack=True)
    model = torch.nn.Sequential(*run.model().layers())
    g = torch.Generator().manual_seed(0)
    docs = [torch.randint(0, 256, (n,), generator=g) for n in (5, 9, 3, 7, 12, 16)]
    p = pack([len(d) for d in docs], 16, microbatches=2)
    x, y = build(p, docs, [torch.cat([torch.tensor([IGNORE]), d[1:]]) for d in docs])
    out = model(x)
    alone = [model(d[None])[0] for d in docs]
    for r, row in enumerate(p.rows):
        at = 0
        for d, n in zip(row.documents, row.lengths):
            torch.testing.assert_close(out[r, at:at + n], alone[d], rtol=1e-5, atol=1e-5)
            at += n
    per = torch.cat([torch.nn.functional.cross_entropy(a[:-1], d[1:], reduction="none") for a, d in zip(alone, docs)])
    torch.testing.assert_close(run.loss(out, y), per.mean(), rtol=1e-5, atol=1e-6)


def test_train_pack_gives_the_built_in_gpt_and_an_hf_model_packed_batches(tmp_path):
    from stagewise.cli import build_parser
    from stagewise.cli.train import config_from

    cfg = config_from(build_parser().parse_args(["train", "--schedule", "1f1b", "-p", "2", "-m", "4", "--pack"]))
    x, y = cfg.step_batch(0)
    assert cfg.model.pack and set(x) == {"input_ids", "position_ids", "document_ids"} and y.shape == (8, 32)
    text = tmp_path / "t.txt"
    text.write_text("packed documents " * 64)
    hf = config_from(build_parser().parse_args(["train", "--hf", str(tmp_path / "llama"), "--data",
                                                str(text), "--schedule", "1f1b", "-p", "2", "--pack"]))
    assert hf.model.pack
