"""Save and restore training state keyed by model layer, so any schedule or number of ranks can resume it.

What a checkpoint holds (folder format in ``checkpoint_files``): per model
layer, the value and optimizer state of each logical parameter whose first
use is in that layer (``stage.logical_names``: a tied head weight is stored
once, with the embedding), written by one rank only: the lowest pipeline rank
holding the layer, in data-parallel replica 0 (copies of a parameter are equal
on every rank that holds one, so any copy is the value). Per rank, its RNG
states (torch, CUDA, Python, NumPy). Per checkpoint, the step (the data
position: step ``k``'s batch is a function of ``k``), the layout it was
saved under, and the run it belongs to (``checkpoint_manifest``: model, seed,
data, a run id that every resume of the run keeps).

Resuming loads every local copy of each logical parameter from its layer's
file and hands the optimizer its state per parameter through
``load_state_dict`` (so AdamW's moments move with their parameter onto any
rank, device and dtype). RNG states are restored when the layout is the one
saved (same schedule, ranks, replicas): then the resumed run's losses are the
uninterrupted run's, bit for bit. Under another layout the work per rank is
different anyway, and the run says the RNG was not restored.
"""

from __future__ import annotations

import io
import random
import sys
import time

import torch
import torch.distributed as dist

from . import checkpoint_files as files
from . import checkpoint_manifest as manifests
from . import flight
from ..run.config import RunError


