"""A Hugging Face causal LM as the runtime's model interface (``ModelConfig``): what ``stagewise train --hf``,
``profile --hf`` and ``plan --verify`` of an HF profile run.

``HFRun`` holds only paths and options (it is pickled to every rank); each process loads the config once and
builds only the layers it is asked for (``HFModel.layer``: a rank reads only its own tensors). With ``data``
the batches are windows of that text (``TextData``); without, seeded random token ids of ``seq`` tokens (a
profile or a verification run needs shapes, not meaning). Training it is the runtime's one loop
(``RunConfig`` -> ``RankTrainer`` -> ``RunResult``): the same checkpoints (resumable under any schedule, p or
dp), non-finite guard, flight recorder and memory prediction as the built-in GPT; ``export`` writes an HF
folder that ``from_pretrained`` loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .data import TextData
from .model import HFModel, load

#: what every rank of an HF run imports, whatever the model (transformers' modeling_utils: over 2 s of CPU;
#: a model's own modeling module is a tenth of that): the local launcher's forkserver imports them once
#: instead of each rank (``cli/train_hf.RANK_IMPORTS``, which starts it early, is held equal by a test)
RANK_IMPORTS = ("stagewise.hf.hf_run", "transformers.loss.loss_utils", "transformers.masking_utils",
                "transformers.modeling_utils")


@dataclass(frozen=True, kw_only=True)
class HFRun:
    """An HF model folder (or config.json) and its training text, as a run's model.

    >>> from stagewise.runtime import RunConfig, train                                  # doctest: +SKIP
    >>> model = HFRun(source="tiny-llama", data="corpus.txt", seq=64)                  # doctest: +SKIP
    >>> train(RunConfig(schedule="zb-v", ranks=2, microbatches=4, steps=5, model=model))  # doctest: +SKIP
    """

    source: str  #: a model folder (config.json + safetensors) or a config.json (seeded random weights)
    data: str | None = None  #: a text file to train on; None: random token ids (profiles, verification)
    tokenizer: str | None = None  #: a local tokenizer folder for ``data`` (default: byte tokens)
    seq: int = 128  #: tokens per sequence
    dtype: str = "float32"
    seed: int = 0  #: random weights (a config.json alone) and the order of the text's windows
    #: packed documents (``stagewise.data``): windows of the text of lengths drawn from a published long-tailed
    #: distribution, packed into rows of ``seq``, with per-document position ids and a block-causal 4D mask
    pack: bool = False

    # ---- the model interface (runtime/config.py: ModelConfig)

    def model(self) -> HFModel:
        """The model (config, weights folder), loaded once per process."""
        key = (self.source, self.dtype, self.seed)
        if key not in _MODELS:
            _MODELS[key] = load(self.source, dtype=self.dtype, seed=self.seed)
        return _MODELS[key]

    def rank_imports(self) -> tuple[str, ...]:
        """What every rank imports for any HF model (``RANK_IMPORTS``)."""
        return RANK_IMPORTS

    def text(self) -> TextData | None:
        return None if self.data is None else TextData(path=self.data, seq=self.seq, tokenizer=self.tokenizer,
                                                       seed=self.seed)

    @property
    def num_layers(self) -> int:
        return self.model().num_layers

    @property
    def name(self) -> str:
        m = self.model()
        return f"{m.config.model_type} ({m.decoder_layers} layers)"

    @property
    def symbols(self) -> list[str]:
        return self.model().symbols

    def layer_names(self) -> list[str]:
        return list(self.model().prefixes)

    def layers(self):
        """This model as ``stagewise.Layers``: a rank builds (and reads) only its own layers, under HF names."""
        return self.model().as_layers()

    def batch(self, step: int, size: int, shares: tuple[int, int] = (1, 1)):
        """Step ``step``'s (input_ids, labels); labels are the ids (transformers shifts them in its loss).
        Packed (``pack``): the packed dict and labels with -100 at each document's first token and on padding,
        rows dealt to ``shares`` = (data-parallel shares, micro-batches) with tokens balanced."""
        if self.pack:
            from ..data.tensors import documents_step

            return documents_step(self._stream(), seed=self.seed * 1_000_003 + step, rows=size, budget=self.seq,
                                  shares=shares, labels="same")
        text = self.text()
        if text is not None:
            return text.batch(step, size)
        import torch

        vocab = int(self.model().config.vocab_size)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        ids = torch.randint(0, vocab, (size, self.seq), generator=g)
        return ids, ids

    def _stream(self):
        """The tokens packed documents are cut from: the text's, or seeded random ids without ``data``."""
        text = self.text()
        if text is not None:
            return text.tokens()
        import torch

        g = torch.Generator().manual_seed(self.seed)
        return torch.randint(0, int(self.model().config.vocab_size), (max(1 << 12, 4 * self.seq),), generator=g)

    def loss(self, logits, labels):
        return self.model().loss(logits, labels)

    def shifted_loss(self, logits, shift_labels):
        """The loss from labels shifted before a run cuts sequence slices (``HFModel.shifted_loss``)."""
        return self.model().shifted_loss(logits, shift_labels)

    def shift_labels(self, labels):
        return self.model().shift_labels(labels)

    def check(self) -> None:
        """The config, the weights folder and the text against the model, before any rank starts (every time:
        a limit raised or lowered since the model was loaded applies)."""
        from ..runtime.arguments import check_seed

        check_seed(self.seed)  # before the seeded weights are made
        model = self.model()
        model.check()
        text = self.text()
        if text is not None:
            text.check(model.config)
        elif self.seq < 1:
            from .errors import HFError

            raise HFError(f"`seq` must be >= 1; got {self.seq}")

    def check_fit(self, stages: int, split=None) -> None:
        """Every stage of the schedule gets a layer: said in the model's own terms."""
        self.model().check_fit(stages, split)

    def identity(self) -> dict:
        """What a checkpoint records of the model: the architecture's shape, not where it was read from (a run
        resumed from an exported folder is the same model)."""
        c = self.model().config
        keys = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "vocab_size", "n_embd", "n_layer", "n_head")
        return {**{k: getattr(c, k) for k in keys if isinstance(getattr(c, k, None), (int, str))},
                "--seq": self.seq, "--dtype": self.dtype, "--tokenizer": self.tokenizer}

    def profile_meta(self) -> dict:
        """What a profile keeps to rebuild this model (``plan --verify`` runs it again)."""
        return {"hf": {"source": str(Path(self.source).resolve()), "seq": self.seq, "dtype": self.dtype,
                       "seed": self.seed}}

    @classmethod
    def from_meta(cls, meta: dict) -> "HFRun":
        """The model of a profile's ``hf`` section (``profile_meta``)."""
        return cls(source=meta["source"], seq=int(meta.get("seq", 128)), dtype=meta.get("dtype", "float32"),
                   seed=int(meta.get("seed", 0)))

    def read_bytes(self) -> int:
        """Bytes of weights this process has read from the folder (0 for random weights)."""
        m = self.model()
        return m.checkpoint().read_bytes if m.folder else 0

    def export(self, pipe, folder: str | Path) -> Path:
        """The pipelined model as an HF folder that ``from_pretrained`` loads (a collective)."""
        from .pipelined import save_pretrained

        return save_pretrained(pipe, self.model(), folder)

    def export_whole(self, state: dict, folder: str | Path) -> Path:
        """The unpipelined model (HF names -> tensors) as the same HF folder (one process)."""
        from .pipelined import save_whole

        return save_whole(self.model(), state, folder)


_MODELS: dict = {}
