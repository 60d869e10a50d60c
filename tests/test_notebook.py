"""Jupyter display: timelines, schedules and comparisons render themselves, lazily."""

import dataclasses
import re
import subprocess
import sys

from stagewise import Action, Costs, generate, simulate
from stagewise.notebook import Comparison, compare
from stagewise.render import palette
from stagewise.schedule import make


def cells_in(svg: str) -> int:
    return len(re.findall(r'<rect class="a [FBIW] c\d+"', svg))


def test_timeline_shows_the_page_row_over_its_picture():
    tl = simulate(generate("1f1b", 4, 8))
    html = tl._repr_html_()
    row = re.search(r"<tr><td>1f1b</td>.*?</tr>", html).group(0)
    assert re.findall(r"<td[^>]*>([^<]*)</td>", row) == ["1f1b", "4", "8", "1", "33", "27.3%", "27.3%", "4 3 2 1"]
    assert "<svg" in html and cells_in(html) == 64 and "live activations per rank" in html
    assert palette.colour("F") in html and palette.colour("B") in html  # the page's colours
    svg = tl._repr_svg_()
    assert svg.startswith('<svg xmlns="http://www.w3.org/2000/svg"') and cells_in(svg) == 64


def test_measured_timelines_have_no_closed_form():
    tl = dataclasses.replace(simulate(generate("gpipe", 2, 2)), source="measured", unit="s", meta={})
    row = re.search(r"<tr><td>gpipe</td>.*?</tr>", tl._repr_html_()).group(0)
    assert re.findall(r"<td[^>]*>([^<]*)</td>", row)[6] == "\u2014"


def test_schedule_displays_simulated_at_seed_costs():
    sched = generate("zb-h1", 4, 8) if "zb-h1" in _families() else generate("1f1b", 4, 8)
    html = sched._repr_html_()
    assert "simulated with t_F = 1, t_B = 2" in html and cells_in(html) == len(list(sched.actions()))
    assert cells_in(sched._repr_svg_()) == len(list(sched.actions()))


def test_an_invalid_schedule_says_why_instead_of_raising():
    bad = make("backwards", [[Action("B", 0, 0), Action("F", 0, 0)]], [0], 1)
    html = bad._repr_html_()
    assert "backwards: invalid schedule: deadlock" in html and "<svg" not in html
    assert bad._repr_svg_() is None  # Jupyter falls back to the text form


def test_comparison_shares_one_axis_and_one_table():
    cmp = compare(["gpipe", "1f1b"], 4, 8, costs=Costs(t_b=3.0))
    assert isinstance(cmp, Comparison) and [tl.schedule.name for tl in cmp] == ["gpipe", "1f1b"]
    html = cmp._repr_html_()
    assert html.count("<td>27.3%</td>") == 2 and html.count('<td class="bubble">27.3%</td>') == 2
    assert cells_in(html) == 2 * 64 and "one time axis" in cmp._repr_svg_()


def test_display_stays_out_of_the_core_until_asked():
    code = ("import sys, stagewise\n"
            "assert 'stagewise.notebook' not in sys.modules and 'stagewise.render' not in sys.modules\n"
            "tl = stagewise.simulate(stagewise.generate('1f1b', 2, 2))\n"
            "tl._repr_html_(); tl.schedule._repr_svg_()\n"
            "print(sorted(m for m in ('matplotlib', 'torch', 'IPython', 'numpy') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def _families():
    from stagewise.workshop.api import available

    return available()
