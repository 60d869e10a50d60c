"""A run that outlives its ranks: restart from the last complete checkpoint, on the ranks that are left.

``train --max-restarts N``: when a rank dies (killed, an error, a hang past ``--timeout``) the launcher stops
every rank as always (launch.py); then this loop starts them again, resuming from the newest complete
checkpoint that this launch wrote under ``--save`` (``checkpoint_files.find`` passes over a half-written one;
one left by another run is never taken: without one of ours the restart takes the run's own ``--resume``, or
starts again from step 0). It says what was lost: the steps done since that checkpoint.

A rank whose slot is gone (a ``lose`` fault locally; on a cluster, a node that does not come back) leaves
fewer ranks. With ``--elastic MIN:MAX`` the layout is re-planned for them (``stagewise.plan.elastic``: drop
dp replicas first, else re-partition the layers over fewer stages with the planner's partitioner), keeping
the global batch and the micro-batch size (more micro-batches per replica), and DCP reshards the checkpoint
into it; without ``--elastic`` the run stops naming what is missing. Each transition is printed (``notify``)
and recorded in the result (``RunResult.restarts``): the step, the old and new layout, the steps and the time
lost, and the time from the death to the first step after it, split into detection, restart, re-plan, and
the checkpoint's load (manifest and hashes) and reshard (DCP's read into the new layout).

Slots that return (locally, a ``lose`` fault's ``back=J``: the slot is back once step J has run) grow the run
back at its next checkpoint: the attempt on fewer ranks runs with ``grow_after`` J, its ranks stop after the
first checkpoint written once J steps are done, and the run goes on from that checkpoint at the layout as
configured (or, with some still missing, the one re-planned for the slots there are), recorded as a ``grow``
transition. A grow is not a failure: it does not count against ``max_restarts``. Under torchrun a node that
joins makes torchrun restart the workers (with ``--save-on-signal`` they save first), and ``torchrun_attempt``
takes the newest checkpoint at the configured layout.

The injected fault fires once per run: a restarted attempt runs without it. The data position continues
exactly: step k reads the same sequences (``ModelConfig.batch(k, batch)``) whatever the layout.

Its options are checked with the others (``RunConfig._check_restarts``), before any rank starts.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Callable

from ..resilience.faults import LOST_CODE
from ..config import RunError


def run(cfg, launch_once: Callable, report: Callable | None = None, notify: Callable | None = None):
    """Run ``cfg`` (``launch_once(cfg, report)`` -> RunResult, one launch), restarting it after a rank's failure
    up to ``cfg.max_restarts`` times, and growing it back at a checkpoint when lost slots return. Returns the
    last attempt's result with every step's loss and time (those before its checkpoint from the attempts that
    ran them) and ``restarts``: one record per transition."""
    from ..launching.launch import RankFailure

    seen = _complete(cfg.save)  # checkpoints there before this launch: never ours to resume
    slots = cfg.world  # the ranks this run may use now
    back: list[tuple[int, int]] = []  # (steps done when they return, how many): lost slots that come back
    current, records, steps = cfg, [], {}  # steps: step k (0-based) -> (loss, seconds), the latest attempt's
    while True:
        marks: dict = {"first_step": None}

        def tracked(job, k, loss, seconds, _marks=marks):
            if _marks["first_step"] is None:
                _marks["first_step"] = time.time()
                if records and "downtime_s" not in records[-1]:  # the transition before: down until now
                    records[-1]["downtime_s"] = max(0.0, _marks["first_step"] - records[-1]["died_at"])
            steps[k] = (loss, seconds)
            if report:
                report(job, k, loss, seconds)

        try:
            res = launch_once(current, tracked)
        except RankFailure as e:
            if e.user or sum(r["event"] == "failure" for r in records) >= cfg.max_restarts:
                raise
            failed, (rec, slots_lost) = e, _failure(e, steps)  # ``e`` is unbound after this block
            slots -= len(slots_lost)
            back += _returning(current.fault, len(slots_lost))
        else:
            done = max(steps, default=-1) + 1
            if current.grow_after is None or done >= cfg.steps:
                return _finished(res, steps, records)
            came = sum(n for k, n in back if k <= done)  # the ranks stopped at a checkpoint: slots are back
            back = [(k, n) for k, n in back if k > done]
            slots += came
            rec = {"event": "grow", "after_step": done, "slots_back": came, "died_at": time.time(),
                   "detection_s": 0.0}
        t0 = time.time()
        try:
            nxt, why = _next_layout(cfg, current if rec["event"] == "failure" else cfg, slots)
        except RunError as stop:
            if rec["event"] == "grow":  # the ranks back do not make a layout: go on as it was
                nxt, why = current, f"kept: {stop}"
            else:  # no layout fits the ranks left: the failure stands, and why it ends here
                raise RankFailure(f"{failed}; cannot restart: {stop}", ranks=failed.ranks,
                                  flight=failed.flight) from failed
        found = _resume_point(cfg, seen)
        resumed = _step_of(found)
        grow = min((k for k, _ in back), default=None) if cfg.save and slots < cfg.world else None
        nxt = dataclasses.replace(nxt, resume=found, fault=None, grow_after=grow)  # the fault fired: once per run
        done = max(steps, default=-1) + 1
        lost_work = sum(steps.pop(k)[1] for k in sorted(steps) if k >= resumed)
        rec.update(attempt=len(records) + 1, resumed_from=found, resumed_step=resumed, lost_steps=done - resumed,
                   lost_work_s=lost_work, old_layout=layout_of(current), new_layout=layout_of(nxt),
                   replan="the layout as configured" if rec["event"] == "grow" and nxt.world == cfg.world and
                   why == "same layout" else why, replan_s=time.time() - t0, restarted_at=time.time())
        records.append(rec)
        if notify:
            notify(_say(rec))
        current = nxt


def _failure(e, steps: dict) -> tuple[dict, list[int]]:
    """The record of a rank's failure so far, and the ranks whose slot it took away for good."""
    detected = time.time()
    lost_slots = [r for r, c in e.exit_codes.items() if c == LOST_CODE]  # a slot that stays gone
    died = min((e.last_event[r] for r in e.ranks if r in e.last_event), default=detected)
    return {"event": "failure", "failed_after_step": max(steps, default=-1) + 1, "error": str(e),
            "ranks_failed": list(e.ranks), "slots_lost": lost_slots, "detection_s": max(0.0, detected - died),
            "died_at": died}, lost_slots


