"""`auto` against the Zero Bubble paper's Table 5: bubble rates under ZB-1p's and ZB-2p's memory limits.

Source: Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024 (arXiv:2401.10241), Table 5 (bubble rates
of ZB-1p and ZB-2p) and Table 9 (profiled T_F, T_B, T_W, T_comm, microseconds, on 8/16/32 A100s). The
numbers are as the authors' script prints them: sail-sg/zero-bubble-pipeline-parallelism,
megatron/core/pipeline_parallel/efficiency.py at commit f68d387 ("for arxiv paper"), ``iclr_bubble_rates``
(settings and the table in its closing docstring). Model shapes: h, a, layers as there, s = 1024.

The paper's model: F allocates M_B = 34h + 5as per token, I frees all but M_W = 32h, W the rest; ZB-1p's
limit is p M_B per rank, ZB-2p's 2p M_B; T_comm is paid per hop; bubble rate = (cost - m(T_F + T_B + T_W))
/ cost, cost = the longest stage's span (first F start to last W end; the optimizer step is validated
after the fact, so ranks need not end together): `auto --objective span`. The published rates are rounded
to 4 decimals; ours is compared rounded the same way.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_zb_table5.py [--time-limit 20] [--rows 0,1,...]
"""

from __future__ import annotations

import argparse
import time
from typing import NamedTuple

from stagewise.costs import Costs
from stagewise.plan.auto import auto_schedule
from stagewise.simulate import simulate
from stagewise.timeline import metrics
from stagewise.validate import validate


class Row(NamedTuple):
    model: str
    p: int
    m: int
    t_f: int  #: microseconds (Table 9)
    t_b: int  #: the input-gradient pass, B in the paper (our I)
    t_w: int
    t_comm: int
    hidden: int
    heads: int
    zb_1p: float  #: published bubble rate (Table 5)
    zb_2p: float


ROWS = [
    Row("1.5B", 8, 24, 18522, 18086, 9337, 601, 2304, 24, 0.1585, 0.0433),
    Row("1.5B", 8, 32, 18513, 18086, 9331, 626, 2304, 24, 0.1242, 0.0039),
    Row("1.5B", 8, 64, 18546, 18097, 9321, 762, 2304, 24, 0.0674, 0.0026),
    Row("6.2B", 8, 24, 29718, 29444, 19927, 527, 4096, 32, 0.1323, 0.0029),
    Row("6.2B", 8, 32, 29802, 29428, 19530, 577, 4096, 32, 0.1045, 0.0022),
    Row("6.2B", 8, 64, 29935, 29621, 19388, 535, 4096, 32, 0.0554, 0.0010),
    Row("14.6B", 16, 48, 11347, 11248, 8132, 377, 5120, 40, 0.1397, 0.0066),
    Row("14.6B", 16, 64, 11307, 11254, 8101, 379, 5120, 40, 0.1088, 0.0054),
    Row("14.6B", 16, 128, 11325, 11308, 8109, 378, 5120, 40, 0.0576, 0.0028),
    Row("28.3B", 32, 96, 10419, 10207, 7715, 408, 6144, 48, 0.1421, 0.0038),
    Row("28.3B", 32, 128, 10408, 10204, 7703, 408, 6144, 48, 0.1106, 0.0029),
    Row("28.3B", 32, 256, 10402, 10248, 7698, 460, 6144, 48, 0.0594, 0.0018),
]
SEQ = 1024


def costs_of(row: Row) -> Costs:
    m_b = 34 * row.hidden + 5 * row.heads * SEQ  # per token; the common factor s b does not matter
    m_w = 32 * row.hidden
    return Costs(t_f=row.t_f, t_b=row.t_b + row.t_w, t_i=row.t_b, t_w=row.t_w, latency=row.t_comm,
                 free_at_i=1 - m_w / m_b)


def bubble_rate(schedule, costs: Costs, row: Row) -> float:
    mt = metrics(simulate(schedule, costs))
    cost = max(b + s for b, s in zip(mt.busy, mt.span_idle))
    return (cost - row.m * (row.t_f + row.t_b + row.t_w)) / cost


def search(row: Row, limit_factor: int, time_limit: float) -> tuple[float, float, str]:
    """(bubble rate, seconds, source) of `auto` under limit_factor * p micro-batches' M_B per rank."""
    costs = costs_of(row)
    t0 = time.perf_counter()
    res = auto_schedule(row.p, row.m, costs, [limit_factor * row.p] * row.p, objective="span",
                        time_limit=time_limit)
    seconds = time.perf_counter() - t0
    validate(res.schedule)
    return bubble_rate(res.schedule, costs, row), seconds, res.source


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--time-limit", type=float, default=20.0, help="seconds per search (default 20)")
    ap.add_argument("--rows", default=None, help="comma-separated row indices (default: all)")
    args = ap.parse_args()
    rows = [ROWS[int(i)] for i in args.rows.split(",")] if args.rows else ROWS
    print(f"{'model':<6}{'p':>3}{'m':>5} | {'ZB-1p paper':>11}{'auto':>8}{'time':>7} | "
          f"{'ZB-2p paper':>11}{'auto':>8}{'time':>7}")
    print("-" * 75)
    misses = []
    for row in rows:
        cells = []
        for factor, published in ((1, row.zb_1p), (2, row.zb_2p)):
            ours, seconds, _ = search(row, factor, args.time_limit)
            ok = round(ours, 4) <= published and seconds < 30
            if not ok:
                misses.append(f"{row.model} m={row.m} ZB-{factor}p")
            cells.append(f"{published:>11.4f}{ours:>8.4f}{seconds:>6.1f}s" + (" " if ok else "*"))
        print(f"{row.model:<6}{row.p:>3}{row.m:>5} | {cells[0]}| {cells[1]}")
    print("\n* above the published rate or over 30 s" if misses else "\nevery row at or below the published rate, "
          "each search under 30 s")
    if misses:
        print("misses: " + "; ".join(misses))
    return 1 if misses else 0


if __name__ == "__main__":
    raise SystemExit(main())
