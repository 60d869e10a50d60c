"""The built-in model: a small GPT decoder as a sequence of layers, and its data.

``GPTConfig`` is what the runtime (and the planner's profiler) consume:
``layers()`` builds the layer list (embedding first, head last; the head's
weight *is* the embedding's, a tied weight), ``batch(step, size)`` makes one
step's (inputs, targets), and ``loss`` is the mean token cross-entropy. Weights
come from ``torch.manual_seed(seed)``, so every rank and the unpipelined
reference build identical ones. Any model config with these methods runs too.
"""

from __future__ import annotations

import os
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ... import limits
from ...data.tensors import block_mask, documents_step, packed
from ..dtensor import is_dtensor
from ..stages import kv
from ..stages.layers import Layers
from ..stages.moe import MoE, check_moe, pack, unpack
from ..arguments import check_seed
from ..config import RunError, check_count

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}

#: the synthetic stream's length: --seq + 1 tokens must fit in it (a fact of the stream, not a limit)
SYNTHETIC_TOKENS = 1 << 16


class Embedding(nn.Module):
    """Token plus learned position embedding: (B, T) ids -> (B, T, d); a sequence slice's positions start at its
    offset (stages/kv.py). A packed micro-batch (the dict ``stagewise.data.tensors.build`` makes) takes each
    token's position in its own document and gives the pair (hidden, document ids), which the blocks pass on so
    attention stays within each document."""

    def __init__(self, vocab: int, seq: int, d_model: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq, d_model)

    def forward(self, idx):
        if packed(idx):
            return self.tok(idx["input_ids"]) + self.pos(idx["position_ids"]), idx["document_ids"]
        pos = torch.arange(idx.shape[1], device=idx.device) + kv.offset()
        return self.tok(idx) + self.pos(pos)


def _documents(h) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(hidden, document ids) of a packed run's pair; (hidden, None) otherwise."""
    return h if isinstance(h, tuple) else (h, None)


def _with(h: torch.Tensor, documents: torch.Tensor | None):
    """What a block passes on: the hidden states, with the document ids in a packed run."""
    return h if documents is None else (h, documents)


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and a 4x MLP, both residual. With ``moe`` its MLP is a
    mixture of experts (``stages/moe.py``): it takes the hidden states, or the pair (hidden, running aux loss)
    after an earlier MoE block, and gives the pair."""

    def __init__(self, d_model: int, heads: int, moe: MoE | None = None):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        if moe is None:
            self.fc = nn.Linear(d_model, 4 * d_model)
            self.out = nn.Linear(4 * d_model, d_model)
        self.moe = moe

    def forward(self, x):
        if self.moe is None:
            x, documents = _documents(x)
            x = _attend(self, x, documents)
            return _with(x + self.out(F.gelu(self.fc(self.ln2(x)))), documents)
        h, aux = unpack(x)
        h, documents = _documents(h)
        h = _attend(self, h, documents)
        y, a = self.moe(self.ln2(h))
        return pack(_with(h + y, documents), a if aux is None else aux + a)


def _attend(block: nn.Module, x: torch.Tensor, documents: torch.Tensor | None = None) -> torch.Tensor:
    """Causal self-attention of a block (its ln1, qkv, proj), residual; with ``documents`` (packed rows) each
    token attends only to its own document's earlier tokens (``stagewise.data.tensors.block_mask``); a sequence
    slice also attends to the keys and values of the slices before it (stages/kv.py)."""
    B, T, D = x.shape
    qkv, heads, first = block.qkv(block.ln1(x)), block.heads, 0
    if is_dtensor(qkv):  # tensor parallel (TP_PLAN): q|k|v is fused, so it is gathered; this rank's heads
        from torch.distributed.tensor import Partial

        heads = block.heads // qkv.device_mesh.size()
        first = qkv.device_mesh.get_local_rank() * heads
        qkv = qkv.to_local(grad_placements=[Partial()])  # each rank's gradient covers its own heads only
    hd = D // block.heads
    q, k, v = (t.view(B, T, block.heads, hd)[:, :, first:first + heads] if heads < block.heads else
               t.view(B, T, block.heads, hd) for t in qkv.split(D, dim=2))
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    if documents is not None:
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=block_mask(documents))
    else:
        k, v = kv.extend(k, v)
        mask = kv.causal_mask(T, k.shape[2], x.device)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
    return x + block.proj(a.transpose(1, 2).reshape(B, T, heads * hd))


def _gathered_columns():
    """The fused q|k|v projection split by output columns and gathered whole (as a DTensor: ``Block`` takes
    its heads), since its columns are [q | k | v], not one head after another."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel

    return ColwiseParallel(output_layouts=Replicate(), use_local_output=False)


