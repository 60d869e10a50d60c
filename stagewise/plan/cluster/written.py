"""A cluster plan written down: what went in, what it assumed, what came out, and which stagewise made it.

``cluster_plan`` gathers a cluster plan as one JSON-ready dict (the ``--json`` output and ``-o plan.json``): the
command line, the model and hardware as read (with the hardware's sources), the job's options, the assumptions
the numbers rest on (overlap rules of each framework, the memory reserve, the error band and where it comes
from), the ranking with bands and headroom, each framework's best with its command, why the winner wins and
what moves its step most. ``markdown`` renders the same dict for ``-o plan.md``, so a result can be checked and
reproduced from the file alone. The format is ``search.written``'s (local plans write the same).
"""

from __future__ import annotations

import json
from dataclasses import asdict

from ..search import FORMAT, VERSION


def cluster_plan(*, argv: list[str], job, res, commands: dict, why: str, rec, sensitivity: list[dict],
                 top: int, seconds: float, csv: str | None) -> dict:
    """The cluster plan as a dict (see the module doc)."""
    from ... import __version__
    from ..search import RULE
    from .frameworks import VERSIONS
    from .overlap_rules import FRAMEWORKS

    hw = job.hardware
    frameworks = {fw.name: {"title": fw.title, "families": fw.families, "sharding": fw.sharding,
                            **asdict(fw.overlap),
                            "reshard_after_forward": fw.reshard_after_forward,
                            "recompute": fw.recompute, "source": fw.source}
                  for fw in job.frameworks if fw.name in FRAMEWORKS}
    return {
        "format": FORMAT, "version": VERSION, "stagewise": __version__, "command": argv,
        "inputs": {
            "model": asdict(job.spec),
            "hardware": {k: v for k, v in asdict(hw).items() if k != "sources"} | {"sources": hw.sources},
            "gpus": job.gpus, "global_batch_tokens": job.global_batch_tokens, "global_batch": job.global_batch,
            "tensor": job.tensor, "pipeline": job.pipeline, "expert": job.expert,
            "micro_batch_sizes": job.micro_batch_sizes,
            "recompute": job.recompute, "sequence_parallel": job.sequence_parallel, "sharding": job.sharding,
            "hsdp_shards": job.hsdp_shards, "families": job.space.families, "chunks": job.space.chunks,
            "slices": job.slices, "offload": job.offload,
        },
        "assumptions": {
            "frameworks": frameworks,
            "memory_reserve": {**asdict(job.memory_reserve), "bytes": job.memory_reserve.bytes(hw.memory),
                               "usable": job.usable, "source": hw.sources.get("reserve", "")},
            "band": hw.band, "band_source": hw.sources.get("band", "no published row: the band is unknown"),
            "efficiency": hw.efficiency, "efficiency_source": hw.sources.get("efficiency", ""),
            "not_modelled": ["context parallelism", "FSDP of expert-parallel MoE models", "overlap of tensor-parallel "
                             "collectives with compute", "GEMM efficiency by matrix size (one factor per GPU)"],
        },
        "search": {"configurations": res.configurations, "simulated": res.simulated, "lowered": res.lowered,
                   "pruned": res.pruned,
                   "pruned_before_building": res.unbuilt, "dominated_by_less_recomputation": res.dominated,
                   "too_big": res.too_big, "seconds": seconds},
        "best": rec.row.to_dict(),
        "recommendation": {"rule": RULE, "rank": res.ranking.index(rec.row) + 1, "tied": rec.tied,
                           "decided_by": rec.decided_by, "tight": rec.tight,
                           "roomy_rank": res.ranking.index(rec.roomy) + 1 if rec.roomy is not None else None,
                           "headroom": rec.row.headroom, "reserve": job.memory_reserve.bytes(hw.memory)},
        "not_offered": res.not_offered,
        "tie": rec.tied, "why": why, "sensitivity": sensitivity, "csv": csv,
        "frameworks": {name: {"rank": res.ranking.index(c) + 1, "layout": c.to_dict(), "command": cmd,
                              "note": note or None, "version": VERSIONS.get(name)}
                       for name, (c, cmd, note) in commands.items()},
        "ranking": [c.to_dict() for c in res.ranking[:top]],
    }


