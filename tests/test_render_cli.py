"""`draw`, `report`, `compare -o`, `demo` and `simulate --draw` as a user runs them."""

import json
import os

import pytest
from render_helpers import families

from stagewise import torch_csv
from cli_helpers import run
from stagewise.schedules import generate




@pytest.mark.parametrize("suffix,magic", [(".png", b"\x89PNG"), (".svg", b"<"), (".json", b"{"),
                                          (".html", b"<!DOCTYPE html>"), (".txt", b"1f1b")])
def test_draw_writes_the_format_of_the_suffix(tmp_path, capsys, suffix, magic):
    pytest.importorskip("matplotlib")
    path = tmp_path / f"t{suffix}"
    rc, out, err = run(capsys, "draw", "1f1b", "-p", "4", "-m", "8", "--tb", "3", "--memory", "-o", str(path))
    assert (rc, err) == (0, "") and out.strip() == f"wrote {path}"
    assert path.read_bytes().startswith(magic)
    if suffix == ".json":
        xs = [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]
        assert len(xs) == 64 and max(e["dur"] for e in xs) == 3000  # t_b = 3 reached the picture


def test_draw_a_torch_csv(tmp_path, capsys):
    csv = tmp_path / "s.csv"
    torch_csv.dump(generate("gpipe", 3, 4), csv)
    path = tmp_path / "s.json"
    rc, out, _ = run(capsys, "draw", "--csv", str(csv), "-o", str(path))
    trace = json.loads(path.read_text())
    assert rc == 0 and sum(e["ph"] == "X" for e in trace["traceEvents"]) == 24
    assert trace["otherData"]["schedule"] == "s"  # the CSV's name


def test_draw_without_output_prints_text(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "70")
    rc, out, _ = run(capsys, "draw", "gpipe", "-p", "2", "-m", "2")
    assert rc == 0 and "\x1b[" not in out  # captured stdout is not a terminal
    assert max(len(line) for line in out.splitlines()) <= 70 and "rank 1 |" in out


def test_simulate_draw(capsys):
    rc, out, _ = run(capsys, "simulate", "1f1b", "-p", "2", "-m", "3", "--draw")
    assert rc == 0 and "rank 0 |F0" in out


@pytest.mark.parametrize("output,message", [
    ("t.bmp", "unknown suffix '.bmp'; use one of .png, .svg, .pdf, .json, .html, .txt"),
    ("t", "unknown suffix (none)"),
    ("missing/t.png", "missing does not exist"),
    ("afile/t.png", "afile is not a folder"),
    ("adir.png", "it is a folder"),
])
def test_bad_output_exits_2_with_one_line(tmp_path, capsys, monkeypatch, output, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir.png").mkdir()
    rc, out, err = run(capsys, "draw", "1f1b", "-o", output)
    assert rc == 2 and out == ""
    assert err.startswith(f"stagewise draw: error: -o {output}: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.skipif(os.geteuid() != 0, reason="needs a path even root cannot write")
def test_unwritable_path_exits_2(capsys):
    rc, _, err = run(capsys, "draw", "1f1b", "-o", "/proc/stagewise.svg")
    assert rc == 2 and "cannot write" in err and err.count("\n") == 1


def test_compare_writes_the_figure_and_refuses_a_bad_suffix(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "c.png"
    rc, out, _ = run(capsys, "compare", "-p", "4", "-m", "8", "--schedules", "gpipe,1f1b", "-o", str(path))
    assert rc == 0 and path.read_bytes().startswith(b"\x89PNG") and f"wrote {path}" in out
    rc, out, err = run(capsys, "compare", "-o", str(tmp_path / "c.json"))
    assert rc == 2 and out == "" and "unknown suffix '.json'" in err


def test_report_writes_one_page(tmp_path, capsys):
    rc, out, _ = run(capsys, "report", "-p", "4", "-m", "8", "-o", str(tmp_path / "r"))
    page = (tmp_path / "r" / "report.html").read_text()
    assert rc == 0 and f"wrote {tmp_path / 'r' / 'report.html'}" in out
    for name in families(4, 8):
        assert f'data-schedule="{name}"' in page
    rc, _, err = run(capsys, "report", "-p", "4", "-m", "8", "-o", str(tmp_path / "r" / "report.html" / "x"))
    assert rc == 2 and err.startswith("stagewise report: error: -o ")


def test_demo_writes_the_comparison_and_the_report(tmp_path, capsys):
    rc, out, _ = run(capsys, "demo", "--no-run", "-o", str(tmp_path))
    assert rc == 0
    for name in ("compare.svg", "report.html"):  # the pure-Python renderer: no matplotlib start-up
        assert (tmp_path / name).stat().st_size > 10_000 and f"wrote {tmp_path / name}" in out


def test_stagewise_render_draws_a_timeline_as_the_api_docs_say(tmp_path):
    """Issue 44: docs/api.md says to draw a step's timeline with `stagewise.render`; it exports the writers
    (the format by the suffix) and the terminal text, and importing it loads neither torch nor matplotlib."""
    import json
    import subprocess
    import sys

    import stagewise

    tl = stagewise.simulate(stagewise.generate("1f1b", 2, 4))
    assert set(stagewise.render.__all__) == {"write_timeline", "write_comparison", "draw_text", "OutputError"}
    assert stagewise.render.write_timeline(tl, tmp_path / "t.svg").read_text().lstrip().startswith("<")
    assert "traceEvents" in json.loads(stagewise.render.write_timeline(tl, tmp_path / "t.json").read_text())
    assert "rank 0" in stagewise.render.draw_text(tl, color=False)
    with pytest.raises(stagewise.StagewiseError, match="unknown suffix '.gif'"):
        stagewise.render.write_timeline(tl, tmp_path / "t.gif")
    code = "import sys, stagewise; stagewise.render.draw_text; print('torch' in sys.modules, 'matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
