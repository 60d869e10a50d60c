"""Tensor parallel inside each stage: torch's DTensor ``parallelize_module``, one plan for the whole model.

A plan maps module-name patterns to styles, the shape of transformers' ``base_model_tp_plan``
(``{"layers.*.self_attn.q_proj": "colwise", "layers.*.mlp.down_proj": "rowwise"}``). A pattern matches the
*end* of a module's name in the original model, ``*`` standing for one name component, so the base model's
``layers.*.mlp.up_proj`` matches ``model.layers.3.mlp.up_proj``. A style is a torch ``ParallelStyle``, a
function making one, or one of the names transformers uses (``STYLE_NAMES``). Each rank applies the plan to its own layers only, with the
``tp`` sub-mesh; a ``parallelize(stage_module, tp_mesh)`` function replaces the plan where a model needs
code (several tp ranks of one stage hold one stage together).

Boundaries between stages carry plain tensors: the styles' outputs are local (``use_local_output``) and
replicated over the tp group, so each tp rank of a stage sends to the same tp rank of the next stage
(``Topology.pipe_ranks`` keeps the other coordinates fixed), as torchtitan and Megatron-LM do.

``replicated_with_grad_allreduce`` (transformers' name; Qwen3's per-head q/k norms) keeps a parameter
replicated whose gradient each tp rank forms from its own heads only: its gradients are summed over the
tp group at the stage's end of backward (``after``), before any data-parallel reduction of them.
"""

from __future__ import annotations

from typing import Callable, Mapping

import torch
import torch.distributed as dist
from torch import nn

from ..dtensor import local
from ..config import RunError, check_divides

#: the partial-gradient style (module kept as is; its gradients summed over tp at the end of the backward)
PARTIAL = "replicated_with_grad_allreduce"


