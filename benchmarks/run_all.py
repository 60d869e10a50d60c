"""Run the benchmarks and write what they printed to benchmarks/RESULTS.md (`make bench`).

Each benchmark prints its own side-by-side figures (medians, ratios against a baseline). This script runs
each of its commands (``COMMANDS``), shows the output as it comes, and records it in RESULTS.md with
when and where it ran: the date, the commit, the machine (cores, load average at the start and the end,
torch and Python versions), the command, its wall time and exit status. The docs link to RESULTS.md
instead of quoting figures, so a figure is never older than the file says.

    python benchmarks/run_all.py                    # every benchmark (long: tens of minutes on 2 cores)
    python benchmarks/run_all.py simulate render    # a subset: their sections are replaced, the others kept
    python benchmarks/run_all.py --list             # the commands, without running them

``--dir`` and ``--out`` point at another folder of ``bench_*.py`` scripts and another results file (the
tests use them on a tiny benchmark).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

#: the arguments of each benchmark's commands (one entry per command; a benchmark not named runs once, bare)
COMMANDS: dict[str, list[list[str]]] = {
    "api_overhead": [["--steps", "42"], ["--width", "512", "--rows", "64", "--steps", "32"]],
    "hf_vs_torch": [["--steps", "9"]],
    "plan_fidelity": [["--devices", "2", "--rounds", "3"]],
    "pp_fsdp_vs_torch": [["--steps", "13"]],
    "render": [[], ["--dense-only"]],
    "simulate": [["--plot", "docs/img/simulate_scaling.png"]],
    "workshop": [["--cap", "8"]],
}

HEADER = """# Benchmark results

Written by `make bench` (`python benchmarks/run_all.py [NAME ...]`); do not edit by hand. Each section is one
command as it ran: when, at which commit, on what machine, and what it printed. A figure measured on a shared
machine depends on its load, which each section records; the benchmarks compare side by side in one run
(medians, ratios) so that load falls on both sides alike. Run a subset to refresh its sections only.
"""

MARK = re.compile(r"^<!-- bench (\{.*\}) -->$")
END = "<!-- /bench -->"


@dataclass(frozen=True, kw_only=True)
class Run:
    """One command's run, as RESULTS.md records it."""

    name: str  #: the benchmark, ``bench_<name>.py``
    command: str  #: the command line as a user types it, from the repository root
    date: str  #: UTC start, ISO 8601
    commit: str  #: ``git describe``-like: the short hash, ``+dirty`` when the work tree had changes
    cores: int
    load_start: float  #: 1-minute load average when it started
    load_end: float
    torch: str
    python: str
    wall_s: float
    rc: int
    output: str


def machine() -> dict:
    """What the runs share about the machine (cores, torch, Python)."""
    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = "not installed"
    return {"cores": os.cpu_count() or 1, "torch": torch, "python": platform.python_version()}


def commit() -> str:
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = [ln for ln in git("status", "--porcelain").splitlines() if not ln.endswith("RESULTS.md")]
    return head + ("+dirty" if dirty else "")


def command_line(script: Path, args: list[str]) -> str:
    """The command as typed from the repository root."""
    where = script.relative_to(ROOT).as_posix() if script.is_relative_to(ROOT) else str(script)
    return " ".join(["python", where, *args])


def run_one(name: str, script: Path, args: list[str], env: dict, shared: dict) -> Run:
    """Run one command, echoing its output as it comes, and record it."""
    shown = command_line(script, args)
    print(f"\n=== {shown} ===", flush=True)
    start, load, head = datetime.now(timezone.utc), os.getloadavg()[0], commit()
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, str(script), *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = []
    for line in proc.stdout:
        sys.stdout.write(line)
        lines.append(line)
    rc = proc.wait()
    # the commit as this command starts: the work tree may change while a long run goes on
    return Run(name=name, command=shown, date=start.strftime("%Y-%m-%dT%H:%M:%SZ"), commit=head,
               cores=shared["cores"], load_start=round(load, 2), load_end=round(os.getloadavg()[0], 2),
               torch=shared["torch"], python=shared["python"], wall_s=round(time.perf_counter() - t0, 1), rc=rc,
               output="".join(lines).rstrip("\n"))


def section(run: Run) -> str:
    meta = {k: v for k, v in asdict(run).items() if k != "output"}
    status = "ok" if run.rc == 0 else f"**failed, exit {run.rc}**"
    fence = "````" if "```" in run.output else "```"
    return "\n".join([
        f"<!-- bench {json.dumps(meta)} -->",
        f"### `{run.command}`", "",
        f"{run.date} at commit `{run.commit}`; {run.cores} cores, load average {run.load_start} at the start and "
        f"{run.load_end} at the end; torch {run.torch}, Python {run.python}; {run.wall_s} s wall, {status}.", "",
        fence, run.output, fence, END])


def read_sections(path: Path) -> dict[str, tuple[dict, str]]:
    """The sections of an existing RESULTS.md, by command: (metadata, text)."""
    out: dict[str, tuple[dict, str]] = {}
    if not path.exists():
        return out
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = MARK.match(lines[i])
        if m:
            j = lines.index(END, i)
            meta = json.loads(m.group(1))
            out[meta["command"]] = (meta, "\n".join(lines[i:j + 1]))
            i = j
        i += 1
    return out


def write(path: Path, sections: dict[str, tuple[dict, str]]) -> None:
    """RESULTS.md: the header, a summary table, then every section, in command order."""
    order = sorted(sections)
    rows = ["| command | when | commit | cores | load at start | torch | wall | status |", "|---|---|---|---|---|---|---|---|"]
    for cmd in order:
        m = sections[cmd][0]
        anchor = re.sub(r"[^\w\- ]", "", cmd.lower()).replace(" ", "-")
        rows.append(f"| [`{cmd}`](#{anchor}) | {m['date']} | `{m['commit']}` | {m['cores']} | {m['load_start']} | "
                    f"{m['torch']} | {m['wall_s']} s | {'ok' if m['rc'] == 0 else 'exit %d' % m['rc']} |")
    body = [HEADER, "\n".join(rows), ""] + [sections[cmd][1] + "\n" for cmd in order]
    path.write_text("\n".join(body))


def commands(folder: Path, wanted: list[str]) -> list[tuple[str, Path, list[str]]]:
    scripts = {p.stem.removeprefix("bench_"): p for p in sorted(folder.glob("bench_*.py"))}
    unknown = [w for w in wanted if w not in scripts]
    if unknown:
        raise SystemExit(f"run_all.py: no benchmark named {', '.join(unknown)}; there are: {', '.join(scripts)}")
    return [(name, script, args) for name, script in scripts.items() if not wanted or name in wanted
            for args in COMMANDS.get(name, [[]])]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="benchmarks to run (bench_NAME.py), default all")
    ap.add_argument("--dir", type=Path, default=HERE, help="the folder of bench_*.py scripts")
    ap.add_argument("--out", type=Path, default=HERE / "RESULTS.md", help="the results file to update")
    ap.add_argument("--list", action="store_true", help="print the commands and stop")
    args = ap.parse_args(argv)
    todo = commands(args.dir.resolve(), args.names)
    if args.list:
        print("\n".join(command_line(s, a) for _, s, a in todo))
        return 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    shared = machine()
    sections = read_sections(args.out)
    failed = []
    for name, script, cmd_args in todo:
        run = run_one(name, script, cmd_args, env, shared)
        sections[run.command] = (asdict(run), section(run))
        write(args.out, sections)  # after every command: an interrupted run keeps what it measured
        if run.rc:
            failed.append(run.command)
    print(f"\nwrote {args.out}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