def _returning(fault: str | None, lost: int) -> list[tuple[int, int]]:
    """The lost slots that come back, as (steps done then, how many): a local ``lose`` fault's ``back=J``."""
    if not fault or not lost:
        return []
    from ..resilience.faults import parse_fault

    j = parse_fault(fault).back
    return [] if j is None else [(j, lost)]


def _finished(res, steps: dict, records: list):
    """The last attempt's result with the steps of every attempt, and the transitions completed with what only
    that attempt measured (its restore's load and reshard)."""
    if not records:
        return res
    ck = res.checkpoint or {}
    first = int(ck.get("resumed_step", 0))
    before = [steps[k] for k in sorted(steps) if k < first]
    last = records[-1]
    restore = ck.get("restore_s") or {}
    last.update(load_s=restore.get("load"), reshard_s=restore.get("reshard"),
                restart_s=(None if ck.get("restore_started_at") is None else
                           max(0.0, ck["restore_started_at"] - last["restarted_at"])))
    for r in records:  # the wall time the transition cost: down, and the lost steps to run again
        r.setdefault("downtime_s", None)
        r["time_lost_s"] = None if r["downtime_s"] is None else r["downtime_s"] + r["lost_work_s"]
        r.pop("restarted_at", None)
        r.pop("died_at", None)
    return dataclasses.replace(res, losses=tuple(l for l, _ in before) + tuple(res.losses),
                               first_step=min((k for k in steps if k < first), default=res.first_step),
                               step_time_s=tuple(s for _, s in before) + tuple(res.step_time_s),
                               restarts=tuple(records))


def _where(rec: dict) -> tuple[str, str]:
    """Where a transition goes on (the checkpoint it resumes), and its re-plan if the layout changed."""
    where = (f"from {rec['resumed_from']} (step {rec['resumed_step']})" if rec["resumed_from"] else
             "from step 0 (no checkpoint of this run yet)")
    layout = (f"; re-planned {rec['old_layout']['text']} -> {rec['new_layout']['text']} ({rec['replan']})"
              if rec["new_layout"] != rec["old_layout"] else "")
    return where, layout


def _say(rec: dict) -> str:
    """One line per transition: what failed (or came back), what was lost, where it goes on."""
    where, layout = _where(rec)
    if rec["event"] == "grow":
        return (f"grow {rec['attempt']}: {_n(rec['slots_back'], 'rank slot')} back; stopped at the checkpoint "
                f"after step {rec['after_step']}; restarting {where}{layout}")
    lost, done = rec["lost_steps"], rec["failed_after_step"]
    steps = (f"lost {lost} finished step{'s' if lost != 1 else ''}" +
             (f" ({rec['resumed_step'] + 1}-{done})" if lost > 1 else f" ({done})" if lost == 1 else "") +
             f" and step {done + 1} in flight")
    slots = f"; slot{'s' if len(rec['slots_lost']) > 1 else ''} of rank {', '.join(map(str, rec['slots_lost']))} " \
            "gone" if rec["slots_lost"] else ""
    return (f"restart {rec['attempt']}: {rec['error'].splitlines()[0]}{slots}; {steps}; restarting {where}"
            f"{layout}")