def _styles() -> dict[str, Callable]:
    """transformers' style names -> torch's ParallelStyle (made lazily: torch.distributed.tensor imports late)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    return {
        "colwise": ColwiseParallel,
        "rowwise": RowwiseParallel,
        "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
        "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
        "rowwise_rep": lambda: RowwiseParallel(input_layouts=Replicate()),
        "rowwise_split_input": lambda: RowwiseParallel(input_layouts=Replicate()),
        "sequence_parallel": SequenceParallel,
        "replicate": lambda: None,  # every rank keeps the whole module
        PARTIAL: lambda: PARTIAL,
    }


STYLE_NAMES = ("colwise", "rowwise", "colwise_rep", "colwise_gather_output", "rowwise_rep", "rowwise_split_input",
               "sequence_parallel", "replicate", PARTIAL)  #: the style names a plan may use


def matches(pattern: str, name: str) -> bool:
    """``pattern`` (dotted, ``*`` = one component) matches the end of the dotted ``name``.

    >>> matches("layers.*.mlp.up_proj", "model.layers.3.mlp.up_proj"), matches("fc", "2.fc"), matches("fc", "2.fc2")
    (True, True, False)
    """
    want, have = pattern.split("."), name.split(".")
    if len(want) > len(have):
        return False
    return all(w == "*" or w == h for w, h in zip(want, have[len(have) - len(want):]))


def check_plan(plan, own: bool = False) -> None:
    """The plan's shape: string patterns to a style name or a torch ``ParallelStyle`` (``RunError`` naming it).

    ``own``: the plan is the model's own (transformers' ``base_model_tp_plan``), not the user's ``tp_plan``; a
    style stagewise does not run (transformers 5.24's Mixtral experts, ``packed_colwise``) is then said as the
    model's, with what to do instead, before any rank starts (``stagewise train --hf`` calls it).
    """
    from torch.distributed.tensor.parallel import ParallelStyle

    if not isinstance(plan, Mapping):
        raise RunError(f"`tp_plan` must be a dict of module-name patterns to styles; got {type(plan).__name__}")
    if not plan:
        raise RunError("`tp_plan` is empty, so tensor parallel would shard nothing; give module-name patterns to "
                       "styles ({\"layers.*.mlp.up_proj\": \"colwise\", ...}), or `tp` 1")
    for pattern, style in plan.items():
        if not isinstance(pattern, str) or not pattern or any(not c for c in pattern.split(".")):
            raise RunError(f"`tp_plan` key {pattern!r} is not a module-name pattern (dotted names, * for one part)")
        if isinstance(style, str) and style not in STYLE_NAMES:
            if own:
                raise RunError(f"`tp` needs the model's own tensor-parallel plan (transformers' base_model_tp_plan), "
                               f"and it gives {pattern!r} the style {style!r}, which stagewise's tensor parallel does "
                               f"not run (it runs {', '.join(STYLE_NAMES)}); use `tp` 1 with this model (its experts "
                               f"shard over `ep`), or give `tp_plan` or `parallelize` of your own")
            raise RunError(f"`tp_plan` {pattern!r}: style {style!r} is not one of {', '.join(STYLE_NAMES)} "
                           "(or pass a torch ParallelStyle)")
        if not (isinstance(style, (str, ParallelStyle)) or callable(style)):
            raise RunError(f"`tp_plan` {pattern!r}: a style is a name, a torch ParallelStyle or a function making "
                           f"one; got {type(style).__name__}")


class TensorParallel:
    """This rank's stages made tensor-parallel over ``mesh`` (the ``tp`` sub-mesh). Mutable: the stages."""

    def __init__(self, stages: dict, prefix: Callable[[int], str], mesh, *, plan=None, parallelize=None,
                 sizes=(), strict: bool = True):
        """``prefix(i)``: layer ``i``'s name in the original model; ``plan`` or ``parallelize`` (not both).
        ``strict``: every pattern of ``plan`` must match a module of the model (the user's own plan); else at
        least one must (a model's own plan, which may name modules some configurations do not have)."""
        self.mesh, self.group = mesh, mesh.get_group()
        self.tp = mesh.size()
        if plan is not None and parallelize is not None:
            raise RunError("give either `tp_plan` or `parallelize`, not both")
        if plan is None and parallelize is None:
            raise RunError(f"`tp` {self.tp} needs a `tp_plan` (module-name patterns to styles, like transformers' "
                           "base_model_tp_plan) or a `parallelize(stage_module, tp_mesh)` function; this model "
                           "brings neither")
        check_divides(self.tp, sizes)
        self.partial: dict[int, list[nn.Module]] = {s: [] for s in stages}  # stage -> its PARTIAL modules
        if parallelize is not None:
            if not callable(parallelize):
                raise RunError(f"`parallelize` must be a function (stage_module, tp_mesh); got "
                               f"{type(parallelize).__name__}")
            for st in stages.values():
                parallelize(st, mesh)
            return
        check_plan(plan, own=not strict)
        _check_matched(plan, [(prefix(st.first_layer + k), layer) for st in stages.values()
                              for k, layer in enumerate(st.layers)], strict)
        styles = _styles()
        for s, st in stages.items():
            for k, layer in enumerate(st.layers):
                self._apply(s, layer, prefix(st.first_layer + k), plan, styles)

    def _apply(self, s: int, layer: nn.Module, prefix: str, plan, styles) -> None:
        from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module

        mine = {}
        for path, module in layer.named_modules():
            full = f"{prefix}.{path}" if path else prefix
            style = next((st for pat, st in plan.items() if matches(pat, full)), None)
            if style is None:
                continue
            if isinstance(style, str):
                style = styles[style]()
            elif not isinstance(style, ParallelStyle):
                style = style()  # a function making the style on the rank (torch's parts import late)
            if style is None:
                continue
            if style == PARTIAL:
                self.partial[s].append(module)
                continue
            self._check_fits(full, module, style)
            mine[path] = style
        if "" in mine:  # the whole layer is one styled module
            parallelize_module(layer, self.mesh, mine.pop(""))
        if mine:
            parallelize_module(layer, self.mesh, mine)

    def _check_fits(self, name: str, module: nn.Module, style) -> None:
        """A Linear split column- or row-wise needs features that ``tp`` divides."""
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        if not isinstance(module, nn.Linear):
            return
        kind, n = (("output", module.out_features) if isinstance(style, ColwiseParallel) else
                   ("input", module.in_features) if isinstance(style, RowwiseParallel) else (None, 0))
        if kind and n % self.tp:
            raise RunError(f"`tp` {self.tp} does not divide {name}'s {n} {kind} features "
                           f"({type(style).__name__}); use a `tp` that divides {n}")

    def complete(self, s: int) -> None:
        """Stage ``s``'s backward is complete (after its last B or W): sum its partial gradients over the tp group."""
        grads = [p.grad for m in self.partial.get(s, ()) for p in m.parameters() if p.grad is not None]
        for g in grads:
            dist.all_reduce(local(g), group=self.group)


def _check_matched(plan, layers: list[tuple[str, nn.Module]], strict: bool) -> None:
    """Every pattern of ``plan`` (``strict``) or one of them matches a module of some rank's layers (a
    collective over every rank: each holds only its own layers). ``RunError`` naming the pattern."""
    names = [f"{prefix}.{path}" if path else prefix for prefix, layer in layers for path, _ in layer.named_modules()]
    mine = {pat for pat in plan if any(matches(pat, n) for n in names)}
    seen: list = [None] * dist.get_world_size()
    dist.all_gather_object(seen, (mine, names[-1] if names else ""))
    matched = set().union(*(m for m, _ in seen))
    example = next((n for _, n in seen if "." in n), "")
    hint = f" (the names end like {example!r})" if example else ""
    unmatched = [pat for pat in plan if pat not in matched]
    if strict and unmatched:
        raise RunError(f"`tp_plan` pattern {unmatched[0]!r} matches no module of the model{hint}; a pattern "
                       "matches the end of a module's original name, * for one part")
    if not matched:
        raise RunError(f"`tp_plan` matches no module of the model{hint}, so tensor parallel would shard nothing")
