"""The unpipelined reference: the same layers, data and optimizer in one process, micro-batch after micro-batch.

This is the correctness oracle: every schedule's loss and gradients must equal
these. The tied weight here is one parameter used twice, as in a plain model.
The batch runs as ``microbatches`` micro-batches one after another, their
gradients accumulated, each forward seeded as a pipeline's (stages/rng.py), so
a model with dropout draws the masks every schedule draws; a batch they do not
split evenly (which no pipeline runs) runs whole. A model whose ``batch`` gives
lists of micro-batches (shapes that differ between them) runs those, each loss
weighted by its tokens as a pipeline weighs it (stages/microbatches.py).
It resumes a checkpoint of any layout and saves one that any layout resumes (the same DCP step folder and
manifest as a pipeline's, with the model's own export beside it), written with torch's own state-dict calls.
"""

from __future__ import annotations

import io
import time
import warnings
from typing import Callable

import torch
from torch import nn

from ..resilience import checkpoint_files
from ..resilience.checkpoint_manifest import FORMAT, new_run_id, run_section
from ..config import RunConfig, RunError
from ..result import RunResult
from ..stages import microbatches, pytree, rng
from ..stages.stage import Stage, logical_names
from .worker import optimizer, optimizer_class
from ...data.tensors import tokens


def run_reference(cfg: RunConfig, report: Callable | None = None) -> RunResult:
    cfg.check()
    spec = cfg.model.layers()
    layers = spec.build_all()  # one process: each tie one shared Parameter
    model = Stage(0, layers, 0)  # nn.Sequential, its layers' dropout seeded by layer (rng.py)
    m = micro_batches(cfg)
    seed = getattr(cfg.model, "seed", None)
    seed = rng.default_seed() if seed is None else seed
    names = {lg: (i, n) for i, uses in enumerate(logical_names(layers)) for n, lg in uses}
    params = list(model.parameters())
    opt = optimizer(cfg, params)
    first, info = 0, None
    if cfg.resume is not None:
        first, info = resume(cfg, spec, layers, opt)
    elif cfg.save is not None:
        checkpoint_files.preflight(cfg, optimizer_class(cfg.optimizer).__name__, cfg.model.num_layers)
    saver = Saver(cfg, spec, layers, opt, first, (info or {}).pop("run_id", None))
    losses, times, grads, counted = [], [], None, []
    for step in range(first, cfg.steps):
        inputs, targets = cfg.step_batch(step)
        counted.append(tokens(targets))
        t0 = time.perf_counter()
        loss = torch.zeros((), dtype=torch.float64)
        for mb, (x, y, scale) in enumerate(micro_parts(inputs, targets, m)):
            with rng.forward(seed, step, mb):
                part = cfg.model.loss(model(x), y) * scale  # as the executor scales it
            part.backward()
            loss += part.detach().double()
        if cfg.clip is not None:
            torch.nn.utils.clip_grad_norm_(params, cfg.clip)
        if step == 0 and "grads" in cfg.collect:
            grads = {lg: [_get(layers, i, n).grad.detach().numpy().copy()] for lg, (i, n) in names.items()}
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        if step + 1 in saver.steps:
            saver.save(step + 1)
        if report:
            report(step, losses[-1], times[-1])
    if saver.info:
        info = {**(info or {}), **saver.info}
    params_out = None
    if "params" in cfg.collect:
        params_out = {lg: [_get(layers, i, n).detach().numpy().copy()] for lg, (i, n) in names.items()}
    return RunResult(schedule="none", ranks=1, microbatches=m, losses=tuple(losses), first_step=first,
                     step_time_s=tuple(times), tokens=tuple(t for t, _ in counted),
                     token_places=tuple(n for _, n in counted),
                     measured_bubble_fraction=0.0, predicted_bubble_fraction=0.0, grads=grads, params=params_out,
                     checkpoint=info)


def micro_parts(inputs, targets, m: int) -> list[tuple]:
    """(inputs, targets, what its loss counts) of each micro-batch of a step, as a pipeline runs them: given as
    lists or cut into ``m`` equal pieces, each weighted by its tokens among the step's."""
    if microbatches.is_split(inputs):
        return list(zip(inputs, targets, microbatches.scales(targets, 1, 0)))
    return list(zip(pytree.split(inputs, m, "inputs"), pytree.split(targets, m, "targets"),
                    microbatches.batch_scales(targets, m, 1, 0)))


def micro_batches(cfg: RunConfig) -> int:
    """The micro-batches the reference runs one after another: `microbatches` where they split `batch` evenly
    (as every pipeline's do), else 1 (a pipeline refuses that batch: there is no run to match)."""
    return cfg.microbatches if cfg.batch % cfg.microbatches == 0 else 1