def layout_of(cfg) -> dict:
    """The layout a transition records: the parallel degrees, m, the split and the world."""
    par = cfg.parallelism
    split = cfg.split if cfg.split is None or isinstance(cfg.split, str) else ",".join(map(str, cfg.split))
    split = "" if split is None else f", split {split}"
    return {"text": f"{par.describe()}, m {cfg.microbatches}{split}", "parallelism": par.to_dict(),
            "microbatches": cfg.microbatches, "split": None if cfg.split is None else str(cfg.split),
            "world": par.world}


def _next_layout(cfg, current, slots: int):
    """(config, why) for the restart on ``slots`` ranks: the same layout when they are enough; re-planned with
    ``elastic``; else ``RunError`` naming what is missing."""
    if slots >= current.world:
        return current, "same layout"
    if cfg.elastic is None:
        gone = current.world - slots
        raise RunError(f"{_n(gone, 'rank slot')} gone: {_n(slots, 'rank')} left, and the layout "
                       f"{current.parallelism.describe()} needs {current.world}; give `elastic` MIN:MAX to "
                       "re-plan for the ranks left")
    from ...plan.elastic import ElasticError, replan

    time_, state = _layer_costs(current.model, current.optimizer)
    try:
        new = replan(current.parallelism, ranks_left=slots, minimum=cfg.elastic[0],
                     microbatches=current.microbatches, batch=current.batch,
                     schedule=current.schedule if isinstance(current.schedule, str) else None,
                     layer_time=time_, layer_bytes=state, memory=_device_memory())
    except ElasticError as e:
        raise RunError(str(e)) from None
    par = new.parallelism
    return dataclasses.replace(current, parallelism=par, microbatches=new.microbatches,
                               split=current.split if par.pp == current.ranks else new.split), new.why


def _layer_costs(model, optimizer: str) -> tuple[tuple[float, ...] | None, tuple[float, ...] | None]:
    """Per layer, (the multiply-adds of one token through it, the bytes of its model state), counted from its
    parameters built on the meta device (nothing allocated): the time from a matrix's parameters, not an
    embedding's (a lookup); the state as weights, gradients and, for Adam, its two moments (parallel/state_memory.py's
    rule; another optimizer's state is not counted). (None, None) when it cannot be built so: the partitioner then splits evenly."""
    try:
        import torch
        from torch import nn

        from ..parallel.state_memory import ADAM

        per_param = 4 if optimizer.lower() in ADAM else 2  # weight, gradient (and Adam's two moments)
        with torch.device("meta"):
            layers = model.layers()  # a sequence, or a factory (``Layers``: count, build) called layer by layer
            built = list((layers.build(i) for i in range(layers.count)) if hasattr(layers, "build") else layers)
        costs, state = [], []
        for layer in built:
            n = sum(p.numel() for m in layer.modules() if not isinstance(m, nn.Embedding)
                    for p in m.parameters(recurse=False))
            costs.append(float(max(n, 1)))
            state.append(float(sum(p.numel() * p.element_size() for p in layer.parameters()) * per_param))
        return tuple(costs), tuple(state)
    except Exception:  # noqa: BLE001 - a model that cannot be built on meta
        return None, None


def _device_memory() -> float | None:
    """Bytes of one device (the first GPU's), None on CPU: no limit to re-plan against."""
    try:
        import torch

        return float(torch.cuda.get_device_properties(0).total_memory) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001
        return None


def _n(count: int, what: str) -> str:
    return f"{count} {what}{'s' if count != 1 else ''}"


def _complete(save: str | None) -> dict:
    """Step folder -> its manifest's saved time, for the complete checkpoints under ``save`` now."""
    from ..resilience import checkpoint_files as files

    if not save or not Path(save).is_dir():
        return {}
    out = {}
    for d in Path(save).glob("step-*"):
        if d.is_dir() and not d.is_symlink() and not files.incomplete(d):
            m = files.find(str(d)).manifest
            out[d.name] = (m["run"]["id"], m.get("saved_at"))
    return out


def _resume_point(cfg, seen: dict) -> str | None:
    """The newest complete checkpoint this launch wrote under `save`, else the run's own `resume` (None: from
    step 0). One that was there before the launch is another run's (or an earlier life's): never taken."""
    from ..resilience import checkpoint_files as files

    mine = {k: v for k, v in _complete(cfg.save).items() if seen.get(k, object()) != v}
    if mine:
        return str(files.find(str(Path(cfg.save) / max(mine))).folder)
    return cfg.resume


