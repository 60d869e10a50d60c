"""One self-contained HTML page: every schedule's figure, the numbers, the assumptions.

No network and no scripts: inline SVG pictures (``svg.py``), inline CSS, so
the file can be mailed or archived and opens the same anywhere.
"""

from __future__ import annotations

from dataclasses import fields
from html import escape
from typing import Sequence

from ..costs import Costs
from ..timeline import Timeline
from . import palette
from .svg import compare_svg, timeline_svg

CSS = f"""
body {{ font-family: DejaVu Sans, Helvetica, Arial, sans-serif; color: {palette.INK}; margin: 24px; }}
h1 {{ font-size: 22px; margin-bottom: 4px; }}
h2 {{ font-size: 17px; margin: 28px 0 6px; }}
p.note {{ color: {palette.MUTED}; margin-top: 0; }}
table {{ border-collapse: collapse; margin: 8px 0 16px; font-size: 14px; }}
th, td {{ padding: 4px 10px; border-bottom: 1px solid {palette.RULE}; text-align: right; }}
th:first-child, td:first-child, td.meaning {{ text-align: left; }}
td.meaning {{ color: {palette.MUTED}; }}
thead th {{ border-bottom: 2px solid {palette.RULE_STRONG}; }}
.grid {{ display: grid; grid-template-columns: repeat(auto-fit, minmax(760px, 1fr)); gap: 8px 24px; }}
figure {{ margin: 0; }}
svg.stagewise {{ max-width: 100%; height: auto; }}
"""

#: (header, result key or function of the result, format) of the summary table
COLUMNS = (
    ("schedule", "schedule", "{}"),
    ("p", "ranks", "{}"),
    ("m", "microbatches", "{}"),
    ("v", "chunks", "{}"),
    ("makespan", "makespan", "{:.4g}"),
    ("bubble (simulated)", "bubble_fraction", "{:.1%}"),
    ("bubble (closed form)", "formula_bubble_fraction", "{:.1%}"),
    ("peak activations (max)", lambda r: max(r["peak_activations"]), "{:g}"),
    ("peak activations per rank", lambda r: " ".join(f"{x:g}" for x in r["peak_activations"]), "{}"),
    ("parameter copies (max)", lambda r: max(r["parameter_copies"]), "{:g}"),
)


def report_html(results_with_timelines: Sequence[tuple[dict, Timeline]], costs: Costs, *,
                title: str | None = None, costs_per: str = "stage") -> str:
    """The page for ``(result, timeline)`` pairs (``report.result`` dicts) simulated under ``costs``.

    ``costs_per="rank"``: the costs are one rank's share of the model (each chunk of a
    v-chunk schedule costs and keeps 1/v of them), as ``--costs-per rank`` simulated them.
    """
    results = [r for r, _ in results_with_timelines]
    timelines = [tl for _, tl in results_with_timelines]
    head = results[0] if results else {"ranks": "?", "microbatches": "?"}
    title = title or f"Pipeline schedules at p={head['ranks']}, m={head['microbatches']}"
    unit = timelines[0].unit if timelines else "t_f"
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        f'<p class="note">{len(results)} schedules, {escape(timelines[0].source if timelines else "simulated")}; '
        f"times in {escape(unit)}; bubble = 1 - busy / (ranks x makespan); peak activations in "
        + ("one rank's share of the model's activations per micro-batch.</p>" if costs_per == "rank" else
           "chunk-units (one micro-batch's activations of one stage).</p>"),
        "<h2>Summary</h2>", _summary(results),
        "<h2>Cost assumptions</h2>",
        '<p class="note">' + ("Durations and activations below are one rank's share of the model (--costs-per "
                              "rank): a chunk of a v-chunk schedule costs and keeps 1/v of them, so every "
                              "family runs the same model." if costs_per == "rank" else
                              "Durations and activations below are per stage (--costs-per stage).") + "</p>",
        _costs(costs),
    ]
    if timelines:
        parts += ["<h2>All schedules on one time axis</h2>",
                  f'<figure id="compare">{compare_svg(timelines, width=1100, standalone=False)}</figure>',
                  "<h2>Each schedule</h2>", '<div class="grid">']
        for r, tl in results_with_timelines:
            parts.append(f'<figure id="fig-{escape(r["schedule"])}">'
                         f"{timeline_svg(tl, memory=True, standalone=False)}</figure>")
        parts.append("</div>")
    parts.append('<p class="note">Made by stagewise. Formulas: GPipe/1F1B (p-1)/(m+p-1); ZB-H1 (p-1)(F+B-2W) '
                 "idle per rank; DualPipe (PP/2-1)(F&amp;B+B-3W); blank where the literature has no closed "
                 "form for these costs.</p></body></html>")
    return "\n".join(parts) + "\n"