def markdown(plan: dict, table: str) -> str:
    """``plan`` (``cluster_plan``) as a Markdown document; ``table`` is the ranked table as printed."""
    inp, asm = plan["inputs"], plan["assumptions"]
    hw, model = inp["hardware"], inp["model"]
    lines = [f"# Plan: {model['name']} on {inp['gpus']} x {hw['name']}", "",
             f"Made by stagewise {plan['stagewise']} (`{' '.join(plan['command'])}`).", "",
             "## Result", "", "```", table, "```", "", plan["why"], ""]
    if plan["sensitivity"]:
        lines += ["What moves the winner's step most:", ""]
        lines += [f"- {s['input']} {s['change']}: " + (f"{s['delta']:+.1%}" if s["delta"] is not None else
                                                       "does not fit") for s in plan["sensitivity"]]
        lines.append("")
    lines += ["Recommendation rule: " + plan["recommendation"]["rule"] + ".", ""]
    if plan["not_offered"]:
        lines += [f"- {why} ({n} layouts)" for why, n in plan["not_offered"].items()] + [""]
    lines += ["## Commands", ""]
    for name, fw in plan["frameworks"].items():
        lay = fw["layout"]
        lines += [f"**{asm['frameworks'].get(name, {}).get('title', name)}** ({fw['version']}; #{fw['rank']}: {lay['family']} "
                  f"t={lay['t']} p={lay['p']} dp={lay['dp']} v={lay['v']}, {lay['sharding']}):", ""]
        lines += ["```", fw["command"] or f"none: {fw['note']}", "```", ""]
        if fw["note"] and fw["command"]:
            lines += [fw["note"], ""]
    if plan["csv"]:
        lines += [f"The winner's schedule is in `{plan['csv']}` (torch's compute-only CSV).", ""]
    lines += ["## Inputs", "", "```json", json.dumps({k: v for k, v in inp.items() if k != "hardware"}, indent=1,
                                                       default=str), "```", "",
              "Hardware as read:", "", "```json", json.dumps(hw, indent=1, default=str), "```", "",
              "## Assumptions", "",
              f"- Memory: {asm['memory_reserve']['bytes'] / 2**30:.3g} GiB of each GPU reserved "
              f"({asm['memory_reserve']['source'] or 'as given'}); plans fit in "
              f"{asm['memory_reserve']['usable'] / 2**30:.3g} GiB.",
              "- Error band: " + (f"±{asm['band']:.1%} on every step ({asm['band_source']})." if asm["band"]
                                   is not None else "unknown (no published row for this GPU)."),
              f"- Matrix-multiply efficiency {asm['efficiency']:.4g} ({asm['efficiency_source']}).",
              "- Not modelled: " + ", ".join(asm["not_modelled"]) + ".", ""]
    lines += ["Overlap rules per framework:", ""]
    for name, fw in asm["frameworks"].items():
        lines.append(f"- {fw['title']}: gradients reduced by {fw['reduce']} (FSDP: {fw['fsdp_reduce']}), "
                     f"ZeRO-1 weights gathered at {fw['gather']} (FSDP: {fw['fsdp_gather']}; block by block "
                     f"without PP: {'yes' if fw['reshard_after_forward'] == 'default' else 'no'}), "
                     f"{'blocking' if fw['blocking_p2p'] else 'asynchronous'} P2P. {fw['source']}.")
    lines += ["", f"Search: {plan['search']['configurations']} configurations, {plan['search']['simulated']} "
                  f"simulated ({plan['search'].get('lowered', 0)} played as lowered programs), "
                  f"{plan['search']['pruned']} slower for sure, {plan['search']['too_big']} too big, in "
                  f"{plan['search']['seconds']:.1f} s.", ""]
    return "\n".join(lines)
