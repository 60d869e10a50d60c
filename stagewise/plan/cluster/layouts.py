"""The layouts a cluster job searches: one ``ClusterSearcher`` per tensor degree, recomputation, pipeline
degree, expert layout (ep, etp and device order; ep 1 for a dense model) and data-parallel sharding that could
fit, each with the frameworks that run it and express it (``overlap_rules.refusal``).

A mixture of experts is one more kind of layout, not another searcher: its (ep, etp, placement) come from
``placement.expert_layouts`` and its profile from that layout, and everything after is the same search.
"""

from __future__ import annotations

from dataclasses import replace

from ...parallelism import Parallelism
from ...schedules import whole_names
from .activations import dropped_modules
from .analytic import ExpertParallel, TensorParallel, analytic_profile, replay_bytes
from .placement import StageGrid, expert_layouts
from .job import Job, shardings, state_factor, tensor_degrees
from .overlap_rules import Framework, refusal
from .searcher import ClusterSearcher

WEIGHTS_TOO_BIG = "weights, gradients and optimizer state alone exceed the GPU's usable memory"


def searchers(job: Job, skipped: dict, schedules: dict | None = None) -> list[ClusterSearcher]:
    """One searcher per layout that could fit (see the module doc); ``skipped`` collects why others were
    dropped; ``schedules`` is a cache shared across calls. Recomputation is the analytic profile's, so
    ``Config.recompute`` stays off, except for the runtime's whole-stage replay ("stage")."""
    shared: dict = {} if schedules is None else schedules
    out = []
    for t in tensor_degrees(job):
        tp = TensorParallel(t=t, sequence_parallel=job.sequence_parallel, overlap=job.async_tp)
        profiles: dict = {}
        for mode in recompute_modes(job):
            if job.spec.moe is not None and mode == "stage":  # the runtime replays no expert-parallel stage
                continue
            out += _at_tensor_degree(job, t, tp, mode, profiles, shared, skipped)
    return out


def _at_tensor_degree(job: Job, t: int, tp: TensorParallel, mode: str, profiles: dict, shared: dict,
                      skipped: dict) -> list[ClusterSearcher]:
    spec, hw = job.spec, job.hardware
    base = "off" if mode == "stage" else mode
    replay = ({b: replay_bytes(spec, b, tp, linear_factor=job.linear_factor) for b in job.micro_batch_sizes}
              if mode == "full" else {})
    ranks = job.gpus // t
    out = []
    for p in job.pipeline or [p for p in range(1, min(ranks, spec.layers + 2) + 1) if ranks % p == 0]:
        if ranks % p or p > spec.layers + 2:
            continue
        dp = ranks // p
        for grid in _grids(job, t, p, ranks):
            layout = grid.parallelism
            key = (base, layout.expert_degree, layout.expert_tp, grid.nodes())
            if key not in profiles:
                expert = ExpertParallel(ep=key[1], nodes=key[3], zero=job.zero, etp=key[2])
                profiles[key] = analytic_profile(spec, hw, tp, job.micro_batch_sizes, recompute=base, expert=expert,
                                                 compute=job.compute)
            prof = profiles[key]
            for sharding, shard in groups(job, dp, mode, skipped):
                if sharding == "hsdp" and spec.moe is not None:  # HSDP is not searched for MoE models
                    continue
                sf = state_factor(dp, sharding=sharding, shard=shard) + job.weight_extra
                esf = state_factor(grid.replicas, sharding=sharding) + job.weight_extra
                weights = sum(x.param_bytes * sf + x.expert_param_bytes * (esf - sf) for x in prof.layers)
                if weights / p > job.usable:
                    if mode == recompute_modes(job)[0]:  # once per layout, whatever the recomputation
                        skipped[WEIGHTS_TOO_BIG] = skipped.get(WEIGHTS_TOO_BIG, 0) + 1
                    continue
                moe = spec.moe is not None
                par = Parallelism.of_plan(p=p, dp=dp, t=t, sharding=sharding, shard=shard, ep=layout.expert_degree,
                                          etp=layout.etp)
                fits_order = tuple(fw for fw in runners(job, mode, sharding)
                                   if not moe or grid.placement in fw.expert_placements)
                frameworks = offered(fits_order, par, skipped)
                families = families_run(job, frameworks, skipped)
                if not families:
                    continue
                cl = replace(grid, state_factor=sf, expert_state_factor=esf if moe else None)
                for rhythm, fws in _by_rhythm(frameworks, p, sharding):
                    run = replace(par, reshard_after_forward=rhythm and par.fsdp > 1)
                    out.append(ClusterSearcher(profile=prof, cluster=replace(cl, parallelism=run),
                                               global_batch=job.global_batch, job=job,
                                               space=replace(job.space, families=families_run(job, fws),
                                                             recompute=(mode == "stage",)),
                                               recompute=mode, replay=replay, sharding=sharding,
                                               frameworks=fws, per_block=rhythm, _schedules=shared,
                                               skipped=skipped))
    return out


