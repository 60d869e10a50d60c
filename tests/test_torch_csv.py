"""torch's compute-only CSV: our schedules round-trip, torch's own schedules import and simulate."""

from __future__ import annotations

import contextlib
import csv
import io
import logging
from pathlib import Path

import pytest
from test_schedules import check_timeline

from stagewise import torch_csv
from stagewise.schedules import FAMILIES, generate, names
from stagewise.simulate import simulate
from stagewise.validate import ScheduleError

DATA = Path(__file__).parent / "data"


def _cases():
    for name in names():
        fam = FAMILIES[name]
        for p, m in [(1, 2), (2, 4), (4, 8), (6, 24)]:
            for v in fam.chunks or (1, 3):
                try:
                    yield name, generate(name, p, m, v)
                except ValueError:
                    pass  # not a shape this family takes


@pytest.mark.parametrize("name, sched", list(_cases()), ids=lambda x: x if isinstance(x, str) else "")
def test_export_then_load_gives_the_same_schedule(name, sched):
    back = torch_csv.loads(torch_csv.dumps(sched), name=name)
    assert back.programs == sched.programs
    assert back.placement == sched.placement
    assert back.lanes == sched.lanes and back.microbatches == sched.microbatches


def test_dump_and_load_a_file(tmp_path):
    sched = generate("dualpipe", 4, 8)
    path = tmp_path / "dp.csv"
    torch_csv.dump(sched, path)
    back = torch_csv.load(path)
    assert back.name == "dp" and back.programs == sched.programs and len(back.lanes) == 2


@pytest.mark.parametrize("path", sorted(DATA.glob("*.csv")), ids=lambda p: p.stem)
def test_golden_csvs_load_and_simulate(path):
    check_timeline(simulate(torch_csv.load(path)))


def test_load_a_missing_file_names_it(tmp_path):
    with pytest.raises(ScheduleError, match=r"--csv .*nope.csv: cannot read"):
        torch_csv.load(tmp_path / "nope.csv")


# --- torch 2.13's own schedules ------------------------------------------------------------------

TORCH_TO_OURS = {
    "GPipe": "gpipe",
    "Interleaved1F1B": "interleaved-1f1b",
    "LoopedBFS": "looped-bfs",
    "ZBVZeroBubble": "zb-v",
    "DualPipeV": "dualpipe-v",
    "InterleavedZeroBubble": None,  # ZB1P over interleaved chunks: no family of ours
}


def torch_csv_text(schedule: str, p: int, m: int) -> str:
    """The pipeline order torch builds, written as its ``_dump_csv`` writes it."""
    pytest.importorskip("torch")
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            ops = get_schedule_ops(schedule, p, m)
    finally:
        logging.disable(logging.NOTSET)
    out = io.StringIO()
    csv.writer(out).writerows(ops)
    return out.getvalue()


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (3, 12)])
@pytest.mark.parametrize("schedule", list(TORCH_TO_OURS))
def test_torch_schedules_import_and_simulate(schedule, p, m):
    sched = torch_csv.loads(torch_csv_text(schedule, p, m), name=schedule)
    check_timeline(simulate(sched))
    ours = TORCH_TO_OURS[schedule]
    if ours:  # the same order, written once here and once in torch
        assert sched.programs == generate(ours, p, m).programs


@pytest.mark.parametrize("p, m", [(4, 8), (2, 3)])
def test_torch_1f1b_export_is_invalid_and_we_say_why(p, m):
    text = torch_csv_text("1F1B", p, m)
    last = p - 1
    # torch's Schedule1F1B gives its last rank forwards 1..m instead of 0..m-1
    assert f"{last}F{m}" in text.splitlines()[last] and f"{last}F0," not in text
    with pytest.raises(ScheduleError) as e:
        torch_csv.loads(text)
    assert f"rank {last} position" in str(e.value)
    assert f"({last}F{m}): micro-batch {m} out of range 0..{m - 1} for stage {last}" in str(e.value)


@pytest.mark.parametrize("name", names())
def test_torch_parses_our_cells_back_to_the_same_text(name):
    pytest.importorskip("torch")
    from torch.distributed.pipelining.schedules import _Action

    for row in csv.reader(io.StringIO(torch_csv.dumps(generate(name, 4, 8)))):
        assert [str(_Action.from_str(cell)) for cell in row] == row


def test_torch_accepts_trailing_garbage_we_do_not():
    pytest.importorskip("torch")
    from torch.distributed.pipelining.schedules import _Action

    assert str(_Action.from_str("0F0junk")) == "0F0"  # torch 2.13's parser
    with pytest.raises(ScheduleError, match="not an action: '0F0junk'"):
        torch_csv.loads("0F0junk,0B0\n")


def test_fullwidth_digits_are_not_actions(tmp_path):
    """'１F0' (a fullwidth one) reads as 1F0 to Python's \\d and int(); a schedule's digits are ASCII."""
    from stagewise.actions import parse

    with pytest.raises(ValueError):
        parse("\uff11F0")
    path = tmp_path / "s.csv"
    path.write_text("0F0,0B0\n\uff10F0,1B0\n", encoding="utf-8")
    with pytest.raises(ScheduleError, match="not an action"):
        torch_csv.load(path)
