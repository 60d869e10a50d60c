"""Run many `stagewise` commands in one child process under a memory cap, for the hardening tests.

The parent (``run_capped``) starts ``python tests/capped_cli.py`` with
RLIMIT_AS set (2 GiB by default) and a wall-clock timeout, sends the cases as
JSON on stdin and reads one result per case: exit code, stdout, stderr and
seconds. Each case runs in-process through ``stagewise.cli.main`` (one import
for the whole batch keeps the suite quick); an exception that escapes ``main``
is reported as a traceback in stderr, which the tests then reject.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GiB = 2**30


def run_capped(cases: list[dict], *, memory: int = 2 * GiB, timeout: float = 240.0) -> list[dict]:
    """Each case is ``{"argv": [...], "env": {...}}``; returns ``{"rc", "out", "err", "seconds"}`` per case."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"}
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve())], input=json.dumps(cases), text=True,
                          capture_output=True, timeout=timeout, preexec_fn=cap, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout)


#: seconds a refused case may take: a hang's bound on a loaded 2-core machine, not a speed target
HANG_S = 20


def assert_refused(r: dict, words) -> None:
    """A case's result is bad input as the CLI must answer it: exit 2, one line naming ``words``, no hang."""
    assert r["rc"] == 2, r
    assert "Traceback" not in r["err"] and r["err"].count("\n") == 1, r["err"]
    for w in words:
        assert w in r["err"], (w, r["err"])
    assert r["seconds"] < HANG_S, r


def _one(case: dict) -> dict:
    from stagewise.cli import main

    saved = {k: os.environ.get(k) for k in case.get("env", {})}
    os.environ.update(case.get("env", {}))
    out, err = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(case["argv"])
            except SystemExit as e:
                rc = e.code
    except BaseException:  # noqa: BLE001 - what the test must see: a traceback, MemoryError included
        rc = -1
        err.write(traceback.format_exc())
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return {"rc": rc, "out": out.getvalue()[-20000:], "err": err.getvalue()[-4000:],
            "seconds": time.perf_counter() - t0}


if __name__ == "__main__":
    cases = json.loads(sys.stdin.read())
    sys.stdout.write(json.dumps([_one(c) for c in cases]))
