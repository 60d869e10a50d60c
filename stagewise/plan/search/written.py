"""A plan from a measured profile written down: what went in, what it assumed, what came out, and which
stagewise made it (``-o plan.md`` / ``.json``). The format is shared with ``cluster.written``."""

from __future__ import annotations

import json
from dataclasses import asdict

#: the format of a written plan, read by people and scripts
FORMAT = "stagewise-plan"
VERSION = 1


def local_plan(*, argv: list[str], profile, cluster, result: dict, top: int) -> dict:
    """A plan from a measured profile as a dict: the command, the profile as read, the devices, the result."""
    from ... import __version__

    return {"format": FORMAT, "version": VERSION, "stagewise": __version__, "command": argv,
            "inputs": {"profile": {"model": profile.model, "device": profile.device,
                                   "micro_batch_sizes": profile.micro_batch_sizes, "layers": len(profile.layers),
                                   "meta": profile.meta},
                       "devices": cluster.devices, "per_node": cluster.per_node, "memory": cluster.memory,
                       "intra": asdict(cluster.intra), "inter": asdict(cluster.inter),
                       "state_factor": cluster.state_factor},
            "assumptions": {"band": "the profile's measured spread of each layer's F + B, weighted by its time"
                            if result["best"]["band"] is not None else "none: the profile records no spread",
                            "overhead": "the profile's measured per-step overhead, if it has one",
                            "lengths": _lengths_words(result.get("lengths"))},
            **{k: v for k, v in result.items() if k != "ranking"}, "ranking": result["ranking"][:top]}


def local_markdown(plan: dict, table: str) -> str:
    """``local_plan`` as a Markdown document."""
    inp = plan["inputs"]
    return "\n".join([
        f"# Plan: {inp['profile']['model']} on {inp['devices']} x {inp['profile']['device']}", "",
        f"Made by stagewise {plan['stagewise']} (`{' '.join(plan['command'])}`).", "",
        "## Result", "", "```", table, "```", "", plan["why"], "", "Run it:", "", "```", plan["train"], "```", "",
        "## Inputs", "", "```json", json.dumps(inp, indent=1, default=str), "```", "",
        "## Assumptions", "", f"- Error band: {plan['assumptions']['band']}.",
        f"- Overhead: {plan['assumptions']['overhead']}.",
        f"- Lengths: {plan['assumptions'].get('lengths') or _lengths_words(None)}.", ""])


def _lengths_words(got: dict | None) -> str:
    """What the plan's micro-batches hold (``plan --lengths``: a distribution, ``lengths.Distribution.to_dict``)."""
    if not got:
        return "every micro-batch at the profile's sequence length"
    return (f"each step over its micro-batches drawn from {got['samples']} sample lengths {got['min']}..{got['max']} "
            f"(mean {got['mean']:.4g}), the profile's times at {got['reference_length']:.4g} tokens, attention "
            f"share {got['attention_share']:g}")
