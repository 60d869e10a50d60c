"""An HF causal LM on ``stagewise.Pipeline``: build this rank's part, and save the pipelined model as an HF folder.

Saving is a collective: each pipeline rank writes one safetensors shard with
the tensors it owns (each parameter on the lowest rank holding it, sharded ones
gathered whole first; only the first rank of the data-parallel and
tensor-parallel groups writes), then rank 0 writes the index and
``config.json``. The folder is what ``from_pretrained`` loads, from any layout.
"""

from __future__ import annotations

from pathlib import Path

from .model import HFModel


def pipeline(model: HFModel, schedule, *, device=None, **options):
    """``stagewise.Pipeline(schedule, model.as_layers(), model.loss, **options)`` after checking the layers fit.

    A schedule with sequence slices takes ``model.shifted_loss``: its targets are ``model.shift_labels(ids)``
    (each slice's labels then hold the token after it, which a shift inside the slice would lose).

    >>> model = stagewise.hf.load("models/tiny-llama")                          # doctest: +SKIP
    >>> pipe = pipeline(model, "zb-v", microbatches=4)                         # this rank's layers only
    >>> pipe.step(ids, ids)                                                   # labels = ids, as in HF
    """
    from ..runtime.pipeline import Pipeline, _device, _process_group
    from ..runtime.resolve import resolve_schedule

    rank, world = _process_group(options.get("timeout", 30.0))  # the group exists (torchrun: made here)
    if options.get("mesh") is not None:
        from ..runtime.parallel.mesh import Topology

        others = world // Topology.of_mesh(options["mesh"], world, rank).p
    elif options.get("parallelism") is not None:
        others = options["parallelism"].per_pipeline_rank
    else:
        others = options.get("dp", 1) * options.get("fsdp", 1) * options.get("tp", 1) * options.get("ep", 1)
    sched = resolve_schedule(schedule, world=world, dp=others,
                             microbatches=options.pop("microbatches", None), chunks=options.pop("chunks", None))
    model.check_fit(sched.stages_per_copy, options.get("split"))
    device = _device(device)  # layers are materialized right there (a GPU under NCCL), not moved
    loss = model.shifted_loss if sched.slices > 1 else model.loss
    return Pipeline(sched, model.as_layers(device), loss, device=device, **options)


def save_pretrained(pipe, model: HFModel, folder: str | Path) -> Path:
    """Write the pipelined model as an HF folder (collective: every rank calls it); returns the folder."""
    import torch.distributed as dist

    from .weights import save_shard, write_index

    from ..runtime.pipeline import gather_full

    folder = Path(folder)
    # whole tensors: a sharded parameter (FSDP, tensor parallel) is gathered by the ranks sharing it
    owned = gather_full(pipe.names.owned_state_dict())
    mine = {name: t for name, t in owned.items() if model.source(name) == name}
    n = pipe.topo.p
    if dist.get_rank() == 0:
        _clear_shards(folder)
    dist.barrier()
    writes = all(pipe.topo.coords.get(d, 0) == 0 for d in ("dp", "fsdp", "tp"))  # one rank per pipeline rank
    if writes and mine:
        save_shard(folder, pipe.topo.pipe, n, mine)
    dist.barrier()  # every shard is on disk before the index reads their headers
    if dist.get_rank() == 0:
        write_index(folder, n, model.config)
    dist.barrier()
    return folder


def save_whole(model: HFModel, state: dict, folder: str | Path) -> Path:
    """Write one process's whole model (HF names -> tensors: the unpipelined reference's) as an HF folder, the
    same files ``save_pretrained`` writes for one pipeline rank; returns the folder."""
    from .weights import save_shard, write_index

    folder = Path(folder)
    _clear_shards(folder)
    save_shard(folder, 0, 1, {name: t for name, t in state.items() if model.source(name) == name})
    write_index(folder, 1, model.config)
    return folder


def _clear_shards(folder: Path) -> None:
    """An earlier save's shards must not join this one's index."""
    for old in [*folder.glob("model-*-of-*.safetensors"), folder / "model.safetensors.index.json"]:
        old.unlink(missing_ok=True)