def resume(cfg: RunConfig, spec, layers, opt) -> tuple[int, dict]:
    """Load ``cfg.resume`` (saved under any layout) into the unpipelined model and its optimizer with torch's
    own DCP calls: the model as a module tree under its original names, ``get_state_dict`` /
    ``set_state_dict`` with the optimizer state flattened. (steps done, what it did)"""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

    from ..resilience.checkpoint import incompatible, read_into

    found = checkpoint_files.preflight(cfg, optimizer_class(cfg.optimizer).__name__, cfg.model.num_layers)
    if found.manifest["format"] != FORMAT:
        raise RunError(f"`resume` {found.folder}: a layer-keyed checkpoint of an earlier stagewise; the unpipelined "
                       "reference reads DCP checkpoints only (resume it on ranks once and save, then here)")
    params = {lg: _get(layers, i, n) for i, uses in enumerate(logical_names(layers)) for n, lg in uses}
    problem = incompatible(found.manifest, set(params), params)
    if problem:
        raise RunError(f"`resume` {found.folder}: saved from another model ({problem})")
    for name in sorted(n for n in found.manifest["files"] if checkpoint_files.is_dcp_file(n)):
        checkpoint_files.check_file(found.folder, name, found.manifest)
    tree = named_tree(spec, layers)
    options = StateDictOptions(flatten_optimizer_state_dict=True)
    model_sd, optim_sd = get_state_dict(tree, opt, options=options)
    state = {"model": model_sd, "optim": {k: v for k, v in optim_sd.items() if k.startswith("state.")}}
    read_into(found.folder, found.manifest, state, no_dist=True)  # this one process
    set_state_dict(tree, opt, model_state_dict=model_sd, optim_state_dict={**optim_sd, **state["optim"]},
                   options=options)
    step = found.manifest["step"]
    return step, {"resumed_from": str(found.folder), "resumed_step": step, "rng_restored": False,
                  "skipped": list(found.skipped), "run_id": found.manifest["run"]["id"]}


class Saver:
    """The reference's saves (after the ``steps`` a pipeline would save at), each a step folder a pipeline of any
    layout resumes (its DCP files, RNG state and manifest, as ``resilience.checkpoint.Checkpoints`` writes for
    world 1), and the model's own export beside it (``export_whole``: an HF folder). Mutable: what it saved."""

    def __init__(self, cfg: RunConfig, spec, layers, opt, first: int, run_id: str | None):
        self.cfg, self.layers, self.opt, self.tree = cfg, layers, opt, named_tree(spec, layers)
        self.run_id, self.run, self.info = run_id or new_run_id(), None, {}
        self.steps = set(checkpoint_files.saved_steps(cfg, first)) if cfg.save is not None else set()
        self.params = {lg: {"layer": int(lg.split(".", 1)[0]), "shape": list(p.shape), "dtype": str(p.dtype)}
                       for i, uses in enumerate(logical_names(layers)) for n, lg in uses
                       for p in [_get(layers, i, n)]}

    def save(self, done: int) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        from ..resilience import checkpoint_files as files
        from ..resilience.checkpoint import optimizer_name, rng_state

        t0, cfg = time.perf_counter(), self.cfg
        folder = files.step_dir(cfg.save, done)
        if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
            raise RunError(f"`save` {cfg.save}: {folder.name} is a symlink or a file; a checkpoint is never "
                           "written through a link or over a file (give another `save` folder)")
        if not self.info.get("saved"):
            removed = files.prepare_save(cfg.save, self.run_id, cfg.overwrite)
            if removed:
                self.info["removed"] = removed
        folder.mkdir(parents=True, exist_ok=True)
        files.drop_manifest(folder)
        files.clear_step(folder)
        model_sd, optim_sd = get_state_dict(self.tree, self.opt,
                                            options=StateDictOptions(flatten_optimizer_state_dict=True))
        with warnings.catch_warnings():  # one process on purpose: DCP's warning that it is one says nothing
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.save({"model": model_sd, "optim": optim_sd},
                     storage_writer=dcp.FileSystemWriter(str(folder), sync_files=True), no_dist=True)
        written = {name: files.entry(folder / name) for name in files.dcp_files(folder, 0)}
        buf = io.BytesIO()
        torch.save(rng_state(torch.device("cpu")), buf)
        written[files.rng_file(0)] = files.atomic_write(folder / files.rng_file(0), buf.getvalue())
        manifest = self._manifest(done, written, optimizer_name(self.opt))
        export = getattr(cfg.model, "export_whole", None)
        if export is not None:  # the model in its own format, from the same tensors
            export(dict(self.tree.state_dict()), folder / files.EXPORT)
            self.info.setdefault("exported", []).append(str(folder / files.EXPORT))
            manifest["export"] = files.export_listing(folder / files.EXPORT)
        files.write_manifest(folder, manifest)
        self.info.setdefault("saved", []).append(str(folder))
        self.info.setdefault("save_s", []).append(time.perf_counter() - t0)

    def _manifest(self, done: int, written: dict, optimizer: str) -> dict:
        cfg = self.cfg
        if self.run is None:
            self.run = run_section(cfg, self.run_id, self.params, optimizer)
        layout = {"schedule": "none", "ranks": 1, "replicas": 1, "microbatches": 1, "stages": 1, "grid": "none"}
        return {"format": FORMAT, "step": done, "world": 1, "layout": layout,
                "data": {"next_step": done, "batch": cfg.batch, "sequences": done * cfg.batch}, "run": self.run,
                "optimizer": optimizer, "layers": len(self.layers), "params": self.params, "files": written,
                "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def named_tree(spec, layers) -> nn.Module:
    """The layers as a module tree whose names are the original model's (``model.layers.3`` ...): its
    state_dict keys are the pipeline's, for torch's own state-dict and checkpoint functions."""
    root = nn.Module()
    for i, layer in enumerate(layers):
        *path, last = spec.prefix(i).split(".")
        parent = root
        for part in path:
            if part not in parent._modules:
                parent.add_module(part, nn.Module())
            parent = parent._modules[part]
        parent.add_module(last, layer)
    return root


def _get(layers, i: int, name: str) -> torch.Tensor:
    return layers[i].get_parameter(name)
