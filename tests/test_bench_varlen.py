"""benchmarks/bench_varlen.py: a variable-length step against the simulator's calibrated prediction, in its tiny
mode (its figures mean nothing there: the test checks that it runs end to end and what it prints, never a time)."""

import os
import re
import subprocess
import sys

import pytest

import docs_helpers as docs

sys.path.insert(0, str(docs.ROOT / "benchmarks"))
import bench_varlen as bench  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def test_the_fit_recovers_a_linear_and_a_quadratic_part():
    lengths = (64, 128, 256, 512)
    c, q = bench.fit(lengths, [3e-4 * n + 2e-7 * n * n for n in lengths])
    assert c == pytest.approx(3e-4) and q == pytest.approx(2e-7)


def test_the_step_lengths_are_quantiles_of_the_histogram_at_most_8x_apart():
    args = bench.argparse.Namespace(seq=512, m=8, seed=0)
    lens = bench.step_lengths(args)
    assert len(lens) == 8 and min(lens) >= 64 and max(lens) <= 512 and max(lens) == 8 * min(lens)
    assert lens == bench.step_lengths(args) and lens != tuple(sorted(lens))  # seeded, shuffled


def test_tiny_run_prints_measured_predicted_and_length_blind_per_family():
    env = {**os.environ, "PYTHONPATH": str(docs.ROOT)}
    done = subprocess.run([sys.executable, str(docs.ROOT / "benchmarks" / "bench_varlen.py"), "--tiny"],
                          capture_output=True, text=True, timeout=110, env=env, cwd=docs.ROOT)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "calibrated on uniform steps at [8, 64] tokens" in out and "meas/pred" in out
    number = r"\s+(\d+\.\d+)"
    for family in ("1f1b", "zb-h1"):
        row = re.search(rf"^{re.escape(family)}" + number * 9 + "$", out, re.M)
        assert row, out
        a, measured, predicted, ratio, blind = (float(row[k]) for k in range(1, 6))
        assert 0 <= a < 1 and measured > 0 and predicted > 0 and blind > 0
        assert ratio == pytest.approx(measured / predicted, rel=0.02, abs=0.01)  # from the rounded ms