#: the built-in GPT's tensor-parallel plan: attention and MLP split Megatron-style (column then row)
TP_PLAN = {"qkv": _gathered_columns, "proj": "rowwise", "fc": "colwise", "out": "rowwise"}


class Head(nn.Module):
    """Final norm and the LM head; ``weight`` is tied to the token embedding. After MoE blocks it takes and
    gives the pair (hidden / logits, aux loss)."""

    def __init__(self, d_model: int, weight: nn.Parameter):
        super().__init__()
        self.ln = nn.LayerNorm(d_model)
        self.weight = weight

    def forward(self, x):
        h, aux = unpack(x)
        h, _ = _documents(h)
        return pack(F.linear(self.ln(h), self.weight), aux)


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    """The built-in GPT and its data (synthetic stream by default, or a file's bytes)."""

    layers_n: int = 4  #: transformer blocks (the layer sequence adds an embedding and a head)
    d_model: int = 32
    heads: int = 4
    seq: int = 16  #: tokens per sequence
    vocab: int = 64  #: 256 when reading --data (byte tokens)
    dtype: str = "float32"
    data: str | None = None  #: a text file read as bytes; None = synthetic stream
    seed: int = 0
    moe_experts: int = 0  #: routed experts of each block's MoE MLP (stages/moe.py); 0: the dense MLP
    moe_top_k: int = 2  #: experts each token goes to
    moe_shared: int = 0  #: shared experts every token goes through
    moe_capacity: float | None = None  #: tokens an expert takes per sequence, x its fair share; None: dropless
    moe_pad: bool = False  #: fixed-size expert buffers (padded to the capacity)
    moe_aux: float = 0.01  #: the load-balancing loss's coefficient
    #: packed documents (``stagewise.data``): each step's documents, lengths drawn from a published long-tailed
    #: distribution (``data/wikipedia.py``) scaled to ``seq``, packed into rows of ``seq`` tokens
    pack: bool = False

    @property
    def num_layers(self) -> int:
        return self.layers_n + 2

    @property
    def name(self) -> str:
        return "gpt"

    @property
    def moe(self) -> bool:
        """The blocks' MLPs are mixtures of experts."""
        return self.moe_experts > 0

    @property
    def symbols(self) -> tuple[str, ...]:
        """Layout letters of the layers: E, t per block (m for an MoE block, as the planner writes it), H
        (``--split 'E+t*2 | t*2+H'``)."""
        return ("E",) + ("m" if self.moe else "t",) * self.layers_n + ("H",)

    def layer_names(self) -> list[str]:
        return ["embedding"] + [f"block{i}" for i in range(self.layers_n)] + ["head"]

    def profile_meta(self) -> dict:
        """What a profile keeps to rebuild this model (``plan --verify`` runs it again)."""
        return {"gpt": asdict(self)}

    def check(self) -> None:
        """Every option against its rule and limit (``RunError`` naming it), before anything is allocated."""
        for name, value in (("`layers_n`", self.layers_n), ("`d_model`", self.d_model), ("`heads`", self.heads),
                            ("`seq`", self.seq), ("`vocab`", self.vocab)):
            check_count(name, value, 1)
        check_seed(self.seed)
        if self.d_model % self.heads:
            raise RunError(f"`d_model` {self.d_model} must be a multiple of `heads` {self.heads}")
        check_count("`moe_experts`", self.moe_experts, 0)
        if self.moe:
            check_moe(experts=self.moe_experts, top_k=self.moe_top_k, hidden=4 * self.d_model, shared=self.moe_shared,
                      capacity=self.moe_capacity, pad=self.moe_pad, aux=self.moe_aux)
        if self.dtype not in DTYPES:
            raise RunError(f"`dtype` must be one of {', '.join(DTYPES)}; got {self.dtype}")
        if self.data is None:
            if self.seq >= SYNTHETIC_TOKENS:
                raise RunError(f"`seq` {self.seq}: the synthetic stream has {SYNTHETIC_TOKENS:,} tokens, so at most "
                               f"{SYNTHETIC_TOKENS - 1:,}; give `data` FILE for longer sequences")
            self.check_sizes(1)
            return
        self.check_sizes(1)
        size = _file_size(self.data)
        if size < self.seq + 1:
            raise RunError(f"`data` {self.data}: {size} bytes; needs at least `seq` + 1 = {self.seq + 1}")
        if self.vocab != 256:
            raise RunError(f"`data` reads byte tokens and needs `vocab` 256; got {self.vocab}")

    def check_sizes(self, sequences: int) -> None:
        """Tensor and parameter sizes against the limits (``sequences``: one micro-batch's), before building."""
        limits.check_gpt_size(layers=self.layers_n, d_model=self.d_model, heads=self.heads, seq=self.seq,
                              vocab=self.vocab, batch=sequences, experts=self.moe_experts, shared=self.moe_shared)

    def identity(self) -> dict:
        """The model's options, as a checkpoint records them (seed and data are the run's: checkpoint_manifest)."""
        out = {"--layers": self.layers_n, "--d-model": self.d_model, "--heads": self.heads, "--seq": self.seq,
               "--vocab": self.vocab, "--dtype": self.dtype}
        if self.moe:  # a dense model's identity stays what older checkpoints recorded
            out.update({"--moe-experts": self.moe_experts, "--moe-top-k": self.moe_top_k,
                        "--moe-shared": self.moe_shared, "--moe-capacity": self.moe_capacity,
                        "--moe-pad": self.moe_pad, "--moe-aux": self.moe_aux})
        return out

    def parameters(self) -> int:
        """The parameter count (the head's weight is the embedding's), without building the model."""
        d = self.d_model
        attention = 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d)
        mlp = (4 * d * d + 4 * d) + (4 * d * d + d)  # one expert's too
        if self.moe:
            shared = self.moe_shared * (8 * d * d + 4 * d) + d if self.moe_shared else 0
            mlp = self.moe_experts * d + self.moe_experts * mlp + shared
        return self.vocab * d + self.seq * d + self.layers_n * (attention + mlp) + 2 * d

    def layers(self) -> Layers:
        """The model as a per-layer factory: each rank builds only its own layers, each from its own seed, so
        every placement (and the unpipelined reference) starts from the same weights. The head's weight is
        tied to the token embedding by name (``0.tok.weight``): built apart, the copies start equal (the
        pipeline broadcasts the embedding's; ``Layers.build_all`` shares one Parameter)."""
        n = self.num_layers
        return Layers(count=n, build=self.layer, ties=(("0.tok.weight", f"{n - 1}.weight"),), tp_plan=TP_PLAN,
                      tp_divides=(("attention heads", self.heads),))

    def layer(self, i: int) -> nn.Module:
        """Layer ``i`` alone (0: embedding, 1..L: blocks, L + 1: head), initialised from (seed, i)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed * 1_000_003 + i)
            if i == 0:
                layer = Embedding(self.vocab, self.seq, self.d_model)
            elif i <= self.layers_n:
                layer = Block(self.d_model, self.heads, self._moe() if self.moe else None)
            else:
                layer = Head(self.d_model, nn.Parameter(torch.empty(self.vocab, self.d_model)))
            layer.apply(_init)
            if isinstance(layer, Head):  # its own copy of the tied weight (the pipeline makes copies equal)
                nn.init.normal_(layer.weight, std=0.02)
        return layer.to(DTYPES[self.dtype])

    def _moe(self) -> MoE:
        return MoE(self.d_model, self.moe_experts, self.moe_top_k, 4 * self.d_model, shared=self.moe_shared,
                   capacity=self.moe_capacity, pad=self.moe_pad, aux=self.moe_aux)

    def batch(self, step: int, size: int, shares: tuple[int, int] = (1, 1)) -> tuple:
        """Step ``step``'s ``size`` sequences: (inputs, targets), both (size, seq) token ids. Packed (``pack``):
        the documents that fit in ``size`` rows, dealt to ``shares`` = (data-parallel shares, micro-batches)
        with tokens balanced (``stagewise.data.pack``); inputs are the dict of ids, positions and documents."""
        if self.pack:
            return self._packed(step, size, shares)
        stream = _stream(self)
        window = self.seq + 1
        n = len(stream) - window + 1
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        starts = torch.randint(0, n, (size,), generator=g)
        rows = torch.stack([stream[s:s + window] for s in starts.tolist()])
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def _packed(self, step: int, size: int, shares: tuple[int, int]) -> tuple:
        """A packed step: documents are windows of the stream at seeded offsets, of drawn lengths (the
        same documents for any ``shares``: only which row goes where changes)."""
        return documents_step(_stream(self), seed=self.seed * 1_000_003 + step, rows=size, budget=self.seq,
                              shares=shares)

    @staticmethod
    def loss(output, target: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over the tokens of ``output`` (B, T, vocab), plus the MoE blocks' aux loss when the
        output is the pair (logits, aux). Targets of -100 (a packed row's padding) are not tokens."""
        logits, aux = unpack(output)
        target = target.flatten()  # the mean over real tokens; a micro-batch of padding only adds 0, not nan
        ce = F.cross_entropy(logits.flatten(0, 1).float(), target, reduction="sum") / \
            (target != -100).sum().clamp_min(1)
        return ce if aux is None else ce + aux.float()


