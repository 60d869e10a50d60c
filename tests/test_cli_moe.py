"""The all-to-all options of simulate, compare, draw and report: given as times or derived from the MoE shape."""

import json

import pytest
from cli_helpers import fails, run

from stagewise.costs import expert_all_to_all

SHAPE = ["--moe-tokens", "4096", "--hidden-size", "1024", "--moe-top-k", "2", "--ep", "4", "--a2a-bandwidth", "1e7"]


def test_simulate_and_compare_report_exposed_all_to_all(capsys):
    rc, out, _ = run(capsys, "simulate", "dualpipe", "-p", "2", "-m", "4", "--a2a", "2", "--json")
    res = json.loads(out)
    assert rc == 0 and res["exposed_a2a"] == [13, 13] and res["hidden_a2a"] == [3, 3]
    rc, out, _ = run(capsys, "compare", "-p", "2", "-m", "4", "--schedules", "1f1b,dualpipe", "--a2a", "2")
    assert rc == 0 and "exp a2a hidden" in out
    assert [line.split()[7:9] for line in out.splitlines()[2:4]] == [["16", "0%"], ["13", "19%"]]
    rc, out, _ = run(capsys, "compare", "-p", "2", "-m", "4", "--schedules", "1f1b")
    assert "a2a" not in out  # no all-to-all: today's table


def test_the_shape_derives_the_same_time_as_the_helper(capsys):
    want = expert_all_to_all(4096, 1024, 2, 4, bandwidth=1e7, layers=2)
    rc, out, _ = run(capsys, "simulate", "1f1b", "-p", "2", "-m", "2", *SHAPE, "--layers-per-stage", "2", "--json")
    assert rc == 0 and json.loads(out)["a2a"] == pytest.approx([4 * want] * 2)  # 2 F + 2 B, all exposed
    rc, out, _ = run(capsys, "simulate", "1f1b", "-p", "2", "-m", "2", "--a2a", str(want), "--a2a-b", "0", "--json")
    assert json.loads(out)["exposed_a2a"] == pytest.approx([2 * want] * 2)


def test_costs_per_rank_scale_the_all_to_all_with_the_chunk(capsys):
    rc, out, _ = run(capsys, "compare", "-p", "2", "-m", "4", "--schedules", "1f1b,zb-v", "--a2a", "1",
                     "--costs-per", "rank", "--json")
    res = {r["schedule"]: r for r in json.loads(out)}
    assert res["1f1b"]["a2a"] == res["zb-v"]["a2a"] == [8, 8]  # zb-v: 16 actions a rank of half a share


def test_draw_shows_the_lane(capsys):
    rc, out, _ = run(capsys, "draw", "dualpipe", "-p", "2", "-m", "4", "--a2a", "1", "--width", "100")
    assert rc == 0 and "= hidden # exposed" in out and "a2a:" in out


@pytest.mark.parametrize("argv, words", [
    (["--moe-tokens", "4096", "--moe-top-k", "2"],
     "deriving --a2a needs --moe-tokens, --hidden-size, --moe-top-k, --ep, --a2a-bandwidth together; missing "
     "--hidden-size, --ep, --a2a-bandwidth"),
    (SHAPE + ["--a2a", "1"], "give either --a2a (a time) or --moe-tokens and the rest (derived), not both"),
    (["--a2a", "1", "--tfb", "2"], "--tfb sets an F&B pair's duration by hand"),
    (["--a2a", "-1"], "--a2a must be a finite number >= 0"),
    (["--a2a", "1,2,3"], "--a2a has 3 per-stage values; the schedule has 4 stages"),
    (["--a2a", "inf"], "--a2a: every value must be a finite number"),
    (SHAPE[:-2] + ["--a2a-bandwidth", "0"], "--a2a-bandwidth must be > 0"),
    (SHAPE + ["--moe-top-k", "9"], "--moe-top-k (9) must be at most the experts of the group"),
    (SHAPE + ["--moe-experts", "6"], "--moe-experts 6 must be a multiple of --ep 4"),
    (["--hidden-size", "1024"], "--hidden-size needs --hidden-size, --heads and --seq-length together"),
    (["--a2a-latency", "-1"], "--a2a-latency must be a finite number >= 0; got -1"),
    (SHAPE + ["--a2a-latency", "-1"], "--a2a-latency must be a finite number >= 0; got -1"),
    (["--a2a", "1", "--a2a-latency", "2"], "--a2a-latency 2 is part of the --a2a derived from --moe-tokens"),
    (["--a2a", "1,2", "--costs-per", "rank"], "--a2a has 2 per-stage values; the schedule has 4 stages"),
])
def test_bad_all_to_all_options_exit_2_naming_the_option(capsys, argv, words):
    assert words in fails(capsys, "simulate", "dualpipe", "-p", "2", "-m", "4", *argv)


def test_explain_and_compare_name_the_options_they_were_given(capsys):
    assert "--a2a-latency must be a finite number >= 0" in fails(capsys, "explain", "1f1b", "--a2a-latency", "-1")
    err = fails(capsys, "compare", "-p", "2", "--a2a", "1,2", "--costs-per", "rank")
    assert "--a2a has 2 per-stage values" in err and "--cost " not in err
