"""The HTML report: self-contained, the right numbers, and what headless Chromium shows."""

import re
import shutil
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pytest
from render_helpers import families, sim

from stagewise.costs import Costs
from stagewise.render import palette
from stagewise.render.html import report_html
from stagewise.report import result

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


class Tables(HTMLParser):
    """Text of every cell of every table, by table id."""

    def __init__(self):
        super().__init__()
        self.tables, self.current, self.row, self.cell = {}, None, None, None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.current = self.tables.setdefault(dict(attrs).get("id"), [])
        elif tag == "tr" and self.current is not None:
            self.row = []
            self.current.append(self.row)
        elif tag in ("td", "th") and self.row is not None:
            self.cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.row.append(self.cell.strip())
            self.cell = None
        elif tag == "table":
            self.current = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data


def entries(p=4, m=8, costs=Costs()):
    out = []
    for name in families(p, m):
        tl = sim(name, p, m, t_f=costs.t_f, t_b=costs.t_b)
        out.append((result(tl.schedule, costs, tl), tl))
    return out


def expected_row(r):
    formula = r["formula_bubble_fraction"]
    return [r["schedule"], str(r["ranks"]), str(r["microbatches"]), str(r["chunks"]), f"{r['makespan']:.4g}",
            f"{r['bubble_fraction']:.1%}", "-" if formula is None else f"{formula:.1%}",
            f"{max(r['peak_activations']):g}", " ".join(f"{x:g}" for x in r["peak_activations"]),
            f"{max(r['parameter_copies']):g}"]


def test_page_is_self_contained_and_holds_every_figure():
    es = entries()
    page = report_html(es, Costs())
    for needle in ("http:", "https:", "<script", "<link", "url(", "@import", "<img"):
        assert needle not in page.lower(), needle
    assert page.count("<svg") == len(es) + 1  # one per schedule and the comparison
    for res, tl in es:
        fig = re.search(rf'<figure id="fig-{re.escape(res["schedule"])}">(.*?)</figure>', page, re.S)[1]
        assert fig.count('<rect class="a ') == sum(len(op) if op.kind == "F&B" else 1
                                                   for prog in tl.schedule.programs for op in prog)


def test_tables_hold_the_results_and_the_costs():
    costs = Costs(t_f=1.0, t_b=3.0, latency=0.5)
    es = entries(4, 8, costs)
    parser = Tables()
    parser.feed(report_html(es, costs))
    rows = parser.tables["summary"]
    assert rows[1:] == [expected_row(r) for r, _ in es]
    cost_rows = {row[0]: row[1] for row in parser.tables["costs"][1:]}
    assert cost_rows["t_b"] == "3" and cost_rows["latency"] == "0.5" and cost_rows["t_i"] == "default t_b / 2"


def test_the_summary_shows_exposed_and_hidden_all_to_all_when_there_is_any():
    from stagewise.simulate import simulate
    from stagewise.schedules import generate

    costs = Costs(a2a=0.5)
    es = [(result(tl.schedule, costs, tl), tl) for tl in (simulate(generate(n, 2, 4), costs) for n in
                                                           ("1f1b", "dualpipe"))]
    parser = Tables()
    parser.feed(report_html(es, costs))
    rows = parser.tables["summary"]
    assert rows[0][-2:] == ["exposed all-to-all (max per rank)", "all-to-all hidden"]
    assert [r[-2:] for r in rows[1:]] == [["4", "0%"], ["3", "25%"]]  # tests/test_all_to_all.py's hand counts
    assert {r[0]: r[1] for r in parser.tables["costs"][1:]}["a2a"] == "0.5"
    assert "exposed all-to-all" not in report_html(entries(2, 4), Costs())


def _browser():
    if not (Path(CHROMIUM).exists() and Path(DRIVER).exists()):
        pytest.skip(f"headless Chromium not installed ({CHROMIUM}, {DRIVER}): apt-get install chromium chromium-driver")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"):
        opts.add_argument(arg)
    profile = tempfile.mkdtemp(prefix="stagewise-chromium-")
    opts.add_argument(f"--user-data-dir={profile}")
    opts.binary_location = CHROMIUM
    return webdriver.Chrome(service=Service(DRIVER), options=opts), profile


@pytest.mark.slow
@pytest.mark.browser
def test_chromium_shows_the_table_and_the_pictures(tmp_path):
    es = entries()
    path = tmp_path / "report.html"
    path.write_text(report_html(es, Costs()), encoding="utf-8")
    driver, profile = _browser()
    try:
        driver.set_window_size(1400, 1000)
        driver.get(path.as_uri())
        from selenium.webdriver.common.by import By

        table = driver.find_element(By.ID, "summary")
        shown = [[td.text for td in tr.find_elements(By.TAG_NAME, "td")]
                 for tr in table.find_elements(By.CSS_SELECTOR, "tbody tr")]
        assert shown == [expected_row(r) for r, _ in es]
        assert table.is_displayed() and table.size["width"] > 600
        svg = driver.find_element(By.CSS_SELECTOR, "#compare svg")
        assert svg.size["width"] > 600 and svg.size["height"] > 300
        driver.execute_script("document.getElementById('compare').scrollIntoView()")
        shot = tmp_path / "shot.png"
        driver.save_screenshot(str(shot))
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
    np = pytest.importorskip("numpy")
    imread = pytest.importorskip("matplotlib.image").imread

    img = (imread(shot)[..., :3] * 255).round().astype(int)

    def area(colour):
        return int((np.abs(img - np.array(palette.rgb(colour))).max(-1) <= 6).sum())

    assert area(palette.colour("F")) > 5000 and area(palette.colour("B")) > 5000  # the figures really drew
