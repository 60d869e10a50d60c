"""Train an HF causal LM on local ranks (or under torchrun) with any schedule: what ``stagewise train --hf`` runs.

Every rank builds its own ``stagewise.Pipeline`` from the model folder (its own
layers, its own tensors), steps it in a plain loop with a torch optimizer, and
at the end may write the model back as an HF folder (one shard per rank).
Options are checked in the launching process first, so bad input is one
message before any rank starts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..runtime.run.config import check_batch
from .data import TextData
from .model import HFModel, load


@dataclass(frozen=True, kw_only=True)
class HFTrain:
    """One run (picklable: it travels to every rank)."""

    source: str  #: model folder or config.json
    data: TextData
    schedule: str | None = "1f1b"  #: family name; None = unpipelined, one process
    csv: str | None = None  #: a torch compute-only CSV instead of a family
    ranks: int = 2  #: p
    microbatches: int = 4  #: m
    chunks: int | None = None  #: v
    split: tuple[int, ...] | str | None = None  #: layers per stage of one model copy: counts or layout text
    dp: int = 1
    recompute: bool | tuple[int, ...] = False
    steps: int = 3
    batch: int = 8  #: sequences per step
    lr: float = 1e-3
    optimizer: str = "adamw"
    clip: float | None = None
    dtype: str = "float32"
    seed: int = 0
    save: str | None = None  #: write the trained model here as an HF folder (+ optimizer state, resume.py)
    save_every: int | None = None  #: also save after every N steps
    resume: str | None = None  #: continue from a ``save`` folder: its weights, optimizer state and step
    timeout: float = 30.0
    timeline: bool = False  #: return the last step's measured timeline
    progress: bool = False  #: rank 0 prints each step's loss as it goes

    def model(self) -> HFModel:
        """The model with its weights: the ``resume`` folder's when resuming, else ``source``'s."""
        return load(self.resume or self.source, dtype=self.dtype, seed=self.seed)

    def make_schedule(self):
        """The schedule value (from the family or the CSV) for ``ranks``."""
        if self.csv:
            from .. import torch_csv

            return torch_csv.load(self.csv)
        from ..schedules import generate

        return generate(self.schedule, self.ranks, self.microbatches, self.chunks)

    def check(self) -> None:
        """Everything that can be checked before ranks start; raises ``RunError`` (``HFError`` for the model's
        own rules) or the schedule's own errors."""
        if self.resume:
            from .resume import read_meta

            read_meta(self.resume)  # a --save folder, before its weights are looked at
        model = self.model()
        self.data.check(model.config)
        if self.schedule is None and not self.csv:
            return
        sched = self.make_schedule()
        model.check_fit(sched.stages_per_copy, self.split)
        check_batch(self.batch, sched.microbatches, self.dp)
        if self.resume:
            from . import resume

            resume.check(self.resume, sched.ranks * self.dp, sched.placement, self.steps)


def run(cfg: HFTrain, threads: int | None = None) -> dict:
    """Check, then train on ``ranks x dp`` local ranks (one rank each under torchrun); rank 0's result."""
    cfg.check()
    if cfg.schedule is None and not cfg.csv:
        return reference(cfg)
    import stagewise

    world = cfg.make_schedule().ranks * cfg.dp
    return stagewise.launch(rank_main, world, cfg, timeout=cfg.timeout, threads=threads)


def rank_main(cfg: HFTrain) -> dict:
    """One rank: its pipeline, the user-style loop, the optional save. Returns losses, step times, timeline."""
    import torch.distributed as dist

    from ..runtime.run.worker import optimizer_class
    from . import resume
    from .pipeline import pipeline

    model = cfg.model()
    pipe = pipeline(model, cfg.make_schedule(), split=cfg.split, dp=cfg.dp, recompute=cfg.recompute,
                    timeout=cfg.timeout)
    opt = optimizer_class(cfg.optimizer)(pipe.parameters(), lr=cfg.lr)
    first = 0
    if cfg.resume:
        first = resume.check(cfg.resume, dist.get_world_size(), pipe.schedule.placement, cfg.steps)
        resume.load_optimizer(opt, cfg.resume)
    speaks = dist.get_rank() == 0
    out = {"losses": [], "step_time_s": [], "timeline": None, "first_step": first,
           "read_bytes": model.checkpoint().read_bytes if model.folder else 0}
    for k in range(first, cfg.steps):
        last = k == cfg.steps - 1
        t0 = time.perf_counter()
        res = pipe.step(*cfg.data.batch(k, cfg.batch), timeline=cfg.timeline and last)
        if cfg.clip is not None:
            pipe.clip_grad_norm_(cfg.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        out["losses"].append(res.loss)
        out["step_time_s"].append(time.perf_counter() - t0)
        out["timeline"] = res.timeline if last else None
        if speaks and cfg.progress:
            print(f"step {k + 1}/{cfg.steps}  loss {res.loss:.4f}  {out['step_time_s'][-1] * 1e3:.1f} ms", flush=True)
        if cfg.save and (last or (cfg.save_every and (k + 1) % cfg.save_every == 0)):
            resume.save(pipe, model, opt, cfg.save, k + 1)
    out["read_bytes"] = _all_ranks(out["read_bytes"])
    return out if speaks else {}


def reference(cfg: HFTrain) -> dict:
    """The unpipelined run in this process: the same layers, data and optimizer, the whole batch at once."""
    import torch

    from ..runtime.run.worker import optimizer_class

    model = cfg.model()
    layers = torch.nn.Sequential(*model.layers())
    opt = optimizer_class(cfg.optimizer)(layers.parameters(), lr=cfg.lr)
    out = {"losses": [], "step_time_s": [], "timeline": None, "first_step": 0,
           "read_bytes": [model.checkpoint().read_bytes if model.folder else 0]}
    for k in range(cfg.steps):
        t0 = time.perf_counter()
        ids, labels = cfg.data.batch(k, cfg.batch)
        loss = model.loss(layers(ids), labels)
        loss.backward()
        if cfg.clip is not None:
            torch.nn.utils.clip_grad_norm_(layers.parameters(), cfg.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        out["losses"].append(loss.item())
        out["step_time_s"].append(time.perf_counter() - t0)
        if cfg.progress:
            print(f"step {k + 1}/{cfg.steps}  loss {loss.item():.4f}  {out['step_time_s'][-1] * 1e3:.1f} ms", flush=True)
    if cfg.save:
        from .weights import save_shard, write_index

        save_shard(cfg.save, 0, 1, model.hf_state_dict(dict(enumerate(layers))))
        write_index(cfg.save, 1, model.config)
    return out


def _all_ranks(value) -> list:
    import torch.distributed as dist

    got = [None] * dist.get_world_size()
    dist.all_gather_object(got, value)
    return got
