"""Pure-Python SVG: one rect per action, placed to scale, tooltips, no matplotlib."""

import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
from hypothesis import given, strategies as st
from render_helpers import families, measured, sim

from stagewise.render import palette
from stagewise.render.svg import LEFT, RIGHT, compare_svg, timeline_svg

NS = "{http://www.w3.org/2000/svg}"
TIP = re.compile(r"(\d+)([FBIW])(\d+) stage (\d+) mb (\d+) (\S+)\.\.(\S+) (\S+)")


def action_rects(svg: str):
    root = ET.fromstring(svg)
    return [r for r in root.iter(f"{NS}rect") if r.get("class", "").startswith("a ")]


@pytest.mark.parametrize("name", families(4, 8))
def test_one_rect_per_action_with_its_tooltip(name):
    tl = sim(name, 4, 8)
    rects = action_rects(timeline_svg(tl, memory=True))
    acts = sorted(str(a) for a in tl.schedule.actions())
    tips = [TIP.fullmatch(r.find(f"{NS}title").text) for r in rects]
    assert sorted(m[1] + m[2] + m[3] for m in tips) == acts
    for r, m in zip(rects, tips):
        assert r.get("class").split()[1] == m[2]  # class names the kind
        assert int(m[1]) == int(m[4]) and int(m[3]) == int(m[5])


@given(p=st.integers(1, 6), m=st.integers(1, 12), tb=st.sampled_from([1.0, 2.0, 3.5]),
       width=st.integers(400, 1600))
def test_rects_are_drawn_to_scale(p, m, tb, width):
    """x and width of every rect are its start and duration on one linear axis."""
    tl = sim("1f1b", p, m, t_b=tb)
    makespan = max(max(e) for e in tl.ends)
    scale = (width - LEFT - RIGHT) / makespan
    starts = {str(op): s for r in range(p) for op, s, _ in tl.rows(r)}
    ends = {str(op): e for r in range(p) for op, _, e in tl.rows(r)}
    for rect in action_rects(timeline_svg(tl, width=width)):
        tip = TIP.fullmatch(rect.find(f"{NS}title").text)
        name = tip[1] + tip[2] + tip[3]
        assert float(rect.get("x")) == pytest.approx(LEFT + starts[name] * scale, abs=0.01)
        assert float(rect.get("width")) == pytest.approx((ends[name] - starts[name]) * scale, abs=0.01)
        assert rect.get("fill") == palette.colour(tip[2])


def test_pair_is_one_cell_of_two_halves():
    names = families(4, 8)
    if "dualpipe" not in names:
        pytest.skip("dualpipe is not built yet")
    svg = timeline_svg(sim("dualpipe", 4, 8))
    rects = action_rects(svg)
    halves = [r for r in rects if r.get("height") == "11"]
    n_pairs = sum(1 for prog in sim("dualpipe", 4, 8).schedule.programs for op in prog if op.kind == "F&B")
    assert n_pairs > 0 and len(halves) == 2 * n_pairs
    assert svg.count('class="pairs"') == 1


def test_labels_and_title():
    svg = timeline_svg(sim("gpipe", 2, 3), title="my <title>")
    assert "my &lt;title&gt;" in svg
    root = ET.fromstring(svg)
    labels = [t.text for g in root.iter(f"{NS}g") if g.get("class") == "mb" for t in g]
    assert sorted(labels) == sorted(["0", "1", "2"] * 4)  # every cell is wide enough at p=2, m=3


def test_measured_timeline_starts_at_zero_in_its_unit():
    tl = measured(sim("1f1b", 2, 2))
    tips = [TIP.fullmatch(r.find(f"{NS}title").text) for r in action_rects(timeline_svg(tl))]
    assert min(float(m[6]) for m in tips) == 0.0 and {m[8] for m in tips} == {"s"}


def test_compare_stacks_every_timeline_on_one_axis():
    tls = [sim(n, 4, 8) for n in families(4, 8)[:4]]
    svg = compare_svg(tls, width=1000)
    rects = action_rects(svg)
    assert len(rects) == sum(tl.schedule.num_actions + _pairs(tl) for tl in tls)
    span = max(max(max(e) for e in tl.ends) for tl in tls)
    right = max(float(r.get("x")) + float(r.get("width")) for r in rects)
    assert right == pytest.approx(LEFT + span * (1000 - LEFT - RIGHT) / span, abs=0.05)
    for tl in tls:
        assert f">{tl.schedule.name}<" in svg


def _pairs(tl):
    return sum(1 for prog in tl.schedule.programs for op in prog if op.kind == "F&B")


def test_svg_needs_no_matplotlib():
    code = ("import sys; import stagewise.render.svg, stagewise.render.ascii, stagewise.render.trace, "
            "stagewise.render.html; assert 'matplotlib' not in sys.modules, 'matplotlib imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def _widths(svg: str, cls: str) -> list[float]:
    root = ET.fromstring(svg)
    return [float(r.get("width")) for r in root.iter(f"{NS}rect") if r.get("class") == cls]


@pytest.mark.parametrize("name, a2a", [("1f1b", 0.5), ("dualpipe-v", 0.5), ("dualpipe", 2.0)])
def test_the_all_to_all_lane_is_drawn_to_scale_hidden_pale_exposed_dark_and_hatched(name, a2a):
    from stagewise.timeline import metrics

    tl = sim(name, 4, 8, a2a=a2a)
    mt = metrics(tl)
    width = 1200
    svg = timeline_svg(tl, width=width)
    scale = (width - LEFT - RIGHT) / mt.makespan
    assert sum(_widths(svg, "exp")) / scale == pytest.approx(sum(mt.exposed_a2a), rel=1e-3)
    assert sum(_widths(svg, "hid")) / scale == pytest.approx(sum(mt.hidden_a2a), rel=1e-3, abs=1e-6)
    assert sum(_widths(svg, "exposed")) / scale == pytest.approx(sum(mt.exposed_a2a), rel=1e-3)  # the hatch
    assert 'id="a2a-hatch"' in svg and "exposed all-to-all inside its op" in svg
    assert "a2a" not in timeline_svg(sim(name, 4, 8))  # no all-to-all, no lane


def test_the_comparison_table_shows_exposed_all_to_all():
    svg = compare_svg([sim("1f1b", 4, 8, a2a=0.5), sim("dualpipe", 4, 8, a2a=0.5)])
    assert ">exposed a2a</text>" in svg and ">8</text>" in svg  # 1F1B exposes all 16 x 0.5 on rank 0


def test_a_lowered_timeline_draws_its_communication_lane():
    from stagewise.costs import Costs
    from stagewise.lowering import Communication, LoweringOptions, Network, Sizes
    from stagewise.parallelism import Parallelism
    from stagewise.render import palette
    from stagewise.render.svg import timeline_svg
    from stagewise.schedules import generate
    from stagewise.simulate import simulate

    comm = Communication(parallelism=Parallelism(fsdp=2), options=LoweringOptions(
        sizes=Sizes(params=8.0), network=Network(intra_bandwidth=1.0), step_end=False))
    svg = timeline_svg(simulate(generate("1f1b", 2, 4), Costs(comm=comm)))
    assert "<title>the all-gather of stage 0 over fsdp 0..4 t_f; exposed 4</title>" in svg
    assert f'fill="{palette.COMM}"' in svg and "communication: hidden behind compute" in svg
