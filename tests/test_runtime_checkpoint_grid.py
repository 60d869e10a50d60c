"""Every layout a checkpoint reshards into loads: a grid of save layout x resume layout.

Saved at pp 2, at pp 1 x dp 2 with ZeRO-1 and at pp 1 x fsdp 2 (one launch, with the uninterrupted run);
each resumed at those three, at pp 1 x dp 2 and unpipelined (one launch of 2 ranks for the twelve pipelined
resumes), and at pp 2 x dp 2 with ZeRO-1 and at pp 4 (one launch of 4 ranks); every resume continues the
uninterrupted run's losses. The user's own command (saved at -p 2, resumed with -p 1 --dp 2 --zero 1, once
refused: a tie's two copies on one stage fell in different ZeRO partitions) runs through the CLI.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from runtime_helpers import TINY
from stagewise.cli import main
from stagewise.runtime import RunConfig
from stagewise.runtime.run.train import train, train_many

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240),
              pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]

BASE = RunConfig(schedule="1f1b", ranks=2, microbatches=2, batch=8, steps=3, model=TINY, timeout=60)
#: layouts of 2 ranks: (name, options)
TWO = {"pp2": dict(ranks=2), "pp1-dp2-zero1": dict(ranks=1, dp=2, zero=1), "pp1-fsdp2": dict(ranks=1, fsdp=2)}
FOUR = {"pp2-dp2-zero1": dict(ranks=2, dp=2, zero=1), "pp4": dict(ranks=4)}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(the uninterrupted run's losses, {layout: the folder its first 2 steps saved into})."""
    root = tmp_path_factory.mktemp("grid")
    folders = {name: root / name for name in TWO}
    full, *parts = train_many([BASE] + [dataclasses.replace(BASE, steps=2, save=str(folders[name]), **opts)
                                        for name, opts in TWO.items()])
    for part in parts:
        assert part.losses == pytest.approx(full.losses[:2], rel=1e-5)
    return full.losses, folders


def _check(res, losses, what: str) -> None:
    assert res.checkpoint["resumed_step"] == 2 and len(res.losses) == 1, what
    assert res.losses[0] == pytest.approx(losses[2], rel=1e-5), what


def test_every_saved_layout_resumes_under_every_layout_of_two_ranks_and_unpipelined(saved):
    losses, folders = saved
    every = {**TWO, "pp1-dp2": dict(ranks=1, dp=2)}
    pairs = [(s, r) for s in folders for r in every]
    results = train_many([dataclasses.replace(BASE, resume=str(folders[s]), **every[r]) for s, r in pairs])
    for (s, r), res in zip(pairs, results):
        _check(res, losses, f"saved {s}, resumed {r}")
    for s, folder in folders.items():
        _check(train(dataclasses.replace(BASE, schedule=None, ranks=1, resume=str(folder))), losses,
               f"saved {s}, resumed unpipelined")


def test_every_saved_layout_resumes_under_layouts_of_four_ranks(saved):
    losses, folders = saved
    pairs = [(s, r) for s in folders for r in FOUR]
    results = train_many([dataclasses.replace(BASE, resume=str(folders[s]), **FOUR[r]) for s, r in pairs])
    for (s, r), res in zip(pairs, results):
        _check(res, losses, f"saved {s}, resumed {r}")


def test_a_pp2_checkpoint_resumes_with_zero1_at_one_stage_from_the_cli(saved, capsys):
    losses, folders = saved
    argv = ["train", "--schedule", "1f1b", "-p", "1", "--dp", "2", "--zero", "1", "-m", "2", "--batch", "8",
            "--layers", "6", "--d-model", "32", "--seq", "16", "--steps", "3", "--resume", str(folders["pp2"]),
            "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["losses"] == pytest.approx(losses[2:], rel=1e-5)
