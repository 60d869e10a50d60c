"""`stagewise plan` and `stagewise auto` as a user meets them: output, files, and one-line errors."""

import json
import sys
from pathlib import Path

import pytest

from stagewise import torch_csv
from stagewise.cli import main

sys.path.insert(0, str(Path(__file__).parent))
from plan_fixtures import gpt_profile  # noqa: E402


@pytest.fixture
def prof(tmp_path):
    path = tmp_path / "gpt.json"
    gpt_profile(blocks=8).save(path)
    return path


def plan(capsys, *args):
    code = main(["plan", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_plan_prints_table_why_and_train_command(prof, tmp_path, capsys):
    csv = tmp_path / "best.csv"
    code, out, err = plan(capsys, "--profile", prof, "-N", 4, "-G", 16, "--memory", "40MB", "-o", csv)
    assert code == 0, err
    assert "searched" in out and "fits" in out and " wins: " in out
    assert f"wrote {csv}" in out and "run it: stagewise train" in out
    sched = torch_csv.load(csv)
    assert sched.ranks >= 1


def test_plan_json(prof, tmp_path, capsys):
    code, out, _ = plan(capsys, "--profile", prof, "-N", 2, "-G", 8, "-o", tmp_path / "x.csv", "--json",
                        "--schedules", "1f1b,zb-h1", "--recompute", "off")
    data = json.loads(out)
    assert code == 0 and data["best"]["family"] in ("1f1b", "zb-h1")
    assert all(r["recompute"] is False for r in data["ranking"])
    assert data["ranking"][0]["step_time"] <= data["ranking"][-1]["step_time"]


def test_plan_with_a_layout(prof, tmp_path, capsys):
    code, out, err = plan(capsys, "--profile", prof, "-N", 2, "-G", 8, "-o", tmp_path / "x.csv",
                          "--layout", "E+t*3 | t*5+H", "--schedules", "1f1b")
    assert code == 0, err
    assert "E+t*3 | t*5+H" in out and "--split 4,6" in out


@pytest.mark.parametrize("args, words", [
    (["--memory", "1MB"], "nothing fits in 977 KiB per device; the least any of the"),
    (["-N", "13"], "no configuration: --devices 13 gives p x dp"),
    (["--layout", "E+t*3 | t*4+H"], "loses 1 t"),
    (["--memory", "lots"], "--memory 'lots': expected a size"),
    (["--schedules", "2f2b"], "--schedules: unknown schedule '2f2b'"),
    (["--micro-batch-sizes", "3"], "micro-batch size 3 was not profiled"),
])
def test_plan_errors_are_one_line_exit_2(prof, tmp_path, capsys, args, words):
    base = {"-N": "4", "-G": "8"}
    for k, v in zip(args[::2], args[1::2]):
        base[k] = v
    rest = [x for kv in base.items() for x in kv]
    code, out, err = plan(capsys, "--profile", prof, "-o", tmp_path / "x.csv", *rest)
    assert code == 2
    assert words in err and err.count("\n") == 1 and "Traceback" not in err


def test_nothing_fits_says_what_would(prof, tmp_path, capsys):
    code, _, err = plan(capsys, "--profile", prof, "-N", 4, "-G", 8, "--memory", "1MB", "-o", tmp_path / "x.csv")
    assert code == 2 and "give --memory" in err and "or more" in err
    need = err.split("give --memory ")[1].split()[0]
    code, out, err = plan(capsys, "--profile", prof, "-N", 4, "-G", 8, "--memory", need, "-o", tmp_path / "x.csv")
    assert code == 0, err


@pytest.mark.parametrize("content, words", [
    ("{", "not JSON"),
    ('{"format": "stagewise-profile", "version": 1, "micro_batch_sizes": [1]}', "lacks the field 'layers'"),
])
def test_bad_profile_files(tmp_path, capsys, content, words):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    code, _, err = plan(capsys, "--profile", bad, "-N", 2, "-G", 8)
    assert code == 2 and words in err


def test_missing_profile_file(tmp_path, capsys):
    code, _, err = plan(capsys, "--profile", tmp_path / "none.json", "-N", 2, "-G", 8)
    assert code == 2 and "cannot read" in err


def test_auto_command_with_optimum(capsys, tmp_path):
    code = main(["auto", "-p", "3", "-m", "4", "--tf", "1,2,1", "--tb", "2,4,2", "--optimum",
                 "--csv", str(tmp_path / "auto.csv")])
    out = capsys.readouterr().out
    assert code == 0
    assert "optimum" in out and "optimal: yes, proven by the MILP" in out and "auto" in out
    assert torch_csv.load(tmp_path / "auto.csv").ranks == 3


def test_auto_command_errors(capsys):
    assert main(["auto", "-p", "3", "--cap", "1,2"]) == 2
    assert "--cap has 2 values; give one, or one per rank (3)" in capsys.readouterr().err
    assert main(["auto", "-p", "5", "--optimum"]) == 2
    assert "p <= 4 and m <= 8" in capsys.readouterr().err


def test_plan_auto_adds_auto_rows_never_slower_than_their_config(prof, tmp_path, capsys):
    code, out, err = plan(capsys, "--profile", prof, "-N", 4, "-G", 16, "--auto", "--json", "-o", tmp_path / "x.csv",
                          "--recompute", "off")
    assert code == 0, err
    ranking = json.loads(out)["ranking"]
    autos = [r for r in ranking if r["family"] == "auto"]
    assert autos
    for a in autos:
        same = [r for r in ranking if r["family"] != "auto" and r["v"] == 1 and r["counts"] == a["counts"]
                and all(r[k] == a[k] for k in ("p", "dp", "m", "micro_batch_size", "recompute"))]
        assert same and a["step_time"] <= min(r["step_time"] for r in same) + 1e-12


def test_plan_failure_rate_shows_the_work_lost_and_suggests_an_interval(prof, tmp_path, capsys):
    from stagewise.plan.failures import daly, young

    code, out, _ = plan(capsys, "--profile", prof, "-N", 4, "-G", 16, "-o", tmp_path / "x.csv", "--schedules",
                        "1f1b", "--failure-rate", "0.01", "--checkpoint-interval", "60", "--write-bandwidth",
                        "100MB/s", "--restart-time", "30", "--json")
    assert code == 0
    res = json.loads(out)
    f = res["failures"]
    assert f["mtbf_s"] == 86400 / (0.01 * 4) and f["interval_s"] == 60
    assert f["write_s"] == f["checkpoint_bytes"] / (res["best"]["p"] * 100e6)  # the p ranks write in parallel
    assert f["lost_per_failure_s"] == (60 + f["write_s"]) / 2 + 30
    assert f["daly_s"] == daly(f["write_s"], f["mtbf_s"]) < young(f["write_s"], f["mtbf_s"]) == f["young_s"]
    assert f"--save-every {f['interval_steps']} --save-on-signal --max-restarts" in res["train"]
    code, out, _ = plan(capsys, "--profile", prof, "-N", 4, "-G", 16, "-o", tmp_path / "x.csv", "--schedules",
                        "1f1b", "--failure-rate", "0.01")
    assert "a failure loses" in out and "suggested interval" in out and "(Daly; Young" in out