@dataclass(frozen=True, kw_only=True)
class LayerModel:
    """A ``ModelConfig`` of layers already built and a batch maker: profile or train any layer sequence.

    Example::

        model = LayerModel(name="mlp", layer_list=(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)),
                           make_batch=lambda step, n: (torch.randn(n, 16), torch.randn(n, 4)),
                           loss_fn=F.mse_loss)
        stagewise.profiling.measure.profile_model(model, (1, 4))
    """

    name: str
    layer_list: Sequence[nn.Module]  #: the layers, in order (``layers()`` returns these, not copies)
    make_batch: Callable[[int, int], tuple]  #: (step, size) -> (inputs, targets)
    loss_fn: Callable  #: (output, target) -> scalar loss
    symbols: Sequence[str] | None = None  #: layout letters; default E, t..., H
    names: Sequence[str] | None = None  #: each layer's name in a profile (default: its class)
    meta: dict = field(default_factory=dict)  #: how to rebuild the model (kept in a profile)

    @property
    def num_layers(self) -> int:
        return len(self.layer_list)

    def layers(self) -> Layers:
        return Layers.from_modules([(str(i), m) for i, m in enumerate(self.layer_list)])

    def layer_names(self) -> list[str] | None:
        return list(self.names) if self.names else None

    def profile_meta(self) -> dict:
        return dict(self.meta)

    def batch(self, step: int, size: int) -> tuple:
        return self.make_batch(step, size)

    def loss(self, output, target):
        return self.loss_fn(output, target)


