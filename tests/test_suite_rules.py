"""Rules the suite keeps about itself: no assertion on measured time.

A shared 2-core CI machine can run any timed piece two or three times slower at any moment, so a ratio
of two timed runs, or a tight bound on one, fails a landing at random. A test may check that timings
were measured and reported (positive, finite, structured); speed belongs in benchmarks/. What remains
allowed is a bound that only catches a hang: a number of at least ``HANG_FLOOR_S`` seconds, or a named
module constant (``BOUND_S``, ``HANG_S`` ...) whose value is at least that. An assertion that orders
timed values by construction (a median is never below the minimum) says so with ``# structural:`` and why.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

HERE = Path(__file__).parent
HANG_FLOOR_S = 10  #: the smallest bound that counts as catching a hang on a loaded machine
#: what reads a clock or holds a measured duration
TIMED = re.compile(r"perf_counter|monotonic|process_time|time\.time|elapsed|seconds|wall_s|measured_step|"
                   r"measured_best|step_time_s|slowdown")
ORDER = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def _constants(tree: ast.Module) -> dict[str, float]:
    """Module-level ``NAME = number`` (and ``NAME = number * number``) assignments."""
    out: dict[str, float] = {}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = _number(node.value, out)
            for t in targets:
                if isinstance(t, ast.Name) and value is not None:
                    out[t.id] = value
    return out


def _number(node: ast.AST, names: dict[str, float]) -> float | None:
    """The value of a numeric expression of constants and known names, else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        a, b = _number(node.left, names), _number(node.right, names)
        if a is not None and b is not None:
            return a + b if isinstance(node.op, ast.Add) else a * b
    return None


def timing_violations(source: str, filename: str) -> list[str]:
    """Each ordered comparison in an ``assert`` that involves a clock or a measured duration and whose other
    side is not 0 (a measured time is positive) nor a hang bound of at least ``HANG_FLOOR_S``."""
    tree = ast.parse(source, filename)
    names = _constants(tree)
    lines = source.splitlines()
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assert) or "# structural:" in lines[node.lineno - 1]:
            continue
        for cmp in (n for n in ast.walk(node.test) if isinstance(n, ast.Compare)):
            if not any(isinstance(op, ORDER) for op in cmp.ops):
                continue
            sides = [cmp.left, *cmp.comparators]
            timed = [s for s in sides if TIMED.search(ast.unparse(s))]
            if not timed:
                continue
            for other in (s for s in sides if s not in timed):
                value = _number(other, names)
                if value is None or not (value == 0 or value >= HANG_FLOOR_S):
                    found.append(f"{filename}:{node.lineno}: {ast.unparse(cmp)}")
                    break
            else:
                if len(timed) > 1:  # two measured values ordered against each other: a ranking of timed runs
                    found.append(f"{filename}:{node.lineno}: {ast.unparse(cmp)}")
    return found


def test_no_test_asserts_on_measured_time():
    found = [v for path in sorted(HERE.rglob("*.py")) for v in timing_violations(path.read_text(), path.name)]
    assert not found, "timing belongs in benchmarks/ (a hang bound is >= 10 s):\n" + "\n".join(found)


def test_the_rule_catches_ratios_rankings_and_tight_bounds():
    bad = ("assert a.measured_best <= 1.3 * fastest_seconds\n"
           "assert 0.4 < predicted / r['measured_best'] < 2.5\n"
           "assert time.monotonic() - t0 < 2.0\n"
           "T = 1.0\nassert elapsed < 2.5 * T\n"
           "assert fit['slowdown'] < 3\n"
           "assert x.seconds < y.seconds\n")
    assert len(timing_violations(bad, "bad.py")) == 6
    fine = ("BOUND_S = 10.0\nassert seconds < BOUND_S\nassert seconds < 1 + BOUND_S\n"
            "assert elapsed < 120\nassert r['measured_best'] > 0\nassert fit['slowdown'] >= 0\n"
            "assert predicted.step_time < other.step_time\n"
            "assert a.seconds >= b.seconds  # structural: a sum of positive parts\n")
    assert timing_violations(fine, "fine.py") == []