BYTES_COLUMN = ("peak activation bytes (max)", lambda r: max(r["peak_activation_bytes"]), "{:.4g}")
#: exposed all-to-all of the rank that exposes most, and the share of all all-to-all hidden behind compute
A2A_COLUMNS = (("exposed all-to-all (max per rank)", lambda r: max(r["exposed_a2a"]), "{:.4g}"),
               ("all-to-all hidden", lambda r: sum(r["hidden_a2a"]) / sum(r["a2a"]) if sum(r["a2a"]) else None,
                "{:.0%}"))


def _summary(results: Sequence[dict]) -> str:
    columns = COLUMNS + ((BYTES_COLUMN,) if any(r.get("peak_activation_bytes") for r in results) else ()) + \
        (A2A_COLUMNS if any(sum(r.get("a2a") or ()) for r in results) else ())
    rows = ["<table id=\"summary\"><thead><tr>" + "".join(f"<th>{escape(h)}</th>" for h, _, _ in columns)
            + "</tr></thead><tbody>"]
    for r in results:
        tds = []
        for _, key, fmt in columns:
            value = key(r) if callable(key) else r.get(key)
            text = "-" if value is None else fmt.format(value)
            tds.append(f"<td>{escape(text)}</td>")
        rows.append(f'<tr data-schedule="{escape(r["schedule"])}">' + "".join(tds) + "</tr>")
    rows.append("</tbody></table>")
    return "\n".join(rows)


#: what each field of the cost model means (the Costs field comments, for readers of the page)
MEANING = {
    "t_f": "forward time of one stage for one micro-batch",
    "t_b": "full backward (input + weight gradients)",
    "t_i": "input-gradient backward (split backward)",
    "t_w": "weight-gradient backward (split backward)",
    "t_fb": "an overlapped F&B pair, set by hand",
    "a2a": "expert-parallel all-to-all of one forward (dispatch + combine of the stage's MoE layers)",
    "a2a_b": "the same for a backward (B or I)",
    "latency": "fixed time of one message between ranks",
    "bandwidth": "bytes per time unit of a link",
    "boundary_bytes": "bytes of the activation a stage sends on (and of its gradient back)",
    "activation": "activations one stage keeps per micro-batch (chunk-units)",
    "activation_bytes": "the same in bytes",
    "free_at_i": "fraction of a stage's activations freed at I (the rest at W)",
    "recompute": "stages that keep only their input and redo F in B",
    "recompute_keep": "activation kept by a recomputed stage (chunk-units)",
    "mb_time": "a factor per micro-batch on its durations (its length: --lengths, --attention-share, --order)",
    "mb_activation": "a factor per micro-batch on its activations, messages and all-to-all (its tokens)",
}


def _costs(costs: Costs) -> str:
    """Every field of the cost model with its value (defaults spelled out) and meaning."""
    notes = {"t_i": "default t_b / 2", "t_w": "default t_b / 2",
             "t_fb": "derived: t_f + t_b, less the all-to-all the pair hides", "a2a_b": "default a2a",
             "bandwidth": "none: links are free", "activation_bytes": "not given",
             "mb_time": "none: every micro-batch alike", "mb_activation": "none: every micro-batch alike"}
    rows = ['<table id="costs"><thead><tr><th>cost</th><th>value</th><th>meaning</th></tr></thead><tbody>']
    for f in fields(costs):
        value = getattr(costs, f.name)
        if value is None:
            text = notes.get(f.name, "-")
        elif isinstance(value, (list, tuple)):
            each = " (per micro-batch)" if f.name.startswith("mb_") else " (per stage)"
            text = ", ".join(f"{x:g}" if isinstance(x, (int, float)) else str(x) for x in value) + each
        else:
            text = f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)
        rows.append(f"<tr><td>{escape(f.name)}</td><td>{escape(text)}</td>"
                    f'<td class="meaning">{escape(MEANING.get(f.name, ""))}</td></tr>')
    rows.append("</tbody></table>")
    return "\n".join(rows)
