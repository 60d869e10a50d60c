"""Training text as batches: byte tokens or a local tokenizer's, checked against the model's config."""

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parent))
from hf_helpers import hf_config  # noqa: E402

from stagewise.hf import HFError  # noqa: E402
from stagewise.hf.data import TextData  # noqa: E402

TEXT = "the quick brown fox jumps over the lazy dog. " * 20


@pytest.fixture
def text(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text(TEXT)
    return path


def test_byte_batches_are_seeded_windows_of_the_file(text):
    data = TextData(path=str(text), seq=16)
    data.check(hf_config("llama"))
    ids, labels = data.batch(step=3, size=4)
    assert ids.shape == (4, 16) and labels is ids
    raw = TEXT.encode()
    for row in ids.tolist():
        assert bytes(row) in raw
    assert torch.equal(data.batch(3, 4)[0], ids) and not torch.equal(data.batch(4, 4)[0], ids)


def test_byte_tokens_need_256_and_positions_bound_seq(text):
    with pytest.raises(HFError, match="byte tokens .* vocab_size is 128; give a `tokenizer` folder"):
        TextData(path=str(text), seq=16).check(hf_config("llama", vocab_size=128))
    with pytest.raises(HFError, match="`seq` 100 exceeds the model's 64 learned positions"):
        TextData(path=str(text), seq=100).check(hf_config("gpt2"))
    with pytest.raises(HFError, match="needs at least `seq`"):
        TextData(path=str(text), seq=5000).check(hf_config("llama", max_position_embeddings=8192))
    with pytest.raises(HFError, match="cannot read"):
        TextData(path=str(text) + ".missing", seq=16).check(hf_config("llama"))


def test_a_local_tokenizer_folder(text, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(vocab_size=60, special_tokens=["[UNK]"]))
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(tmp_path / "tok")
    data = TextData(path=str(text), seq=8, tokenizer=str(tmp_path / "tok"))
    data.check(hf_config("llama", vocab_size=64))
    ids, _ = data.batch(0, 2)
    assert ids.shape == (2, 8) and int(ids.max()) < 60
    with pytest.raises(HFError, match=r"gives token id \d+; the model's vocab_size is 10"):
        data.check(hf_config("llama", vocab_size=10))
    with pytest.raises(HFError, match="not a folder .*nothing is downloaded"):
        TextData(path=str(text), seq=8, tokenizer="gpt2").check(hf_config("llama"))
