"""Save and resume an ``--hf`` run: the HF folder plus each rank's optimizer state and the step.

``DIR`` is an HF folder (``from_pretrained`` loads it) with a ``stagewise-state/``
folder: ``state.json`` (the step, the world size and the schedule's placement,
which a resume must match) and ``rank<R>.pt`` (that rank's optimizer state).
A save is written to ``DIR.partial`` and renamed over ``DIR`` once every rank is
done, so an interrupted save leaves the previous one whole.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from .errors import HFError

STATE = "stagewise-state"


def save(pipe, model, opt, folder: str | Path, step: int) -> None:
    """Collective: the model as an HF folder, this rank's optimizer state, the step; atomically at ``folder``."""
    import torch
    import torch.distributed as dist

    from .pipeline import save_pretrained

    folder = Path(folder)
    part = folder.with_name(folder.name + ".partial")
    save_pretrained(pipe, model, part)
    rank = dist.get_rank()
    (part / STATE).mkdir(exist_ok=True)
    torch.save(opt.state_dict(), part / STATE / f"rank{rank}.pt")
    if rank == 0:
        meta = {"step": step, "world": dist.get_world_size(), "placement": list(pipe.schedule.placement)}
        (part / STATE / "state.json").write_text(json.dumps(meta))
    dist.barrier()
    if rank == 0:
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(part, folder)
    dist.barrier()


def read_meta(folder: str | Path) -> dict:
    """The saved step, world size and placement; ``HFError`` when ``folder`` is not a --save folder."""
    path = Path(folder) / STATE / "state.json"
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        raise HFError(f"--resume {folder}: no {STATE}/state.json; give a folder written by train --hf --save "
                      "(an HF folder alone loads with --hf FOLDER, without optimizer state)") from None


def check(folder: str | Path, world: int, placement, steps: int) -> int:
    """The step to continue from, after checking the run matches the saved one."""
    meta = read_meta(folder)
    if meta["world"] != world or meta["placement"] != list(placement):
        raise HFError(f"--resume {folder} was saved on {meta['world']} ranks with stage placement "
                      f"{meta['placement']}; resume with the same schedule, -p and --dp (or load the weights "
                      "alone with --hf FOLDER)")
    if meta["step"] >= steps:
        raise HFError(f"--resume {folder} is at step {meta['step']}; --steps {steps} must be larger (it counts "
                      "from the start)")
    return meta["step"]


def load_optimizer(opt, folder: str | Path) -> None:
    import torch
    import torch.distributed as dist

    opt.load_state_dict(torch.load(Path(folder) / STATE / f"rank{dist.get_rank()}.pt", weights_only=True))
