"""An HF causal LM on ``stagewise.Pipeline``: build this rank's part, and save the pipelined model as an HF folder.

Saving is a collective: each pipeline rank writes one safetensors shard with
the tensors it owns (``Pipeline.state_dict``: each parameter on the lowest rank
holding it; only the first data-parallel replica writes), then rank 0 writes
the index and ``config.json``. The folder is what ``from_pretrained`` loads.
"""

from __future__ import annotations

from pathlib import Path

from .model import HFModel


def pipeline(model: HFModel, schedule, *, device=None, **options):
    """``stagewise.Pipeline(schedule, model.as_layers(), model.loss, **options)`` after checking the layers fit.

    >>> model = stagewise.hf.load("models/tiny-llama")                          # doctest: +SKIP
    >>> pipe = pipeline(model, "zb-v", microbatches=4)                         # this rank's layers only
    >>> pipe.step(ids, ids)                                                   # labels = ids, as in HF
    """
    from ..runtime.pipeline import Pipeline, _device, _process_group
    from ..runtime.run.resolve import resolve_schedule

    _, world = _process_group(options.get("timeout", 30.0))  # the group exists (torchrun: made here)
    sched = resolve_schedule(schedule, world=world, dp=options.get("dp", 1),
                             microbatches=options.pop("microbatches", None), chunks=options.pop("chunks", None))
    model.check_fit(sched.stages_per_copy, options.get("split"))
    device = _device(device)  # layers are materialized right there (a GPU under NCCL), not moved
    return Pipeline(sched, model.as_layers(device), model.loss, device=device, **options)


def save_pretrained(pipe, model: HFModel, folder: str | Path) -> Path:
    """Write the pipelined model as an HF folder (collective: every rank calls it); returns the folder."""
    import torch.distributed as dist

    from .weights import save_shard, write_index

    folder = Path(folder)
    mine = {name: t for name, t in pipe.state_dict().items() if model.source(name) == name}
    n = pipe.topo.p
    if dist.get_rank() == 0:  # an earlier save's shards must not join this one's index
        for old in [*folder.glob("model-*-of-*.safetensors"), folder / "model.safetensors.index.json"]:
            old.unlink(missing_ok=True)
    dist.barrier()
    if pipe.topo.replica == 0 and mine:
        save_shard(folder, pipe.topo.pipe, n, mine)
    dist.barrier()  # every shard is on disk before the index reads their headers
    if dist.get_rank() == 0:
        write_index(folder, n, model.config)
    dist.barrier()
    return folder
