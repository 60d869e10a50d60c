"""Save and restore training state with torch.distributed.checkpoint (DCP), so any layout can resume it.

A step folder is one DCP checkpoint of ``{"model": pipe.state_dict(), "optim": pipe.optimizer_state_dict(opt)}``
(original parameter names; sharded parameters and their optimizer state as DTensors; the optimizer state
flattened as ``state.NAME.exp_avg``, DCP's ``get_state_dict`` form), written in parallel by every rank
(``__R_K.distcp`` per rank, ``.metadata`` by rank 0), plus each rank's RNG states and our manifest, written
last (``checkpoint_files``, ``checkpoint_manifest``: sizes, hashes, the run it belongs to). Copies of a
parameter (data-parallel replicas, tied or duplicated ones) are the same key: DCP writes it once.

Resuming under any p, v, schedule, dp, fsdp or tp is DCP's resharding: every rank asks for the keys of the
parameters it holds, each shard at its own place, and reads them into its tensors in place. A ZeRO-1
optimizer asks for its own partition's. The run's own learning rate and settings stay (the saved param
groups are not loaded). RNG states are restored when the layout is the one saved (same schedule, ranks and
grid): then the resumed run's losses are the uninterrupted run's, bit for bit. A layer-keyed checkpoint of an
earlier stagewise (``stagewise-checkpoint/2``) still loads (``checkpoint_layers``). The same folder is what a
user's own DCP code reads (``dcp.load({"model": model.state_dict()}, checkpoint_id=folder)`` into the plain
model, or a ``Pipeline`` of any layout).
"""

from __future__ import annotations

import io
import random
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from . import checkpoint_files as files
from . import checkpoint_index as index
from . import checkpoint_layers
from . import checkpoint_manifest as manifests
from . import flight
from ..config import RunError


class Checkpoints:
    """One rank's saves and its resume. Mutable: what it saved so far (reported in the result)."""

    def __init__(self, *, cfg, pipe, optimizer, rank: int, world: int, device, recorder=flight.NO_FLIGHT,
                 export=None):
        """``pipe``: this rank's Pipeline (its names, stages and place among the ranks); ``export(pipe, folder)``:
        also write the model in its own format into each step folder (the HF adapter's ``save_pretrained``), a
        collective run before the manifest, so a step folder is complete only with it."""
        schedule, topo = pipe.schedule, pipe.topo
        self.cfg, self.schedule, self.stage_map, self.optimizer = cfg, schedule, pipe.stage_map, optimizer
        self.rank, self.world, self.device, self.recorder = rank, world, device, recorder
        self.pipe, self.export = pipe, export
        self.layout_key = {"schedule": schedule.name, "ranks": schedule.ranks, "replicas": world // schedule.ranks,
                           "microbatches": schedule.microbatches, "stages": schedule.stages, "grid": topo.describe()}
        self.info: dict = {}
        self.run_id = manifests.new_run_id()  # a resume takes its checkpoint's (restore)
        self.prepared = False  # rank 0 checks and tidies the --save folder before the first save
        self.run: dict | None = None  # the manifest's run section (rank 0, from the first save on)

    # ---- resume

    def restore(self) -> int:
        """Load ``cfg.resume`` into this rank's parameters and optimizer; the number of steps already done."""
        started, t0 = time.time(), time.perf_counter()
        found = files.find(self.cfg.resume)
        folder, m = found.folder, found.manifest
        self._check_compatible(folder, m)
        self.run_id = m["run"]["id"]
        reshard = 0.0  # DCP's read of the shards into this layout; the rest is the load (manifest, hashes, RNG)
        if m["format"] == manifests.LAYERS_FORMAT:
            checkpoint_layers.restore(folder, m, self.pipe, self.optimizer)
        else:
            self._verify_share(folder, m)
            t1 = time.perf_counter()
            load(folder, m, self.pipe, self.optimizer)
            reshard = time.perf_counter() - t1
        rng = m["layout"] == self.layout_key and self.world == m["world"]
        if rng:
            restore_rng(folder, files.rng_file(self.rank), files.read_verified(folder, files.rng_file(self.rank), m),
                        self.device)
        self.info.update(resumed_from=str(folder), resumed_step=m["step"], rng_restored=rng,
                         skipped=list(found.skipped), restore_started_at=started,
                         restore_s={"load": time.perf_counter() - t0 - reshard, "reshard": reshard})
        return m["step"]

    def _check_compatible(self, folder, m: dict) -> None:
        """The manifest's parameters are this model's (``incompatible``); every rank checks the shapes of its own
        and all refuse with the first problem (a collective)."""
        here = {name: self.pipe.names.local(holders) for name, holders in self.stage_map.params.items()}
        first = _first_of_every_rank(incompatible(m, set(self.stage_map.params),
                                                  {name: local[0] for name, local in here.items() if local}))
        if first:
            raise RunError(f"`resume` {folder}: saved from another model ({first})")
        # the optimizer and the layer count were checked by checkpoint_files.preflight

    def _verify_share(self, folder, m: dict) -> None:
        """Every DCP file's size and SHA-256 against the manifest before any is read: each rank hashes a share
        of them (every world-th), and every rank stops with the first problem found (a collective)."""
        names = sorted(n for n in m["files"] if files.is_dcp_file(n))
        problem = None
        for name in names[self.rank::self.world]:
            try:
                files.check_file(folder, name, m)
            except RunError as e:
                problem = str(e)
                break
        first = _first_of_every_rank(problem)
        if first:
            raise RunError(first)

    # ---- save

    def due(self, done: int) -> bool:
        """Save after ``done`` steps? Every --save-every steps and at the end."""
        cfg = self.cfg
        return cfg.save is not None and (done == cfg.steps or bool(cfg.save_every) and done % cfg.save_every == 0)

    def save(self, done: int) -> None:
        """Every rank writes its share (DCP) and RNG state; rank 0 writes the manifest last."""
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
            files.clear_step(folder)  # and its files go (another layout writes other ones)
        dist.barrier()
        write(folder, self.pipe, self.optimizer)
        written = {name: files.entry(folder / name) for name in files.dcp_files(folder, self.rank)}
        written[files.rng_file(self.rank)] = files.atomic_write(folder / files.rng_file(self.rank),
                                                                _bytes(rng_state(self.device)))
        if self.export is not None:
            self.export(self.pipe, folder / files.EXPORT)
            self.info.setdefault("exported", []).append(str(folder / files.EXPORT))
        parts = [None] * self.world if self.rank == 0 else None
        dist.gather_object((written, self._params()), parts, dst=0)
        if self.rank == 0:
            manifest = self._manifest(done, parts)
            if self.export is not None:  # what --overwrite may delete of it later
                manifest["export"] = files.export_listing(folder / files.EXPORT)
            files.write_manifest(folder, manifest)
        self.recorder.event(flight.SAVED, str(folder))
        self.info.setdefault("saved", []).append(str(folder))
        self.info.setdefault("save_s", []).append(time.perf_counter() - t0)

    def _params(self) -> dict:
        """logical name -> its home layer, whole shape and dtype, for the parameters held here."""
        out = {}
        for name, holders in self.stage_map.params.items():
            local = self.pipe.names.local(holders)
            if local:
                p = local[0]
                out[name] = {"layer": checkpoint_layers.home_layer(name), "shape": list(p.shape),
                             "dtype": str(p.dtype)}
        return out

    def _manifest(self, done: int, parts: list) -> dict:
        all_files, all_params = {}, {}
        for written, params in parts:
            all_files.update(written)
            all_params.update(params)
        cfg, optimizer = self.cfg, optimizer_name(self.optimizer)
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


