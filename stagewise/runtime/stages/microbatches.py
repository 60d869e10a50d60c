"""A step's micro-batches given already split: a ``list`` of m pytrees, whose shapes may differ (variable
sequence lengths, rows), as torch's pipelining takes ``arg_mbs`` / ``target_mbs``.

``check`` refuses what no schedule can run, in one line naming the argument and the rule (the wrong number
of micro-batches, a leaf missing or extra in one, a dtype that differs, a micro-batch the data shards cannot
split, inputs a list but targets one batch); ``varies``: whether the micro-batches' shapes differ (then
every message between stages carries its own header); ``shard``: one data shard's rows of each;
``scales`` / ``batch_scales``: each micro-batch's token count, by which its loss counts in the step's (the number of target
elements that are not the ignore index -100 for integer targets, else its rows), so the step's loss is the
mean over its tokens whatever the split, and equal micro-batches count equally (the mean of their means).
A ``tuple`` or any other pytree stays one batch, cut into equal micro-batches (``pytree.split``).
"""

from __future__ import annotations

import torch

from ..config import RunError
from . import pytree

IGNORE_INDEX = -100  #: a target element that counts no token (torch's cross-entropy default)


def is_split(tree) -> bool:
    """``tree`` is a step's micro-batches (a list), not one batch."""
    return type(tree) is list


def check(inputs, targets, microbatches: int, shards: int = 1) -> bool:
    """Whether the step's batch comes as micro-batches; raise ``RunError`` where they cannot run (see the
    module docstring). ``shards``: the data shards each micro-batch is cut into along dimension 0."""
    given = [(what, tree) for what, tree in (("inputs", inputs), ("targets", targets)) if tree is not None]
    split = [what for what, tree in given if is_split(tree)]
    if split and len(split) < len(given):
        other = next(w for w, _ in given if w not in split)
        raise RunError(f"`{split[0]}` is a list of micro-batches but `{other}` is one batch "
                       f"({type(dict(given)[other]).__name__}); pass both as lists of {microbatches} micro-batches "
                       "or both as one batch (a tuple or dict stays one batch)")
    for what in split:
        _check_list(dict(given)[what], what, microbatches, shards)
    return bool(split)


def _check_list(mbs: list, what: str, microbatches: int, shards: int) -> None:
    if len(mbs) != microbatches:
        raise RunError(f"`{what}` has {len(mbs)} micro-batches; the schedule runs {microbatches} (`microbatches`): "
                       f"pass a list of {microbatches}")
    leaves0, spec0 = pytree.flatten(mbs[0])
    names0 = pytree.paths(spec0)
    for i, mb in enumerate(mbs):
        leaves, spec = pytree.flatten(mb)
        names = pytree.paths(spec)
        if spec != spec0:
            missing = [n or "(the tensor)" for n in names0 if n not in names]
            extra = [n or "(the tensor)" for n in names if n not in names0]
            diff = (f"lacks {', '.join(missing)}" if missing else "") + ("; " if missing and extra else "") + \
                (f"has {', '.join(extra)} besides" if extra else "")
            raise RunError(f"`{what}[{i}]` {diff or 'is ' + pytree.describe(spec)} where micro-batch 0 has "
                           f"{pytree.describe(spec0)} ({', '.join(n or '(the tensor)' for n in names0)}); every "
                           "micro-batch has the same leaves")
        for name, x, x0 in zip(names, leaves, leaves0):
            if not isinstance(x, torch.Tensor):
                continue
            if not isinstance(x0, torch.Tensor) or x.dtype != x0.dtype:
                had = x0.dtype if isinstance(x0, torch.Tensor) else type(x0).__name__
                raise RunError(f"`{what}[{i}]{name}` is {x.dtype} where micro-batch 0's is {had}; a leaf has one "
                               "dtype in every micro-batch")
            rows = x.shape[0] if x.dim() else 0
            if rows == 0 or rows % shards:
                raise RunError(f"`{what}[{i}]{name}` has {rows} rows (dimension 0 of shape {tuple(x.shape)}); each "
                               f"micro-batch needs rows that split into {shards} equal data shards (at least one "
                               "each)")


def varies(mbs: list | None) -> bool:
    """Some tensor leaf's shape differs between the micro-batches."""
    if not is_split(mbs) or not mbs:
        return False
    shapes = [tuple(tuple(t.shape) for t in pytree.tensors(mb)) for mb in mbs]
    return any(s != shapes[0] for s in shapes)


def shard(mbs: list, shards: int, index: int, what: str) -> list:
    """Data shard ``index``'s rows of each micro-batch (all of them with one shard)."""
    return mbs if shards == 1 else [pytree.split(mb, shards, what)[index] for mb in mbs]


def weights(pieces: list) -> list[float]:
    """The tokens each piece's targets count: the elements of its first tensor leaf that are not
    ``IGNORE_INDEX`` when integer, else its rows (1 for a scalar); read off the device once for them all (a
    count per piece on a GPU would make the host wait once per micro-batch and data shard)."""
    counts = [_count(p) for p in pieces]
    on_device = [c for c in counts if isinstance(c, torch.Tensor)]
    if on_device:
        got = iter(torch.stack([c.to(on_device[0].device) for c in on_device]).tolist())
        counts = [next(got) if isinstance(c, torch.Tensor) else c for c in counts]
    return [float(c) for c in counts]


def _count(targets):
    """A piece's tokens: a number, or a 0-d tensor where its targets are (counted there)."""
    leaves = pytree.tensors(targets)
    if not leaves:
        return 1.0
    t = leaves[0]
    if not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool):
        return (t != IGNORE_INDEX).sum()
    return float(t.shape[0]) if t.dim() else 1.0


def shares(weights: list[list[float]], index: int) -> list[float]:
    """What each of data shard ``index``'s pieces counts in the step's loss, from every shard's pieces' token
    ``weights``: its tokens over the step's, times the shards (the pipeline divides every loss by them). No
    token anywhere: each piece of the shard alike. Pieces with equal tokens each count 1/pieces exactly."""
    shards, total = len(weights), sum(map(sum, weights))
    mine = weights[index]
    if total <= 0:
        return [1.0 / len(mine)] * len(mine)
    return [shards * w / total for w in mine]


def batch_scales(targets, microbatches: int, shards: int, index: int) -> list[float]:
    """``scales`` of one batch that the pipeline cuts into ``shards`` data shards, then each into
    ``microbatches`` equal pieces: each piece counts by its tokens among the whole step's, so the step's loss is
    the mean over its tokens however the batch was cut (padding, -100, counts nothing). Pieces with equal
    tokens each count 1/microbatches exactly: today's mean of micro-batch means."""
    parts = pytree.split(targets, shards, "targets") if shards > 1 else [targets]
    return shares(by_shard([pytree.split(part, microbatches, "targets") for part in parts]), index)


def scales(targets: list, shards: int, index: int) -> list[float]:
    """What each of data shard ``index``'s micro-batch losses counts in the step's (each a mean over its own
    tokens): its tokens over the step's, times ``shards`` (the pipeline divides every loss by the shards)."""
    return shares(by_shard([shard(targets, shards, d, "targets") for d in range(shards)]), index)


def by_shard(pieces: list[list]) -> list[list[float]]:
    """Each data shard's pieces' ``weights``, read off the device once for the step."""
    flat = weights([p for ps in pieces for p in ps])
    out, at = [], 0
    for ps in pieces:
        out.append(flat[at:at + len(ps)])
        at += len(ps)
    return out
