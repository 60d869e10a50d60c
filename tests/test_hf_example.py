"""examples/hf_llama_zbv.py runs as a user runs it: a tiny Llama learns under zb-v, loads back, samples."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[1]


def test_tiny_llama_learns_saves_and_samples(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "hf_llama_zbv.py"), "--steps", "40"],
                          capture_output=True, text=True, timeout=200, cwd=tmp_path, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = re.search(r"loss ([\d.]+) -> ([\d.]+) in 40 steps", proc.stdout)
    assert m, proc.stdout
    assert float(m[2]) < 0.75 * float(m[1])
    assert (tmp_path / "trained-llama" / "model.safetensors.index.json").is_file()
    sample = re.search(r"sample: '(.*)'", proc.stdout)
    assert sample and sample[1].startswith("# stagewise") and len(sample[1]) > 16  # the prompt, then new text