def write(folder, pipe, optimizer) -> None:
    """One DCP checkpoint of the pipeline's model and optimizer state into ``folder`` (every rank calls it)."""
    import torch.distributed.checkpoint as dcp

    state = {"model": pipe.state_dict(), "optim": pipe.optimizer_state_dict(optimizer)}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(folder), sync_files=True))


def load(folder, manifest: dict, pipe, optimizer) -> None:
    """Read a DCP checkpoint into the pipeline and ``optimizer`` (every rank calls it): each rank asks for its
    own parameters' tensors and their optimizer state, at its own shards; the run's param groups stay."""
    model, optim = pipe.state_dict(), pipe.optimizer_state_dict(optimizer)
    state = {"model": model, "optim": {k: v for k, v in optim.items() if k.startswith("state.")}}
    read_into(folder, manifest, state, agree=_first_of_every_rank)
    pipe.load_state_dict(model)
    pipe.names.load_optimizer_state_dict(optimizer, state["optim"], hyperparameters=False)


def read_into(folder, manifest: dict, state: dict, *, no_dist: bool = False, agree=lambda problem: problem) -> None:
    """``dcp.load`` of ``state`` (``{"model": ..., "optim": ...}``, filled in place) from ``folder``, its index read
    without unpickling code and checked against ``state`` first: every key there, a tensor of the same shape
    and dtype (``agree``: the first problem of any rank, so that every rank refuses alike). A data file that
    does not read as tensors is named."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    md = check_index(folder, manifest)
    found = index.problems(md, state, _what)
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    first = agree(f"{found[0]}{more}" if found else None)
    if first:
        raise RunError(f"`resume` {folder}: not a checkpoint of this model: {first}; resume from a checkpoint of "
                       "this model")
    try:
        with warnings.catch_warnings():  # one process on purpose: DCP's warning that it is one says nothing
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, storage_reader=index.Reader(folder, md), planner=index.Planner(), no_dist=no_dist)
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - whatever DCP met: not this model's checkpoint
        bad = index.unreadable(e)
        if bad is not None:
            raise RunError(f"`resume` {folder}: {bad.name} does not read as the tensors {files.DCP_METADATA} says "
                           f"it holds (damaged, or not a DCP data file: {bad.why}); resume from another "
                           "checkpoint") from None
        raise RunError(f"`resume` {folder}: its DCP files do not read as a checkpoint of this model "
                       f"({type(e).__name__}); resume from another checkpoint") from None


def incompatible(manifest: dict, names: set, params: dict) -> str | None:
    """Why the manifest's parameters are not the model's (None when they are): the model's logical ``names``
    must be the manifest's, and each tensor of ``params`` (logical name -> tensor) of its shape and dtype."""
    theirs = set(manifest["params"])
    if theirs != names:
        odd = sorted(names - theirs) or sorted(theirs - names)
        side = "this model has" if names - theirs else "the checkpoint has"
        return f"{side} parameter {odd[0]}, the other does not; {len(theirs)} parameters there, {len(names)} here"
    for name, p in sorted(params.items()):
        saved = manifest["params"][name]
        if tuple(saved["shape"]) != tuple(p.shape):
            return f"parameter {name} has shape {tuple(saved['shape'])} there, {tuple(p.shape)} here"
        if saved["dtype"] != str(p.dtype):
            return f"parameter {name} is {saved['dtype']} there, {p.dtype} here"
    return None


