"""DualPipe and DualPipeV against 1F1B, interleaved 1F1B, ZB-H1 and ZB-V across the ratio of expert-parallel
all-to-all to compute (simulated).

Each family runs the same model (``--costs-per rank``: t_f = 1, t_b = 2, t_i = t_w = 1 for one rank's share,
a chunk of a v-chunk schedule 1/v of it), and every forward pays an all-to-all of r x t_f (dispatch +
combine); a backward pays as much again (the same tokens go back along the same routes, so its ratio to its
own compute is r / 2). A plain F, B or I pays its all-to-all after its compute; an F&B pair hides one half's
behind the other's compute (``stagewise.all_to_all``). r runs from 0 to 2.

Checked against the sources (printed at the end): at r = 0 the simulated idle time of 1F1B, ZB-H1 and
DualPipe/DualPipeV is the DualPipe README's table, (PP-1)(F+B), (PP-1)(F+B-2W) and (PP/2-1)(F&B+B-3W);
and at the DeepSeek-V3 report's 1:1 ratio (section 3.2.1: "both all-to-all and PP communication can be fully
hidden") an F&B pair hides all of its all-to-all.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_moe_ratio.py [-p 8] [-m 32] [-o docs/img/moe-a2a-ratio.png]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from stagewise.actions import Pair
from stagewise.compare import compare
from stagewise.costs import Costs, rank_share_weights, scaled
from stagewise.formulas import idle_per_rank
from stagewise.timeline import metrics

FAMILIES = ("1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipe", "dualpipe-v")
DUAL = ("dualpipe", "dualpipe-v")
RATIOS = [round(0.1 * k, 1) for k in range(21)]
SHOWN = (0.0, 0.5, 1.0, 1.5, 2.0)


def run(p: int, m: int, r: float) -> dict[str, dict]:
    """Per family: the JSON result (``report.result``) and the timeline, at ratio ``r``."""
    base = Costs(t_f=1.0, t_b=2.0, a2a=r)
    out = {}
    for e in compare(FAMILIES, p, m, None, lambda s: scaled(base, rank_share_weights(s))):
        out[e.result["schedule"]] = {**e.result, "timeline": e.timeline}
    return out


def table(p: int, m: int, sweep: dict[float, dict]) -> str:
    head = f"{'r':>4} " + "".join(f"{n:>17}" for n in FAMILIES) + "   speed-up of the better DualPipe*"
    lines = [f"makespan (one rank's share: t_f = 1, t_b = 2), p={p} m={m}; exposed all-to-all share in brackets",
             head, "-" * len(head)]
    for r in SHOWN:
        res = sweep[r]
        cells = "".join(f"{res[n]['makespan']:>10.1f} ({res[n]['exposed_a2a_fraction']:>3.0%})" for n in FAMILIES)
        dual = min(res[n]["makespan"] for n in DUAL)
        other = min((res[n]["makespan"], n) for n in FAMILIES if n not in DUAL)
        lines.append(f"{r:>4} {cells}   {other[0] / dual:.3f}x over {other[1]}")
    return "\n".join(lines)


def checks(p: int, m: int, sweep: dict[float, dict]) -> list[str]:
    """The README's idle times at r = 0, and the pairs' hidden share at 1:1."""
    out = []
    for name in ("1f1b", "zb-h1", *DUAL):
        res = sweep[0.0][name]
        tl = res["timeline"]
        costs = tl.meta["costs"]
        form = idle_per_rank(name, p, m, res["chunks"], costs)
        sim = max(metrics(tl).idle)
        out.append(f"r=0 {name:<11} idle per rank: simulated {sim:g}, DualPipe README's form {form:g}"
                   + ("" if form is not None and abs(form - sim) < 1e-9 else "  MISMATCH"))
    for name in DUAL:
        tl = sweep[1.0][name]["timeline"]
        paired = [c for r, lane in enumerate(tl.comm) for c in lane if type(tl.schedule.programs[r][c.op]) is Pair]
        hidden = 1 - sum(c.exposed for c in paired) / sum(c.end - c.start for c in paired)
        res = sweep[1.0][name]
        whole = sum(res["hidden_a2a"]) / sum(res["a2a"])
        out.append(f"r=1 {name:<11} F&B pairs hide {hidden:.0%} of their all-to-all (DeepSeek-V3: fully hidden); "
                   f"with the plain warm-up and cool-down ops, {whole:.0%} of all")
    return out


def figure(p: int, m: int, sweep: dict[float, dict], path: Path) -> None:
    from matplotlib.figure import Figure

    from stagewise.render import palette

    fig = Figure(figsize=(11, 4.2))
    left, right = fig.subplots(1, 2)
    colours = dict(zip(FAMILIES, palette.RANK_COLOURS))
    for n in FAMILIES:
        style = dict(color=colours[n], linewidth={"dualpipe": 3.0, "dualpipe-v": 1.6}.get(n, 1.4),
                     linestyle={"dualpipe": "-", "dualpipe-v": (0, (1, 1))}.get(n, "--"), label=n)
        left.plot(RATIOS, [sweep[r][n]["makespan"] / sweep[0.0]["1f1b"]["makespan"] for r in RATIOS], **style)
        right.plot(RATIOS, [sweep[r][n]["exposed_a2a_fraction"] for r in RATIOS], **style)
    left.set(xlabel="all-to-all / forward compute (r)", ylabel="step time / 1F1B's at r = 0",
             title="step time (simulated)")
    right.set(xlabel="all-to-all / forward compute (r)", ylabel="exposed all-to-all / (ranks x step)",
              title="all-to-all the ranks wait for")
    right.yaxis.set_major_formatter(lambda x, _: f"{x:.0%}")
    for ax in (left, right):
        ax.axvline(1.0, color="#999", linewidth=0.8, linestyle=":")
        ax.grid(color=palette.GRID, linewidth=0.5)
    left.text(1.02, left.get_ylim()[0], " DeepSeek-V3: about 1:1", fontsize=8, color="#555", va="bottom")
    left.legend(fontsize=8, frameon=False)
    fig.suptitle(f"p={p} ranks, m={m} micro-batches, the same model (t_f = 1, t_b = 2 a rank's share); "
                 "a backward's all-to-all = the forward's", fontsize=9.5)
    fig.tight_layout()
    fig.savefig(path, dpi=130)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-p", "--ranks", type=int, default=8)
    ap.add_argument("-m", "--microbatches", type=int, default=32)
    ap.add_argument("-o", "--output", default="docs/img/moe-a2a-ratio.png", help="the figure (PNG)")
    args = ap.parse_args()
    p, m = args.ranks, args.microbatches
    sweep = {r: run(p, m, r) for r in RATIOS}
    print(table(p, m, sweep))
    wins = [r for r in RATIOS if min(sweep[r][n]["makespan"] for n in DUAL)
            < min(sweep[r][n]["makespan"] for n in FAMILIES if n not in DUAL)]
    print(f"\nDualPipe or DualPipeV fastest at r in [{wins[0]}, {wins[-1]}]" if wins else
          "\nDualPipe and DualPipeV never fastest")
    print("\n".join(["", *checks(p, m, sweep)]))
    try:
        figure(p, m, sweep, Path(args.output))
        print(f"\nwrote {args.output}")
    except ModuleNotFoundError:
        print("\nmatplotlib is not installed: no figure")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
