"""`auto` under a memory cap with the Zero Bubble memory model: objectives, the optimum, bad caps, the CLI."""

from __future__ import annotations

import json

import pytest

from cli_helpers import fails, run
from stagewise import Costs, generate, metrics, simulate, torch_csv, validate
from stagewise.plan.auto import CapError, auto_schedule, objective_of
from stagewise.plan.auto import optimum
from stagewise.timeline import peak_memory

#: the Zero Bubble paper's 1.5B model, p = 8, m = 32 (its Table 9 profile; benchmarks/bench_zb_table5.py)
H, A, S = 2304, 24, 1024
M_B, M_W = 34 * H + 5 * A * S, 32 * H
ZB_1_5B = Costs(t_f=18513, t_b=18086 + 9331, t_i=18086, t_w=9331, latency=626, free_at_i=1 - M_W / M_B)


def span_bubble(sched, costs):
    mt = metrics(simulate(sched, costs))
    return 1 - max(mt.busy) / objective_of(mt, "span")


@pytest.mark.parametrize("cap, published", [(8, 0.1242), (16, 0.0039)])
def test_the_papers_zb_1p_and_zb_2p_row_is_matched_under_their_memory_limits(cap, published):
    res = auto_schedule(8, 32, ZB_1_5B, [cap] * 8, objective="span", time_limit=10)
    validate(res.schedule)
    assert round(span_bubble(res.schedule, ZB_1_5B), 4) <= published
    assert max(peak_memory(res.schedule, [1.0] * 8, ZB_1_5B.free_at_i)) <= cap + 1e-9


def test_the_span_objective_beats_every_fitting_family_by_span():
    res = auto_schedule(6, 12, ZB_1_5B, [9] * 6, objective="span", time_limit=5)
    assert res.families  # zb-h1 fits: W keeps only M_W after I
    for name in res.families:
        assert res.value <= objective_of(metrics(simulate(generate(name, 6, 12), ZB_1_5B)), "span") + 1e-6


def test_a_cap_in_bytes_bounds_the_peak_in_bytes():
    costs = Costs(t_f=1, t_b=2, activation_bytes=[4e6, 3e6, 2e6, 1e6], free_at_i=0.4)
    res = auto_schedule(4, 8, costs, [8e6] * 4, unit_bytes=True)
    assert max(metrics(simulate(res.schedule, costs)).peak_activation_bytes) <= 8e6 * (1 + 1e-9)
    with pytest.raises(CapError, match="rank 0's cap of 1e.06 bytes is below what any order needs.*"
                                       "the smallest cap that works is 4e.06,3e.06,2e.06,1e.06"):
        auto_schedule(4, 8, costs, [1e6] * 4, unit_bytes=True)


def test_progress_is_reported_up_to_the_end():
    seen = []
    auto_schedule(4, 8, Costs(), [4] * 4, progress=lambda done, total: seen.append((done, total)))
    assert seen and seen[-1][0] == seen[-1][1] and all(d <= t for d, t in seen)


@pytest.mark.parametrize("objective", ["step", "span"])
def test_the_optimum_with_partial_frees_is_never_above_auto_and_keeps_the_cap(objective):
    costs = Costs(t_f=[1, 2, 1], t_b=[2, 3, 2], latency=0.2, free_at_i=0.5)
    res = auto_schedule(3, 4, costs, [2] * 3, objective=objective)
    opt = optimum(3, 4, costs, [2] * 3, upper=res.value, objective=objective, time_limit=30)
    assert opt.proven and opt.makespan <= res.value + 1e-6
    validate(opt.schedule)
    mt = metrics(simulate(opt.schedule, costs))
    assert objective_of(mt, objective) == pytest.approx(opt.makespan, rel=1e-6)
    assert max(peak_memory(opt.schedule, [1.0] * 3, 0.5)) <= 2 + 1e-9


# --- the command ---------------------------------------------------------------------------------

def test_auto_cli_writes_the_order_the_picture_and_says_whether_it_is_optimal(capsys, tmp_path):
    rc, out, _ = run(capsys, "auto", "-p", "3", "-m", "4", "--objective", "span", "--cap", "2", "--free-at-i",
                     "0.5", "--optimum", "--csv", str(tmp_path / "a.csv"), "-o", str(tmp_path / "a.txt"), "--json")
    res = json.loads(out)
    assert rc == 0 and res["auto"]["objective"] == "span" and res["auto"]["optimal"] is True
    auto = next(r for r in res["rows"] if r["schedule"] == "auto")
    assert auto["within_cap"] is True and auto["span"] == pytest.approx(res["auto"]["value"])
    assert torch_csv.load(tmp_path / "a.csv").ranks == 3
    assert "cap 2 chunk-units: within" in (tmp_path / "a.txt").read_text()


@pytest.mark.parametrize("cap, shown", [("0", "0"), ("-1", "-1"), ("0.5", "0.5"), ("nan", "nan"), ("2,2,0,2", "0")])
def test_a_cap_no_order_can_meet_names_the_smallest_that_works(capsys, cap, shown):
    err = fails(capsys, "auto", "-p", "4", "-m", "8", "--cap", cap)
    assert err.startswith(f"stagewise auto: error: --cap {cap}: rank ")
    assert f"cap of {shown} chunk-units is below what any order needs" in err
    assert "the smallest cap that works is 1" in err


def test_a_byte_cap_below_one_activation_names_m_b(capsys):
    err = fails(capsys, "auto", "--hidden-size", "1024", "--heads", "16", "--seq-length", "1024",
                "--cap-bytes", "1e6")
    assert f"the smallest cap that works is {(34 * 1024 + 5 * 16 * 1024) * 1024:.6g}" in err


def test_the_progress_bar_shows_only_after_a_second(monkeypatch):
    from stagewise.cli import plan_auto

    bar = plan_auto._LateBar(after=3600.0)
    bar.enabled = True
    with bar:
        bar.update(1, 10)
    assert bar.bar is None  # a quick search draws nothing
    bar = plan_auto._LateBar(after=0.0)
    bar.enabled = True
    with bar:
        bar.update(5, 10)
        assert bar.bar is not None and bar.bar.tasks[0].completed == 5