def _step_of(found: str | None) -> int:
    if found is None:
        return 0
    from ..resilience import checkpoint_files as files

    return int(files.find(found).manifest["step"])


def torchrun_attempt(cfg, world: int, attempt: int = 1):
    """A torchrun worker's config for the ranks torchrun brought (WORLD_SIZE ``world``). ``attempt``: its
    TORCHELASTIC_RESTART_COUNT. A restarted worker (``--max-restarts``) resumes from the newest complete
    checkpoint written since torchrun's agent (this process's parent, alive across its restarts) started, else
    as configured; with ``elastic``, any attempt on another number of ranks than configured is re-planned (a
    node gone: fewer; back: the layout as configured), a fresh launch on fewer ranks too (a preempted run
    resumed where fewer are free). (config, the transition's record: what this attempt knows of it, the
    checkpoint and the two layouts; ``timed`` adds its times)."""
    import os

    import torch._dynamo  # noqa: F401 - the group imports it anyway (groups.init_group): not the re-plan's time

    from ..resilience import checkpoint_files as files

    start, t0 = cfg, time.time()
    if attempt > 0 and cfg.save and Path(cfg.save).is_dir():
        try:
            born = os.stat(f"/proc/{os.getppid()}").st_ctime  # the agent's start: what is older is not ours
        except OSError:
            born = None
        mine = [d for d in Path(cfg.save).glob("step-*") if d.is_dir() and not files.incomplete(d)
                and born is not None and (d / files.MANIFEST).stat().st_mtime >= born]
        if mine:
            cfg = dataclasses.replace(cfg, resume=str(max(mine)))
    why = "same layout"
    if cfg.elastic is not None and world != cfg.world:
        cfg, why = _next_layout(cfg, cfg, world)
    rec = {"event": "torchrun restart" if attempt > 0 else "launch on fewer ranks", "attempt": attempt,
           "world": world, "resumed_from": cfg.resume, "resumed_step": _step_of(cfg.resume),
           "old_layout": layout_of(start), "new_layout": layout_of(cfg), "replan": why, "replan_s": time.time() - t0}
    return dataclasses.replace(cfg, fault=None) if attempt > 0 else cfg, rec


def timed(rec: dict, checkpoint: dict | None, started_at: float, met_at: float, first_step_at: float | None
          ) -> dict:
    """A torchrun attempt's record with its times: ``started_at`` (this worker process's start, epoch seconds);
    ``start_s``, from it to the ranks' group, the re-plan apart (imports, checks, the workers' group);
    ``build_s``, the group to the restore (the stages and optimizer built); ``load_s`` and ``reshard_s``, the
    checkpoint's restore; ``first_step_s``, from the restore's end (without one, the group) to the end of the
    first step, at ``first_step_at``. What came before the worker started (the death, torchrun's detection
    and its agents' new rendezvous) only torchrun saw: from a death at T, the first step came
    ``first_step_at - T`` later."""
    ck = checkpoint or {}
    restore, restored_at = ck.get("restore_s") or {}, ck.get("restore_started_at")
    ready = met_at if restored_at is None else restored_at + sum(restore.values())
    return {**rec, "started_at": started_at, "start_s": max(0.0, met_at - started_at - rec["replan_s"]),
            "build_s": None if restored_at is None else max(0.0, restored_at - met_at),
            "load_s": restore.get("load"), "reshard_s": restore.get("reshard"),
            "first_step_s": None if first_step_at is None else max(0.0, first_step_at - ready),
            "first_step_at": first_step_at}


def process_started_at() -> float:
    """This process's start (epoch seconds), from /proc (Linux); now elsewhere."""
    import os

    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: the start, in clock ticks after boot
        with open("/proc/uptime") as f:
            up = float(f.read().split()[0])
        return time.time() - (up - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


def say_torchrun(rec: dict) -> str:
    """The line a torchrun worker's rank 0 prints when it restarted, or was launched on fewer ranks than
    configured: where it resumes, and on which layout."""
    where, layout = _where(rec)
    if rec["event"] == "launch on fewer ranks":
        configured = rec["old_layout"]["world"]
        return (f"launched on {_n(rec['world'], 'rank')}, the layout configured needs {configured}: "
                f"{'resuming ' + where if rec['resumed_from'] else 'starting at step 0'}{layout}")
    return f"torchrun restart {rec['attempt']} on {_n(rec['world'], 'rank')}: resuming {where}{layout}"