def _init(m: nn.Module) -> None:
    """GPT-2's initialisation: N(0, 0.02) weights, zero biases (keeps tied logits small)."""
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, std=0.02)
    if isinstance(m, nn.Linear) and m.bias is not None:
        nn.init.zeros_(m.bias)


_STREAMS: dict = {}


def _stream(cfg: GPTConfig) -> torch.Tensor:
    """The token stream (cached per process): the file's bytes, or a seeded learnable sequence."""
    key = (cfg.data, cfg.vocab, cfg.seed)
    if key not in _STREAMS:
        if cfg.data is not None:
            _STREAMS[key] = torch.frombuffer(bytearray(Path(cfg.data).read_bytes()), dtype=torch.uint8).long()
        else:
            _STREAMS[key] = synthetic_stream(cfg.vocab, cfg.seed)
    return _STREAMS[key]


def synthetic_stream(vocab: int, seed: int, length: int = 1 << 16) -> torch.Tensor:
    """A seeded token stream with structure to learn: a fixed random successor, 1 time in 8 a random token."""
    g = torch.Generator().manual_seed(seed)
    succ = torch.randperm(vocab, generator=g).tolist()
    noise = torch.randint(0, vocab, (length,), generator=g).tolist()
    jump = (torch.rand(length, generator=g) < 0.125).tolist()
    toks, tok = [], 0
    for n, j in zip(noise, jump):
        tok = n if j else succ[tok]
        toks.append(tok)
    return torch.tensor(toks, dtype=torch.long)


def _file_size(path: str) -> int:
    """The size of `data`, a regular readable file within the DATA_BYTES limit (a folder or FIFO is refused
    before anything opens it: opening a FIFO would block)."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise RunError(f"`data` {path}: not a regular file")
        with open(path, "rb"):
            pass
    except OSError as e:
        raise RunError(f"`data` {path}: cannot read: {e.strerror}") from None
    limits.DATA_BYTES.check(st.st_size, "", detail=f"`data` {path}: {st.st_size:,} bytes (read whole on every rank)")
    return st.st_size
