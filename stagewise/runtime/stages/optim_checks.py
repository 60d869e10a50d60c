"""The checks of an optimizer and of an optimizer state against this rank's parameters, before either is trusted.

``Pipeline.optimizer_state_dict(optimizer)`` needs an optimizer over this rank's parameters (one over none of
them, or over a tensor the pipeline does not hold, would save nothing or lose state silently), and
``Pipeline.load_optimizer_state_dict(optimizer, state)`` a state in ``optimizer_state_dict``'s form: keys
``state.NAME.KEY`` / ``param_groups.NAME.KEY`` naming the model's parameters, and for each parameter this
optimizer keeps, every state entry it keeps, each a tensor of the shape it has here. Errors are ``RunError``
naming the argument, the key and the rule.

Example::

    >>> check_state({"state": 5}, {"w": {"exp_avg": torch.zeros(2)}}, {"w"}, "AdamW")
    Traceback (most recent call last):
    stagewise.runtime.config.RunError: `state` key 'state' is not state.NAME.KEY or param_groups.NAME.KEY ...
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..config import RunError


def check_optimizer(optimizer, here: list[torch.Tensor]) -> None:
    """``optimizer`` (its param groups) holds some of the parameters ``here`` and nothing else."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise RunError(f"`optimizer` must be a torch.optim.Optimizer over this rank's parameters; got "
                       f"{type(optimizer).__name__}")
    ids = {id(p) for p in here}
    held = [p for g in optimizer.param_groups for p in g["params"]]
    stray = next((p for p in held if id(p) not in ids), None)
    if stray is not None:
        raise RunError(f"`optimizer` holds a tensor of shape {tuple(stray.shape)} that is not one of this pipeline "
                       "rank's parameters (its state would not be saved); build it over pipe.parameters()")
    if not held:
        raise RunError("`optimizer` holds none of this pipeline rank's parameters; build it over pipe.parameters()")


def check_state(state, expected: dict[str, dict], names: set[str], optimizer: str) -> None:
    """``state`` (``optimizer_state_dict``'s form) fits: every key names one of the model's parameters
    (``names``, original names), and each parameter of ``expected`` (original name -> the state the optimizer
    keeps for it here, key -> value) has all of it, each tensor of its shape."""
    if not isinstance(state, Mapping):
        raise RunError(f"`state` must be a dict in optimizer_state_dict's form (state.NAME.KEY: tensor); got "
                       f"{type(state).__name__}")
    saved: dict[str, dict] = {}
    for key, value in state.items():
        kind, name, part = _split(key, names)
        if kind == "state":
            saved.setdefault(name, {})[part] = value
    for name, keeps in sorted(expected.items()):
        got = saved.get(name, {})
        if not got:
            if saved or not state:
                raise RunError(f"`state` holds no optimizer state of parameter {name} (this rank's {optimizer} "
                               f"keeps {', '.join(sorted(keeps))} for it)")
            continue
        for part in sorted(set(got) - set(keeps)):
            raise RunError(f"`state` key 'state.{name}.{part}': {optimizer} keeps no {part} (it keeps "
                           f"{', '.join(sorted(keeps))})")
        for part, target in sorted(keeps.items()):
            if part not in got:
                raise RunError(f"`state` has no 'state.{name}.{part}' ({optimizer} keeps it for every parameter)")
            _check_value(f"state.{name}.{part}", got[part], target)


def _split(key, names: set[str]) -> tuple[str, str, str]:
    """(``state`` or ``param_groups``, parameter name, entry) of a key, or ``RunError``."""
    if isinstance(key, str):
        for kind in ("state", "param_groups"):
            if key.startswith(kind + "."):
                name, _, part = key[len(kind) + 1:].rpartition(".")
                if name in names and part:
                    return kind, name, part
                raise RunError(f"`state` key {key!r} names no parameter of the model (NAME in {kind}.NAME.KEY is "
                               "an original parameter name, as optimizer_state_dict writes it)")
    raise RunError(f"`state` key {str(key)[:80]!r} is not state.NAME.KEY or param_groups.NAME.KEY "
                   "(optimizer_state_dict's form)")


def _check_value(key: str, value, target) -> None:
    if not isinstance(target, torch.Tensor):
        return
    if isinstance(value, torch.Tensor):
        if tuple(value.shape) != tuple(target.shape):
            raise RunError(f"`state` {key!r} has shape {tuple(value.shape)}; the optimizer's is "
                           f"{tuple(target.shape)} (a state of another model or parameter)")
        return
    if target.dim() == 0 and isinstance(value, (int, float)) and not isinstance(value, bool):
        return
    raise RunError(f"`state` {key!r} is {type(value).__name__}; the optimizer keeps a tensor of shape "
                   f"{tuple(target.shape)} there")