def _what(top: str, key: str) -> str:
    """A state key in a message's words: "parameter 3.fc.weight", "optimizer state exp_avg of 3.fc.weight"."""
    if top == "optim" and key.startswith("state."):
        name, _, part = key[len("state."):].rpartition(".")
        return f"optimizer state {part} of {name}"
    return f"parameter or buffer {key}" if top == "model" else f"{top} entry {key}"


def _first_of_every_rank(problem: str | None) -> str | None:
    """The first rank's problem, on every rank (a collective): no rank loads what another refused."""
    seen: list = [None] * dist.get_world_size()
    dist.all_gather_object(seen, problem)
    return next((p for p in seen if p), None)


def check_index(folder, manifest: dict):
    """DCP's index (``.metadata``), read without running code (``checkpoint_index``): it points into the files
    the manifest lists, and its byte ranges tile each of them exactly, so a data file swapped with another or
    edited (its hash updated) is refused by name before DCP reads a byte of it as a tensor. Returns it."""
    try:
        md = index.read(Path(folder) / files.DCP_METADATA)
    except index.BadIndex as e:
        raise RunError(f"`resume` {folder}: {files.DCP_METADATA} is not the index of a DCP checkpoint ({e}); "
                       "resume from another checkpoint") from None
    ranges: dict[str, list] = {}
    for info in md.storage_data.values():
        ranges.setdefault(info.relative_path, []).append((info.offset, info.length))
    listed = {n for n in manifest["files"] if files.is_dcp_file(n) and n != files.DCP_METADATA}
    for name in sorted(set(ranges) | listed):
        if name not in listed:
            raise RunError(f"`resume` {folder}: {files.DCP_METADATA} points into {str(name)[:80]!r}, which the "
                           "manifest does not list; resume from another checkpoint")
        end = 0
        for offset, length in sorted(ranges.get(name, ())):
            if offset != end:
                break
            end += length
        if end != manifest["files"][name]["bytes"]:
            raise RunError(f"`resume` {folder}: {name} does not hold what {files.DCP_METADATA} says is in it "
                           "(the files were swapped or edited); resume from another checkpoint")
    return md


def optimizer_name(optimizer) -> str:
    """The optimizer's class name, the one a ZeroRedundancyOptimizer wraps (a checkpoint's state is that one's)."""
    return type(getattr(optimizer, "optim", optimizer)).__name__


def rng_state(device) -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    if "numpy" in sys.modules:  # only a run that imported NumPy can have drawn from it
        name, keys, pos, has_gauss, cached = sys.modules["numpy"].random.get_state()
        state["numpy"] = (name, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss), float(cached))
    return state


def restore_rng(folder, name: str, data: bytes, device) -> None:
    """Set this process's generators from an RNG file's ``data`` (``RunError`` naming the file when its bytes,
    though the manifest's, are not an RNG state: a garbled or crafted file)."""
    try:
        set_rng_state(torch.load(io.BytesIO(data), weights_only=True), device)
    except Exception as e:  # noqa: BLE001 - whatever a garbled file raises, it is not one of ours
        raise RunError(f"`resume` {folder}: {name} is not an RNG state of a checkpoint ({type(e).__name__}); resume "
                       "from another checkpoint") from None


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