def _by_rhythm(frameworks: tuple[Framework, ...], p: int, sharding: str) -> list[tuple[bool, tuple]]:
    """The frameworks in groups that hold the same sharded memory: (FSDP runs block by block, those that do so
    at ``p``; ``Framework.per_block``), in their order, one group unless the sharding is FSDP's."""
    sharded = sharding in ("fsdp", "hsdp")
    groups: dict[bool, list] = {}
    for fw in frameworks:
        groups.setdefault(sharded and fw.per_block(p), []).append(fw)
    return [(rhythm, tuple(fws)) for rhythm, fws in groups.items()]


def _grids(job: Job, t: int, p: int, ranks: int) -> list[StageGrid]:
    """The device layouts of one pipeline degree: a dense model's one (pipelines inside nodes), an MoE
    model's every (ep, etp) and placement asked for (one placement at p = 1, where they are the same)."""
    hw = job.hardware
    base = StageGrid(devices=ranks, per_node=max(1, hw.gpus_per_node // t), memory=job.usable, intra=hw.intra,
                     inter=hw.inter, parallelism=Parallelism.of_plan(p=p, dp=ranks // p, t=t), node=hw.gpus_per_node)
    if job.spec.moe is None:
        return [base]
    places = job.expert_placement if p > 1 else job.expert_placement[:1]
    return [replace(base, parallelism=Parallelism.of_plan(p=p, dp=ranks // p, t=t, ep=ep, etp=etp), placement=place)
            for ep, etp in expert_layouts(job.spec.moe.experts, base.pool, t, job.expert, job.expert_tensor)
            for place in places]


def recompute_modes(job: Job) -> tuple[str, ...]:
    """``job.recompute``, less "selective" for a flash-attention model where "off" is searched too (it
    keeps no scores, so the two are the same), plus "stage" (the runtime's whole-stage replay) for "full"
    when a framework recomputes that way."""
    modes = job.recompute
    if "off" in modes and not _selective_drops(job):
        modes = tuple(m for m in modes if m != "selective")
    if "full" in modes and any(fw.stage_recompute for fw in job.frameworks):
        modes += ("stage",)
    return tuple(m for m in modes if runners(job, m))


def unrun(job: Job) -> str | None:
    """Why no framework asked for runs any recomputation asked together with a sharding asked (None: some
    pair runs), in one line naming each framework's modes: the search has nothing to offer, whatever memory."""
    moe = job.spec.moe is not None
    said = []
    for fw in job.frameworks:
        if job.async_tp and not fw.async_tp:
            continue
        modes = [m for m in fw.recompute if not (moe and m == "full" and fw.stage_recompute)]
        shards = [s for s in shardings(job, fw) if not (moe and s == "hsdp")]
        if any(m in modes for m in job.recompute) and shards:
            return None
        why = []
        if fw.name == "torchtitan" and "selective" in job.recompute:
            why.append("its selective checkpointing is per operator, not the attention core the plan costs")
        if moe and fw.stage_recompute and "full" in job.recompute:
            why.append("its full recomputation replays a whole stage, which it does not for expert-parallel stages")
        if moe and "hsdp" in shardings(job, fw):
            why.append("HSDP is not searched for a mixture of experts")
        runs = [s for s in fw.sharding if not (moe and s == "hsdp")]
        said.append(f"{fw.title} recomputes {', '.join(modes)} and shards {', '.join(runs)}"
                    + (f" ({'; '.join(why)})" if why else ""))
    asked = f"--recompute {','.join(job.recompute)}" + (f" --sharding {','.join(job.sharding)}" if job.sharding else "")
    return f"{asked}: no framework asked for runs that together: " + "; ".join(said)


def unsearched_recompute(job: Job) -> str | None:
    """The recomputation asked for that nothing searched (no framework asked for that runs the schedules asked
    runs it for this model), in one clause naming what those frameworks recompute; None when each was searched
    (or, "selective" on a model where it keeps what "off" keeps, searched as "off")."""
    moe = job.spec.moe is not None
    fams = job.space.families or whole_names()
    fws = [fw for fw in job.frameworks if any(fw.runs(f) for f in fams) and shardings(job, fw)
           and (fw.async_tp or not job.async_tp)]
    run = {m for fw in fws for m in fw.recompute if not (moe and m == "full" and fw.stage_recompute)}
    if "off" in run and not _selective_drops(job):
        run.add("selective")
    missing = [m for m in job.recompute if m not in run]
    if not missing or not fws:
        return None
    said = "; ".join(f"{fw.title} recomputes {', '.join(m for m in fw.recompute if m in run) or 'nothing'}"
                     + (", its full recomputation replaying whole stages, not expert-parallel ones"
                        if moe and fw.stage_recompute and "full" in fw.recompute else "") for fw in fws)
    return (f"recomputation {', '.join(missing)} was not searched: of the frameworks asked, those that run "
            f"--schedules {','.join(fams)} do not run it ({said})")


def _selective_drops(job: Job) -> bool:
    """Whether "selective" keeps less than "off" for this model: a flash-attention model keeps no scores, so
    recomputing the attention core alone drops nothing."""
    spec = job.spec
    kinds = {spec.block_kind(i) for i in range(spec.layers)}
    return any(dropped_modules(spec, k, job.recompute_modules) for k in kinds)


def runners(job: Job, mode: str, sharding: str | None = None) -> tuple[Framework, ...]:
    """The job's frameworks that recompute as ``mode`` says (and run ``sharding``, and overlap tensor-parallel
    collectives when the job asks for it)."""
    return tuple(fw for fw in job.frameworks if _recomputes(fw, mode)
                 and (sharding is None or sharding in shardings(job, fw)) and (fw.async_tp or not job.async_tp))


def _recomputes(fw: Framework, mode: str) -> bool:
    """Whether ``fw`` recomputes as ``mode`` says: "stage" is full recomputation where a framework replays a
    whole stage, "full" where it replays block by block."""
    if mode in ("full", "stage"):
        return "full" in fw.recompute and fw.stage_recompute == (mode == "stage")
    return mode in fw.recompute


def groups(job: Job, dp: int, mode: str, skipped: dict | None = None) -> list[tuple[str, int | None]]:
    """(sharding, HSDP shard group) pairs searched at ``dp`` replicas by some framework running ``mode``."""
    out = []
    for sh in dict.fromkeys(x for fw in runners(job, mode) for x in shardings(job, fw)):
        if sh == "hsdp":
            groups = [(sh, g) for g in job.hsdp_shards if 1 < g < dp and dp % g == 0]
            if not groups and skipped is not None:
                why = (f"--hsdp-shard {','.join(map(str, job.hsdp_shards))}: an HSDP shard group must divide the "
                       "data-parallel ranks with more than one group (1 < shard < dp)")
                skipped[why] = skipped.get(why, 0) + 1
            out += groups
        else:
            out.append((sh, None))
    return out


def families_run(job: Job, runners: tuple[Framework, ...], skipped: dict | None = None) -> tuple[str, ...]:
    """The families the job asks for that one of ``runners`` runs (``skipped`` collects the others, in
    the frameworks' words)."""
    asked = job.space.families or whole_names()
    out = tuple(f for f in asked if any(fw.runs(f) for fw in runners))
    if skipped is not None and runners:
        for f in asked:
            if f not in out:
                runs = "; ".join(f"{fw.title} runs {', '.join(fw.families)}" for fw in job.frameworks if fw.families)
                why = f"--schedules {f}: no framework asked for runs it ({runs})"
                skipped[why] = skipped.get(why, 0) + 1
    return out


def offered(runners: tuple[Framework, ...], par: Parallelism, skipped: dict) -> tuple[Framework, ...]:
    """``runners`` less those that cannot express the layout (``frameworks.refusal``); ``skipped`` collects
    why, per framework, for the plan to say."""

    out = []
    for fw in runners:
        why = refusal(fw.name, par)
        if why is None:
            out.append(fw)
        else:
            key = f"not offered for {fw.title}: {why}"
            skipped[key] = skipped.get(key, 0) + 1
    return tuple(out)
