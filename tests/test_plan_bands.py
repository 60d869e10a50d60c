"""Error bands (plan/bands.py): on every prediction, ties where they overlap, and what moves a plan most."""

import json
import sys
from pathlib import Path

import pytest

from stagewise.plan.search import interval, profile_band, tie, tied_with_first
from stagewise.plan.search import Profile

sys.path.insert(0, str(Path(__file__).parent))
from cli_helpers import run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "data" / "profiles" / "gpt-l32-d256-cpu.json"
CLUSTER = ("plan", "--model", "llama3-8b", "--hardware", "h100", "--gpus", "64", "--global-batch-tokens", "2M",
           "--schedules", "1f1b,interleaved-1f1b,zb-v", "--chunks", "2", "--tensor", "8", "--top", "6")


def test_bands_overlap_or_not():
    assert interval(10.0, 0.1) == pytest.approx((9.0, 11.0)) and interval(10.0, None) == (10.0, 10.0)
    assert tie(10.0, 0.1, 11.5, 0.1)  # 11 >= 10.35
    assert not tie(10.0, 0.01, 11.5, 0.01)
    assert tie(10.0, None, 10.0, None) and not tie(10.0, None, 10.000001, None)
    class C:  # noqa: D106 - a ranked row
        def __init__(self, s, b):
            self.step_time, self.band = s, b
    assert tied_with_first([C(10, 0.1), C(10.5, 0.1), C(13, 0.1), C(11, 0.1)]) == 3


def test_every_cluster_prediction_carries_a_band_and_ties_are_named(tmp_path, capsys):
    rc, out, err = run(capsys, *CLUSTER, "-o", str(tmp_path / "p.csv"), "--json")
    assert rc == 0, err
    plan = json.loads(out)
    for row in plan["ranking"]:
        lo, hi = row["step_time_band"]
        assert 0 < lo < row["step_time"] < hi and row["band"] > 0
        mlo, mhi = row["mfu_band"]
        assert 0 < mlo < row["mfu"] < mhi < 1
    assert plan["assumptions"]["band"] == row["band"] and "bench_published.py" in plan["assumptions"]["band_source"]
    first = plan["ranking"][0]
    ties = [r for r in plan["ranking"] if r["step_time_band"][0] <= first["step_time_band"][1]]
    assert plan["tie"] == len(ties) >= 2 and "rows tie with the fastest within the" in plan["why"]  # of the listed
    rc, out, _ = run(capsys, *CLUSTER, "-o", str(tmp_path / "p.csv"))
    table = out.split("\n\n")[1]
    assert "step (band)" in table and "MFU (band)" in table and f"#1-#{plan['tie']} cannot be ranked" in table
    assert table.splitlines()[3].lstrip().startswith("2=")


def test_a_hardware_with_a_narrow_band_ranks_what_it_can_tell_apart(tmp_path, capsys):
    hw = json.loads((ROOT / "stagewise/plan/cluster/data/hardware/h100.json").read_text())
    path = tmp_path / "h.json"
    path.write_text(json.dumps({**hw, "band": 0.0}))
    rc, out, err = run(capsys, *CLUSTER[:4], str(path), *CLUSTER[5:], "--schedules", "1f1b,zb-v", "--framework",
                       "stagewise", "-o", str(tmp_path / "p.csv"), "--json")
    assert rc == 0, err
    plan = json.loads(out)
    first = plan["ranking"][0]["step_time"]
    assert plan["tie"] == sum(r["step_time"] == pytest.approx(first, rel=1e-9) for r in plan["ranking"])
    assert "outside the ±0.0% band" in plan["why"]


def test_what_moves_the_winner_most_is_efficiency_links_and_recomputation(tmp_path, capsys):
    rc, out, err = run(capsys, *CLUSTER, "-o", str(tmp_path / "p.csv"), "--json")
    sens = {s["input"]: s for s in json.loads(out)["sensitivity"]}
    assert {"efficiency", "node link bandwidth", "network bandwidth", "recomputation"} <= set(sens)
    assert sens["efficiency"]["delta"] > 0.05  # 10% slower matrix multiplies: most of the step
    assert sens["node link bandwidth"]["delta"] > 0 and sens["recomputation"]["delta"] > 0
    moves = [abs(s["delta"]) for s in json.loads(out)["sensitivity"] if s["delta"] is not None]
    assert moves == sorted(moves, reverse=True)
    rc, out, _ = run(capsys, *CLUSTER, "-o", str(tmp_path / "p.csv"))
    assert "what moves the winner's step most: " in out and "efficiency x0.9 +" in out


def _with_spread(tmp_path, spread: float) -> str:
    data = json.loads(PROFILE.read_text())
    for layer in data["layers"]:
        layer["spread"] = [spread] * len(data["micro_batch_sizes"])
    path = tmp_path / "spread.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_a_local_plan_takes_its_band_from_the_profiles_measured_spread(tmp_path, capsys):
    prof = Profile.load(_with_spread(tmp_path, 0.04))
    assert profile_band(prof, 4) == pytest.approx(0.04)
    assert profile_band(Profile.load(PROFILE), 4) is None  # made before spreads were measured
    rc, out, err = run(capsys, "plan", "--profile", _with_spread(tmp_path, 0.04), "-N", "8", "-G", "64",
                       "--memory", "512MiB", "-o", str(tmp_path / "p.csv"), "--json")
    assert rc == 0, err
    plan = json.loads(out)
    assert all(r["band"] == pytest.approx(0.04) and r["step_time_band"][0] < r["step_time"] for r in plan["ranking"])
    assert "are a tie" in plan["why"] and "measured spread (±4.0%)" in plan["why"]


def test_zero_apart_is_a_tie_not_a_win(tmp_path, capsys):
    """The case of the issue: gpipe and 1f1b at p = 1 make the same prediction (asked for by name: left to
    itself the search plans one stage as 1f1b only)."""
    rc, out, err = run(capsys, "plan", "--profile", str(PROFILE), "-N", "2", "-G", "16", "--recompute", "off",
                       "--schedules", "gpipe,1f1b", "-o", str(tmp_path / "p.csv"))
    assert rc == 0, err
    assert "are a tie: 0.00% apart" in out and "wins: 0.00% faster" not in out
    assert "no error band: this profile records no measured spread" in out


def test_a_spread_is_checked_like_every_field(tmp_path, capsys):
    from cli_helpers import fails

    data = json.loads(PROFILE.read_text())
    data["layers"][3]["spread"] = [0.1, -1, 0, 0, 0]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    err = fails(capsys, "plan", "--profile", str(path), "-N", "2", "-G", "16")
    assert "layers[3]: spread must be 5 fractions from 0 to 10" in err
