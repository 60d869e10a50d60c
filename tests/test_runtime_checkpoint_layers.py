"""Layer-keyed checkpoints of an earlier stagewise (runtime/resilience/checkpoint_layers.py): files that are not
ours are refused by name. Resuming one under another layout: test_runtime_checkpoint.py."""

from __future__ import annotations

import io

import pytest

torch = pytest.importorskip("torch")

from stagewise.runtime.resilience.checkpoint_layers import _payload, home_layer  # noqa: E402
from stagewise.runtime.config import RunError  # noqa: E402


def test_a_logical_name_lives_with_its_first_use():
    assert home_layer("3.fc.weight") == 3 and home_layer("0.tok.weight") == 0


def test_bytes_that_are_not_a_layer_file_are_refused_naming_the_file(tmp_path):
    with pytest.raises(RunError, match=r"layer-00002.pt is not a layer file of a checkpoint \(UnpicklingError"):
        _payload(tmp_path, 2, b"not a torch file")
    buf = io.BytesIO()
    torch.save({"weights": torch.zeros(2)}, buf)
    with pytest.raises(RunError, match="layer-00002.pt is not a layer file of a checkpoint .no params and optim"):
        _payload(tmp_path, 2, buf.getvalue())
