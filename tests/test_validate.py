"""The validator names the rank, the position, the action and, for a deadlock, the cycle."""

from __future__ import annotations

import re

import pytest

from stagewise.actions import parse
from stagewise.schedule import make
from stagewise.schedules import generate, names
from stagewise.torch_csv import loads
from stagewise.validate import ScheduleError, validate


def sched(*rows: str, m: int, placement=None):
    """A schedule from one text row per rank: ``"0F0 0B0"``."""
    programs = [[parse(cell) for cell in row.split()] for row in rows]
    return make("test", programs, placement if placement is not None else range(len(rows)), m)


def error(s) -> str:
    with pytest.raises(ScheduleError) as e:
        validate(s)
    return str(e.value)


@pytest.mark.parametrize("name", names())
def test_every_family_is_valid(name):
    s = generate(name, 4, 8)
    assert validate(s) is s


def test_duplicate_action():
    msg = error(sched("0F0 0F0 0B0", "1F0 1B0", m=1))
    assert msg == "rank 0 position 1 (0F0): duplicate action 0F0; each (stage, micro-batch, kind) runs once"


def test_missing_backward():
    msg = error(sched("0F0 0F1 0B0 0B1", "1F0 1B0 1F1", m=2))
    assert msg.startswith("rank 1: missing the backward of stage 1 micro-batch 1 (1B1")


def test_missing_forward():
    assert error(sched("0F0 0B0", "1B0", m=1)) == "rank 1: missing 1F0"


def test_stage_out_of_range():
    msg = error(sched("0F0 0B0 2F0", "1F0 1B0", m=1))
    assert msg == "rank 0 position 2 (2F0): stage 2 out of range 0..1"


def test_micro_batch_out_of_range():
    msg = error(sched("0F0 0B0 0F1", "1F0 1B0", m=1))
    assert msg == "rank 0 position 2 (0F1): micro-batch 1 out of range 0..0 for stage 0"


def test_action_on_the_wrong_rank():
    msg = error(sched("0F0 1F0 0B0", "1B0", m=1))
    assert msg == "rank 0 position 1 (1F0): stage 1 belongs to rank 1, not rank 0"


def test_w_without_i():
    msg = error(sched("0F0 0I0 0W0", "1F0 1W0", m=1))
    assert msg == "rank 1: missing 1I0 (split backward needs both I and W)"


def test_b_together_with_a_split_backward():
    assert "together with a split backward" in error(sched("0F0 0B0 0I0 0W0", m=1))


def test_pair_must_be_f_then_b():
    with pytest.raises(ValueError, match="not an action"):
        parse("(0B0;1F0)OVERLAP_F_B")


def test_deadlock_across_ranks_names_the_cycle():
    # rank 0 wants 1B0's gradient before sending 0F1; rank 1 wants 0F1 before running 1F0, 1B0
    msg = error(sched("0F0 0B0 0F1 0B1", "1F1 1B1 1F0 1B0", m=2))
    assert msg.startswith("deadlock: wait cycle: ")
    assert "rank 0 position 1 (0B0) waits for 1B0 at rank 1 position 3" in msg
    assert "rank 1 position 0 (1F1) waits for 0F1 at rank 0 position 2" in msg
    assert msg.endswith("back to rank 0")


def test_a_rank_waiting_for_its_own_later_action():
    msg = error(sched("0B0 0F0", m=1))
    assert msg == "deadlock: wait cycle: rank 0 position 0 (0B0) waits for 0F0 at rank 0 position 1; back to rank 0"


def test_deadlock_in_a_generated_schedule_with_two_ops_swapped():
    s = generate("1f1b", 4, 8)
    progs = [list(p) for p in s.programs]
    progs[3][0], progs[3][1] = progs[3][1], progs[3][0]  # last rank: 3B0 before 3F0
    msg = error(make("swapped", progs, s.placement, 8))
    assert re.search(r"rank 3 position 0 \(3B0\) waits for 3F0 at rank 3 position 1", msg)


@pytest.mark.parametrize("cell", ["0F0junk", "3X1", "F0", "0F", "(0F7;7B3)", "1B-1"])
def test_malformed_csv_cells_are_rejected_with_row_and_column(cell):
    with pytest.raises(ScheduleError) as e:
        loads(f"0F0,{cell},0B0\n")
    assert str(e.value).startswith(f"row 1 (rank 0) column 2: not an action: '{cell}'")


def test_a_stage_on_two_ranks_in_a_csv():
    with pytest.raises(ScheduleError, match="stage 0 is on two ranks: rank 0 position 0 .0F0. and rank 1 position 0 .0B0."):
        loads("0F0\n0B0\n")


def test_an_empty_csv():
    with pytest.raises(ScheduleError, match="no actions"):
        loads("\n,,\n")