class Checkpoints:
    """One rank's saves and its resume. Mutable: what it saved so far (reported in the result)."""

    def __init__(self, *, cfg, pipe, optimizer, rank: int, world: int, device, recorder=flight.NO_FLIGHT,
                 export=None):
        """``pipe``: this rank's Pipeline (its stage map, stages and place among the ranks); ``export(pipe,
        folder)``: also write the model in its own format into each step folder (the HF adapter's
        ``save_pretrained``), a collective run before the manifest, so a step folder is complete only with it."""
        schedule, stage_map, stages, topo = pipe.schedule, pipe.stage_map, pipe.stages, pipe.topo
        pipe_rank, replica, replicas = topo.pipe, topo.replica, world // schedule.ranks
        self.cfg, self.schedule, self.stage_map, self.optimizer = cfg, schedule, stage_map, optimizer
        self.rank, self.world, self.device, self.recorder = rank, world, device, recorder
        self.pipe, self.export = pipe, export
        self.local: dict[str, list[torch.Tensor]] = {}  # logical name -> this rank's copies
        for name, holders in stage_map.params.items():
            copies = [stages[h.stage].param(h) for h in holders if h.stage in stages]
            if copies:
                self.local[name] = copies
        place = schedule.placement
        writer = {}  # layer -> lowest pipeline rank holding it
        for s, rg in enumerate(stage_map.ranges):
            for layer in rg:
                writer[layer] = min(writer.get(layer, place[s]), place[s])
        self.writes = sorted(i for i, r in writer.items() if r == pipe_rank and replica == 0)
        self.layout_key = {"schedule": schedule.name, "ranks": schedule.ranks, "replicas": replicas,
                           "microbatches": schedule.microbatches, "stages": schedule.stages}
        self.info: dict = {}
        self.run_id = manifests.new_run_id()  # a resume takes its checkpoint's (restore)
        self.prepared = False  # rank 0 checks and tidies the --save folder before the first save
        self.run: dict | None = None  # the manifest's run section (rank 0, from the first save on)

    # ---- resume

    def restore(self) -> int:
        """Load ``cfg.resume`` into the local copies and the optimizer; the number of steps already done."""
        found = files.find(self.cfg.resume)
        folder, m = found.folder, found.manifest
        self._check_compatible(folder, m)
        self.run_id = m["run"]["id"]
        payloads: dict[int, dict] = {}
        for name, copies in self.local.items():
            layer = home_layer(name)
            if layer not in payloads:
                payloads[layer] = _payload(folder, layer, files.read_verified(folder, files.layer_file(layer), m))
            if name not in payloads[layer]["params"]:
                held = ", ".join(sorted(payloads[layer]["params"])[:2]) or "nothing"
                raise RunError(f"`resume` {folder}: {files.layer_file(layer)} does not hold {name} (it holds {held}): "
                               "the layer files were swapped or edited; resume from another checkpoint")
            value = payloads[layer]["params"][name]
            if tuple(value.shape) != tuple(copies[0].shape):
                raise RunError(f"`resume` {folder}: parameter {name} has shape {tuple(value.shape)} there and "
                               f"{tuple(copies[0].shape)} in this model")
            with torch.no_grad():
                for p in copies:
                    p.copy_(value)
        self._load_optimizer({n: payloads[home_layer(n)]["optim"].get(n) for n in self.local})
        rng = m["layout"] == self.layout_key and self.world == m["world"]
        if rng:
            data = files.read_verified(folder, files.rng_file(self.rank), m)
            set_rng_state(torch.load(io.BytesIO(data), weights_only=True), self.device)
        self.info.update(resumed_from=str(folder), resumed_step=m["step"], rng_restored=rng,
                         skipped=list(found.skipped))
        return m["step"]

    def _check_compatible(self, folder, m: dict) -> None:
        theirs, ours = set(m["params"]), set(self.stage_map.params)
        if theirs != ours:
            odd = sorted(ours - theirs) or sorted(theirs - ours)
            side = "this model has" if ours - theirs else "the checkpoint has"
            raise RunError(f"`resume` {folder}: saved from another model ({side} parameter {odd[0]}, the other "
                           f"does not; {len(theirs)} parameters there, {len(ours)} here)")
        # the optimizer and the layer count were checked by checkpoint_files.preflight

    def _load_optimizer(self, state_by_name: dict) -> None:
        """Each local parameter gets its logical parameter's state (a private copy per copy)."""
        logical = {id(p): n for n, copies in self.local.items() for p in copies}
        sd = self.optimizer.state_dict()
        state, i = {}, 0
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                saved = state_by_name.get(logical.get(id(p)))
                if saved:
                    state[i] = {k: v.clone() if torch.is_tensor(v) else v for k, v in saved.items()}
                i += 1
        sd["state"] = state
        self.optimizer.load_state_dict(sd)

    # ---- save

    def due(self, done: int) -> bool:
        """Save after ``done`` steps? Every --save-every steps and at the end."""
        cfg = self.cfg
        return cfg.save is not None and (done == cfg.steps or bool(cfg.save_every) and done % cfg.save_every == 0)

    def save(self, done: int) -> None:
        """Every rank writes its layers and RNG state; rank 0 writes the manifest last."""
        t0 = time.perf_counter()
        folder = files.step_dir(self.cfg.save, done)
        if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
            raise RunError(f"`save` {self.cfg.save}: {folder.name} is a symlink or a file; a checkpoint is never "
                           "written through a link or over a file (give another `save` folder)")
        self.recorder.event(flight.SAVE, str(folder))
        if self.rank == 0:
            if not self.prepared:
                removed = files.prepare_save(self.cfg.save, self.run_id, getattr(self.cfg, "overwrite", False))
                if removed:
                    self.info["removed"] = removed
                self.prepared = True
            folder.mkdir(parents=True, exist_ok=True)
            files.drop_manifest(folder)  # an older save of this step is incomplete from now on
        dist.barrier()
        written, params = {}, {}
        for layer in self.writes:
            payload = {"params": {}, "optim": {}}
            for name in self.local:
                if home_layer(name) == layer:
                    p = self.local[name][0]
                    payload["params"][name] = p.detach().cpu()
                    payload["optim"][name] = {k: v.detach().cpu() if torch.is_tensor(v) else v
                                              for k, v in self.optimizer.state.get(p, {}).items()}
                    params[name] = {"layer": layer, "shape": list(p.shape), "dtype": str(p.dtype)}
            written[files.layer_file(layer)] = files.atomic_write(folder / files.layer_file(layer), _bytes(payload))
        written[files.rng_file(self.rank)] = files.atomic_write(folder / files.rng_file(self.rank),
                                                                _bytes(rng_state(self.device)))
        if self.export is not None:
            self.export(self.pipe, folder / files.EXPORT)
        parts = [None] * self.world if self.rank == 0 else None
        dist.gather_object((written, params), parts, dst=0)
        if self.rank == 0:
            files.write_manifest(folder, self._manifest(done, parts))
        self.recorder.event(flight.SAVED, str(folder))
        self.info.setdefault("saved", []).append(str(folder))
        self.info.setdefault("save_s", []).append(time.perf_counter() - t0)

    def _manifest(self, done: int, parts: list) -> dict:
        all_files, all_params = {}, {}
        for written, params in parts:
            all_files.update(written)
            all_params.update(params)
        cfg, optimizer = self.cfg, type(self.optimizer).__name__
        return {"format": manifests.FORMAT, "step": done, "world": self.world, "layout": self.layout_key,
                "data": {"next_step": done, "batch": cfg.batch, "sequences": done * cfg.batch},
                "run": self._run_section(all_params, optimizer),
                "optimizer": optimizer,
                "layers": len({i for rg in self.stage_map.ranges for i in rg}),
                "params": all_params, "files": all_files, "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}

    def _run_section(self, params: dict, optimizer: str) -> dict:
        """The manifest's ``run``, made at the first save (it hashes a --data file) and kept."""
        if self.run is None:
            self.run = manifests.run_section(self.cfg, self.run_id, params, optimizer)
        return self.run


def _payload(folder, layer: int, data: bytes) -> dict:
    """A layer file's contents: {"params": {name: tensor}, "optim": {name: state}}, or ``RunError`` naming the
    file (its bytes match the manifest but are not one of our layer files)."""
    name = files.layer_file(layer)
    try:
        payload = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means the file is not ours
        raise RunError(f"`resume` {folder}: {name} is not a layer file of a checkpoint ({type(e).__name__}); "
                       "resume from another checkpoint") from None
    if not (isinstance(payload, dict) and isinstance(payload.get("params"), dict)
            and isinstance(payload.get("optim"), dict)):
        raise RunError(f"`resume` {folder}: {name} is not a layer file of a checkpoint (no params and optim "
                       "state); resume from another checkpoint")
    return payload


def home_layer(logical: str) -> int:
    """The layer whose file holds a logical parameter: its first use (``stage.logical_names``: "3.fc.weight")."""
    return int(logical.split(".", 1)[0])


def rng_state(device) -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    if "numpy" in sys.modules:  # only a run that imported NumPy can have drawn from it
        name, keys, pos, has_gauss, cached = sys.modules["numpy"].random.get_state()
        state["numpy"] = (name, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss), float(cached))
    return state


def set_rng_state(state: dict, device) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(_tuples(state["python"]))
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)
    if "numpy" in state:
        import numpy as np

        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))


def _tuples(x):
    """random.setstate needs tuples where a save may have produced lists."""
    return tuple(_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x


def _bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()
