"""`make bench` writes benchmarks/RESULTS.md: run_all.py on a folder of tiny benchmarks, as the docs rely on it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import docs_helpers as docs

RUN_ALL = docs.ROOT / "benchmarks" / "run_all.py"


def _run_all(folder: Path, out: Path, *names: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(RUN_ALL), "--dir", str(folder), "--out", str(out), *names],
                          capture_output=True, text=True, timeout=120)


def _sections(out: Path) -> dict[str, dict]:
    metas = [json.loads(m) for m in re.findall(r"^<!-- bench (\{.*\}) -->$", out.read_text(), re.M)]
    return {m["name"]: m for m in metas}


def test_run_all_writes_each_command_with_its_machine_and_keeps_the_others(tmp_path):
    (tmp_path / "bench_tiny.py").write_text("print('tiny: 1.5 ms, ratio 0.9')\n")
    (tmp_path / "bench_other.py").write_text("print('other: 2 ms')\n")
    (tmp_path / "bench_broken.py").write_text("import sys\nprint('half done')\nsys.exit(3)\n")
    out = tmp_path / "RESULTS.md"

    done = _run_all(tmp_path, out, "tiny")
    assert done.returncode == 0, done.stderr
    assert "tiny: 1.5 ms" in done.stdout  # echoed as it runs
    text = out.read_text()
    meta = _sections(out)["tiny"]
    assert meta["command"].endswith("bench_tiny.py") and meta["rc"] == 0
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", meta["date"])
    assert meta["cores"] >= 1 and meta["load_start"] >= 0 and meta["torch"] and meta["python"]
    assert re.fullmatch(r"[0-9a-f]{4,}(\+dirty)?|unknown", meta["commit"])
    assert "tiny: 1.5 ms, ratio 0.9" in text and f"load average {meta['load_start']}" in text

    done = _run_all(tmp_path, out, "other", "broken")  # a subset: its sections replaced, tiny's kept
    assert done.returncode == 1 and "failed" in done.stdout
    metas = _sections(out)
    assert set(metas) == {"tiny", "other", "broken"} and metas["tiny"] == meta
    assert metas["broken"]["rc"] == 3 and "half done" in out.read_text() and "exit 3" in out.read_text()


def test_run_all_refuses_an_unknown_benchmark_and_lists_its_commands(tmp_path):
    (tmp_path / "bench_tiny.py").write_text("print('x')\n")
    done = _run_all(tmp_path, tmp_path / "R.md", "nope")
    assert done.returncode != 0 and "no benchmark named nope" in done.stderr
    assert not (tmp_path / "R.md").exists()
    listed = subprocess.run([sys.executable, str(RUN_ALL), "--list"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0
    scripts = sorted(p.name for p in (docs.ROOT / "benchmarks").glob("bench_*.py"))
    assert sorted({line.split()[1].split("/")[-1] for line in listed.stdout.splitlines()}) == scripts


def test_the_summary_links_every_section():
    """The shipped RESULTS.md: one row per section, each row's link an anchor of the page."""
    results = docs.ROOT / "benchmarks" / "RESULTS.md"
    anchors = docs.anchors(results)
    links = [t for _, t in docs.links(results)]
    assert links and all(t.startswith("#") and t[1:] in anchors for t in links)
    assert len(links) == len(re.findall(r"^<!-- bench \{", results.read_text(), re.M))


def test_every_benchmark_compiles():
    """make bench runs every bench_*.py: none may fail before it starts (a bad indent once did)."""
    import py_compile

    for script in sorted((docs.ROOT / "benchmarks").glob("*.py")):
        py_compile.compile(str(script), doraise=True)
