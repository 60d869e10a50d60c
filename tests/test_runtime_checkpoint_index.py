"""DCP's index read without running code (runtime/resilience/checkpoint_index.py): only the index's own types are
admitted, its shape is checked, and a state that does not fit it is said key by key. Resuming from crafted
checkpoints through the CLI and on ranks: test_runtime_checkpoint.py."""

from __future__ import annotations

import os
import pathlib
import pickle

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

from stagewise.runtime.resilience import checkpoint_index as index  # noqa: E402


@pytest.fixture
def saved(tmp_path):
    """A DCP checkpoint of a small state, saved in this process: (folder, the state)."""
    import torch.distributed.checkpoint as dcp

    state = {"model": {"w": torch.randn(4, 3), "b": torch.zeros(3)}, "optim": {"state.w.exp_avg": torch.ones(4, 3),
                                                                          "param_groups.w.lr": 0.1}}
    dcp.save(state, checkpoint_id=str(tmp_path / "ck"), no_dist=True)
    return tmp_path / "ck", state


class Touch:
    """A pickle that creates ``path`` when it is unpickled (what a crafted index would do, and worse)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def test_an_index_is_read_back_as_dcp_wrote_it(saved):
    folder, state = saved
    md = index.read(folder / ".metadata")
    assert tuple(md.state_dict_metadata["model.w"].size) == (4, 3)
    assert index.problems(md, state, lambda top, key: f"{top} {key}") == []


@pytest.mark.parametrize("payload", [
    lambda marker: Touch(marker),
    lambda marker: {"innocent": [1, 2, Touch(marker)]},  # deep inside something harmless
    lambda marker: os.system,  # a function by name
    lambda marker: pathlib.Path.touch,  # a dotted name inside an admitted module
])
def test_a_crafted_index_is_refused_before_any_of_its_code_runs(tmp_path, payload):
    marker = tmp_path / "ran"
    data = pickle.dumps(payload(marker))
    (tmp_path / ".metadata").write_bytes(data)
    with pytest.raises(index.BadIndex, match="is not a type of a DCP index"):
        index.read(tmp_path / ".metadata")
    assert not marker.exists()
    if isinstance(payload(marker), Touch):  # the payload is live: plain pickle.load runs it
        pickle.loads(data)
        assert marker.exists()


@pytest.mark.parametrize("raw, words", [
    (b"", "not a pickle DCP wrote"),
    (b"\x80\x04garbage", "not a pickle DCP wrote"),
    (pickle.dumps([1, 2]), "it holds a list, not DCP's Metadata"),
    # lengths past what the machine can hold (issue 44: OverflowError escaped): a frame, bytes, a string
    *((b"\x80\x05" + op + b"\xff" * 8 + b"N.", r"not a pickle DCP wrote \(OverflowError\)") for op in
      (b"\x95", b"\x8e", b"\x8d", b"\x96")),
])
def test_bytes_that_are_not_an_index_are_refused_in_words(tmp_path, raw, words):
    (tmp_path / ".metadata").write_bytes(raw)
    with pytest.raises(index.BadIndex, match=words):
        index.read(tmp_path / ".metadata")


def test_an_index_of_the_wrong_shape_is_refused_naming_the_entry(saved, tmp_path):
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    folder, _ = saved
    md = index.read(folder / ".metadata")
    md.state_dict_metadata["model.w"].chunks.append(ChunkStorageMetadata(offsets=torch.Size([3, 0]),
                                                                         sizes=torch.Size([4, 3])))
    (tmp_path / ".metadata").write_bytes(pickle.dumps(md))
    with pytest.raises(index.BadIndex, match=r"entry 'model.w': a chunk outside its tensor of size \(4, 3\)"):
        index.read(tmp_path / ".metadata")


def test_a_state_that_does_not_fit_the_index_is_said_key_by_key(saved):
    folder, state = saved
    md = index.read(folder / ".metadata")
    other = {"model": {"w": torch.zeros(5, 3), "b": torch.zeros(3, dtype=torch.float64), "c": torch.zeros(1)},
             "optim": {"param_groups.w.lr": torch.zeros(())}}
    assert index.problems(md, other, lambda top, key: key) == [
        "its w has shape (4, 3); this model's has (5, 3)", "its b is float32; this model's is float64",
        "it holds no c", "its param_groups.w.lr is not a tensor"]
