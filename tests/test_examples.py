"""The examples run as users run them: under torchrun, 2 ranks on loopback, and they learn."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from runtime_helpers import free_port

pytestmark = [pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[1]


def torchrun(script: str, tmp_path) -> subprocess.CompletedProcess:
    port = free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(port), str(ROOT / "examples" / script)]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150, cwd=tmp_path, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def first_and_last(out: str) -> tuple[float, float]:
    m = re.search(r"loss ([\d.]+) -> ([\d.]+)", out)
    assert m, out
    return float(m[1]), float(m[2])


def test_mlp_with_adamw_and_a_cosine_schedule_learns(tmp_path):
    first, last = first_and_last(torchrun("mlp_adamw_cosine.py", tmp_path).stdout)
    assert last < first / 3


def test_a_tuple_boundary_with_an_integer_mask_and_changing_lengths_learns(tmp_path):
    first, last = first_and_last(torchrun("tuple_boundary.py", tmp_path).stdout)
    assert last < first / 10


def test_the_factory_builds_each_layer_on_its_own_rank_only(tmp_path):
    out = torchrun("factory_per_rank.py", tmp_path).stdout
    built = dict(re.findall(r"rank (\d): built layers (\[[\d, ]+\])", out))
    # interleaved-1f1b, p=2, v=2: stages 0..3 of two layers each, stage s on rank s % 2
    assert built == {"0": "[0, 1, 4, 5]", "1": "[2, 3, 6, 7]"}
    first, last = first_and_last(out)
    assert last < first / 10
