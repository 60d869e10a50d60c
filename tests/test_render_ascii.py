"""Terminal text: fits the width, keeps proportions, colours only on a terminal without NO_COLOR."""

import io
import re
import sys

import pytest
from hypothesis import given, strategies as st
from render_helpers import families, measured, sim

from stagewise.render.ascii import IDLE, draw_text


def rank_rows(text: str) -> list[str]:
    return [line.split("|", 1)[1] for line in text.splitlines() if line.startswith("rank ")]


@given(name=st.sampled_from(families(4, 8)), width=st.integers(20, 220))
def test_every_line_fits_the_width(name, width):
    text = draw_text(sim(name, 4, 8), width=width, color=False)
    assert all(len(line) <= width for line in text.splitlines())
    assert len(rank_rows(text)) == 4


def test_terminal_width_comes_from_columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "57")
    lines = draw_text(sim("1f1b", 4, 8), color=False).splitlines()
    assert max(len(line) for line in lines) == 57  # rank rows fill it exactly


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_busy_columns_follow_busy_time(name):
    """1F1B/GPipe p=4, m=8: each rank is busy 24 of 33 time units."""
    for row in rank_rows(draw_text(sim(name, 4, 8), width=207, color=False)):
        busy = sum(ch != IDLE for ch in row)
        assert busy / len(row) == pytest.approx(24 / 33, abs=0.02)


def test_cells_are_labelled_with_kind_and_microbatch():
    rows = rank_rows(draw_text(sim("1f1b", 2, 3), width=120, color=False))
    assert rows[0].startswith("F0") and rows[1].startswith(IDLE)
    programs = sim("1f1b", 2, 3).schedule.programs
    for r, row in enumerate(rows):
        assert row.replace(IDLE, " ").split() == [f"{op.kind}{op.mb}" for op in programs[r]]


def test_second_chunk_is_lowercase():
    names = families(4, 8)
    if "interleaved-1f1b" not in names:
        pytest.skip("interleaved-1f1b is not built yet")
    text = draw_text(sim("interleaved-1f1b", 4, 8), width=200, color=False)
    body = "".join(rank_rows(text))
    assert "F" in body and "f" in body and "B" in body and "b" in body


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_colour_only_on_a_terminal_and_without_no_color(monkeypatch):
    tl = sim("1f1b", 2, 3)
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert "\x1b[" not in draw_text(tl, width=80)
    monkeypatch.setattr(sys, "stdout", FakeTTY())
    coloured = draw_text(tl, width=80)
    assert "\x1b[48;2;" in coloured
    monkeypatch.setenv("NO_COLOR", "1")
    assert "\x1b[" not in draw_text(tl, width=80)
    # colour changes nothing but the escape codes
    assert re.sub(r"\x1b\[[0-9;]*m", "", coloured) == draw_text(tl, width=80, color=False)


def test_measured_timeline_in_seconds():
    text = draw_text(measured(sim("1f1b", 2, 3)), width=80, color=False)
    assert text.splitlines()[-2].endswith("0.12 s")  # 12 t_f at 0.01 s each, from the first start


def test_pairs_show_both_microbatches():
    if "dualpipe" not in families(4, 8):
        pytest.skip("dualpipe is not built yet")
    tl = sim("dualpipe", 4, 8)
    rows = rank_rows(draw_text(tl, width=160, color=False))
    for prog, row in zip(tl.schedule.programs, rows):
        pairs = [f"{op.forward.mb}/{op.backward.mb}" for op in prog if op.kind == "F&B"]
        labels = [t[1:] for t in row.replace(IDLE, " ").split() if t[0] in "Pp"]
        assert labels == pairs and pairs


def test_the_all_to_all_lane_marks_hidden_and_exposed_columns():
    from stagewise.timeline import metrics

    tl = sim("dualpipe", 4, 8, a2a=1.0)
    text = draw_text(tl, width=400, color=False)
    lines = text.splitlines()
    lanes = [line for line in lines if line.startswith(" " * len("rank 3 ") + ":")]
    assert len(lanes) == 4
    mt = metrics(tl)
    cols = 400 - len("rank 3 ") - 1
    exposed = sum(line.count("#") for line in lanes) * mt.makespan / cols
    assert exposed == pytest.approx(sum(mt.exposed_a2a), rel=0.05)
    assert any("=" in line for line in lanes) and "= hidden # exposed" in text
    assert ":" not in "".join(draw_text(sim("dualpipe", 4, 8), width=120).splitlines()[2:-2])  # none without


def test_a_lowered_timeline_has_a_communication_line_under_each_row():
    from stagewise.costs import Costs
    from stagewise.lowering import Communication, LoweringOptions, Network, Sizes
    from stagewise.parallelism import Parallelism
    from stagewise.render.ascii import draw_text
    from stagewise.schedules import generate
    from stagewise.simulate import simulate

    comm = Communication(parallelism=Parallelism(fsdp=2), options=LoweringOptions(
        sizes=Sizes(params=8.0), network=Network(intra_bandwidth=1.0), step_end=False))
    text = draw_text(simulate(generate("1f1b", 2, 4), Costs(comm=comm)), width=60)
    lines = text.splitlines()
    # rank 0 waits for its first gather (exposed); rank 1's is hidden behind rank 0's forwards
    assert lines[3].startswith("       :####") and lines[5].startswith("       :====")
    assert "under a row, communication: = hidden # exposed" in text
