"""``Pipeline``'s torch-typed arguments checked before any rank starts: ``device`` and ``autocast``.

torch's own words for a bad device ("Expected one of cpu, cuda, ... device type at start of device string")
or a bad dtype name no argument of ours; these name the argument, the value and the rule.
"""

from __future__ import annotations

import torch

from .config import RunError, check_count

#: the dtypes ``torch.autocast`` runs forwards in
AUTOCAST_DTYPES = (torch.bfloat16, torch.float16)


def check_device(device) -> None:
    """``device``: None (the rank's GPU under NCCL, else the CPU), or a device this machine has.

    ``check_device("cpu")`` passes; ``check_device("bogus")`` raises "`device` 'bogus': not a device torch
    knows; give one such as 'cpu' or 'cuda:0'".
    """
    if device is None:
        return
    if not isinstance(device, (str, torch.device)):
        raise RunError(f"`device` must be a torch.device or its name such as 'cpu' or 'cuda:0'; got "
                       f"{type(device).__name__} {device!r}")
    try:
        d = torch.device(device)
    except (RuntimeError, ValueError):
        raise RunError(f"`device` {device!r}: not a device torch knows; give one such as 'cpu' or 'cuda:0'") from None
    if d.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if d.index is not None and d.index >= count or count == 0:
            raise RunError(f"`device` {str(device)!r}: this machine has {count} CUDA device{'' if count == 1 else 's'}"
                           f"{f' (0..{count - 1})' if count else ''}; give one it has, or leave `device` out")


def check_autocast(autocast) -> None:
    """``autocast``: None, or the dtype forwards run in under ``torch.autocast`` (bfloat16 or float16)."""
    if autocast is None:
        return
    if autocast not in AUTOCAST_DTYPES:
        raise RunError(f"`autocast` must be None or one of torch.bfloat16, torch.float16; got "
                       f"{type(autocast).__name__} {autocast!r}")


MAX_SEED = (1 << 32) - 1  #: torch.manual_seed's range


def check_seed(seed) -> None:
    """A seed torch takes: a whole number 0..MAX_SEED (``RunError`` naming `seed` otherwise)."""
    check_count("`seed`", seed, 0)
    if seed > MAX_SEED:
        raise RunError(f"`seed` {seed}: torch seeds are 0..{MAX_SEED}")
