"""A checkpoint folder on disk (runtime/resilience/checkpoint_files.py): atomic files, a manifest last."""

from __future__ import annotations

import hashlib
import json

import pytest

from stagewise.runtime.resilience import checkpoint_files as files
from stagewise.runtime.config import RunError


def test_an_atomic_write_leaves_the_file_and_its_entry_and_no_temporary(tmp_path):
    entry = files.atomic_write(tmp_path / "layer-00000.pt", b"weights")
    assert entry == {"bytes": 7, "sha256": hashlib.sha256(b"weights").hexdigest()}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["layer-00000.pt"]


def test_a_step_folder_without_its_manifest_is_incomplete_and_names_itself(tmp_path):
    step = files.step_dir(tmp_path, 4)
    step.mkdir()
    assert files.incomplete(step) == "step-00000004 has no manifest.json (its save did not finish)"
    (step / files.MANIFEST).write_text(json.dumps({"format": 1}))
    assert "manifest.json is malformed" in files.incomplete(step)
    with pytest.raises(RunError, match="no complete checkpoint"):
        files.find(str(tmp_path))
