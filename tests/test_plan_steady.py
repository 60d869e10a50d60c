"""Long steps costed from two shorter ones (plan/steady.py): the estimate against the full simulation."""

import pytest

from stagewise.costs import Costs
from stagewise.plan.search import timing
from stagewise.plan.cluster import extend, short_m
from stagewise.schedules import FAMILIES, generate
from stagewise.simulate import simulate


def _uneven(stages: int) -> Costs:
    """A heavier first and last stage, uneven blocks, links that cost."""
    return Costs(t_f=[1.0 + 0.4 * (k == 0) + 0.1 * (k % 3) for k in range(stages)],
                 t_b=[2.1 + 0.3 * (k == stages - 1) for k in range(stages)], latency=0.05, bandwidth=1.0,
                 boundary_bytes=0.1)


def _span_busy(family: str, p: int, m: int, v: int, costs: Costs) -> tuple[float, float]:
    sched = generate(family, p, m, v)
    span, bubble = timing(simulate(sched, costs, check=False))
    return span, (1 - bubble) * sched.ranks * span


@pytest.mark.parametrize("family", [f for f in FAMILIES if f not in ("gpipe", "looped-bfs")])
def test_a_long_step_is_its_short_steps_extended(family):
    """GPipe and looped BFS hold more with every micro-batch and are built at full length (the search checks
    the holdings); every other family repeats itself past its warm-up."""
    v = (FAMILIES[family].chunks or (2,))[0]
    for p in (2, 4):
        mc = short_m(family, p, 10**6, v)
        m = 2 * mc + 3 * p + (0 if FAMILIES[family].chunks is None or FAMILIES[family].even_microbatches else 1)
        costs = _uneven(p * v)
        est, busy = extend(_span_busy(family, p, mc, v, costs), _span_busy(family, p, 2 * mc, v, costs), mc, m)
        span, real_busy = _span_busy(family, p, m, v, costs)
        assert est == pytest.approx(span, rel=0.02)  # exact for most; ZB-H2 and interleaved within 1%
        assert busy == pytest.approx(real_busy, rel=0.02)


@pytest.mark.parametrize("family", [f for f in FAMILIES if f not in ("gpipe", "looped-bfs")])
def test_the_stand_in_scaled_to_m_bounds_the_long_step(family):
    """The search prunes a long step by its stand-in's pipeline bound at m: no schedule of m beats it (the
    search keeps the extension at or above it, which only brings ZB-H2's drifting estimate nearer)."""
    from stagewise.plan.cluster import pipeline_bound

    v = (FAMILIES[family].chunks or (2,))[0]
    split = FAMILIES[family].split_backward
    for p in (2, 4):
        mc = short_m(family, p, 10**6, v)
        m = 2 * mc + 3 * p + (0 if FAMILIES[family].chunks is None or FAMILIES[family].even_microbatches else 1)
        costs = _uneven(p * v)
        stand_in = generate(family, p, 2 * mc, v)
        bound = pipeline_bound(stand_in, costs.resolve(stand_in.stages), split, m)
        span, _ = _span_busy(family, p, m, v, costs)
        assert 0 < bound <= span + 1e-9
        assert bound == pipeline_bound(generate(family, p, m, v), costs.resolve(stand_in.stages), split)


def test_short_steps_are_built_in_full():
    assert short_m("1f1b", 4, 32, 1) is None  # not long: 2 mc = 32 micro-batches at p = 4
    assert short_m("interleaved-1f1b", 4, 66, 2) is None  # not whole rounds of p (interleaved's shape)
    assert short_m("1f1b", 4, 33, 1) == 16
    assert short_m("1f1b", 4, 36, 1) == 16 and short_m("1f1b", 16, 160, 1) == 32
    assert short_m("interleaved-1f1b", 8, 1024, 4) == 64 and short_m("dualpipe", 4, 1000, 2) == 16


def test_the_cluster_search_extends_long_steps_and_writes_the_full_schedule(tmp_path, capsys):
    """16M tokens of a 1.7B model on 8 GPUs: m in the thousands, costed from short steps; the CSV holds all m."""
    import sys
    from pathlib import Path

    from stagewise import torch_csv

    sys.path.insert(0, str(Path(__file__).parent))
    from cli_helpers import run

    csv = tmp_path / "p.csv"
    rc, out, err = run(capsys, "plan", "--model", "gpt-1.7b", "--hardware", "a100", "--gpus", "8",
                       "--global-batch-tokens", "16M", "--schedules", "1f1b,zb-v", "--tensor", "8", "--framework",
                       "stagewise", "-o", str(csv), "--top", "2")
    assert rc == 0, err
    assert "long steps extended from shorter ones" in out
    sched = torch_csv.load(csv)
    m = int(out.split("pipeline ranks, ")[1].split(" micro-batches")[0])
    assert m > 64 and sched.microbatches == m
