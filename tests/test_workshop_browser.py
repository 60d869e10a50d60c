"""The workshop page end to end, in a real headless Chromium driven by Selenium.

Each state is screenshotted (under pytest's tmp dir, or $STAGEWISE_SCREENSHOTS)
and checked by the text the page shows.
"""

import pytest
from workshop_helpers import browser, count, require_browser, server, set_value, shots, text, wait_for  # noqa: F401

from stagewise.workshop import api

require_browser()
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def bubble_of(browser, schedule):
    return text(browser, f'#summary tr[data-schedule="{schedule}"] td.bubble')


def drawn_cells(browser):
    return browser.execute_script("return document.querySelectorAll('#timeline [data-k]').length")


def test_bubble_redraw_and_error_in_a_real_browser(server, browser, shots):
    browser.get(server.url)
    wait_for(browser, lambda d: "1f1b" in text(d, "#status"))
    assert bubble_of(browser, "1f1b") == "27.3%"
    assert text(browser, '#summary tr[data-schedule="1f1b"] td.formula') == "27.3%"
    assert drawn_cells(browser) == 2 * 4 * 8
    browser.save_screenshot(str(shots / "1-1f1b-p4-m8.png"))

    set_value(browser, "p", "16")
    wait_for(browser, lambda d: bubble_of(d, "1f1b") == "65.2%")
    assert text(browser, '#summary tr[data-schedule="1f1b"] td.formula') == "65.2%"
    assert drawn_cells(browser) == 2 * 16 * 8 and "rank 15" in text(browser, "#charts")
    assert "p=16" in browser.current_url
    browser.save_screenshot(str(shots / "2-1f1b-p16-m8.png"))

    if "zb-v" not in api.available():
        pytest.skip("zb-v is not built yet")
    before = browser.find_element(By.ID, "timeline")
    browser.find_element(By.CSS_SELECTOR, '#families input[value="1f1b"]').click()
    browser.find_element(By.CSS_SELECTOR, '#families input[value="zb-v"]').click()
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, '#summary tr[data-schedule="zb-v"]'))
    assert not browser.find_elements(By.CSS_SELECTOR, '#summary tr[data-schedule="1f1b"]')
    assert browser.find_element(By.ID, "timeline") != before  # a new drawing, not the old one
    assert drawn_cells(browser) == 3 * 32 * 8  # F, I, W of 2 chunks x 16 ranks x 8 micro-batches
    legend = text(browser, "#legend")
    assert "I input-grad" in legend and "W weight-grad" in legend
    assert "schedules=zb-v" in browser.current_url
    browser.save_screenshot(str(shots / "3-zb-v-p16-m8.png"))

    set_value(browser, "m", "0")
    wait_for(browser, lambda d: text(d, "#err-m"))
    assert text(browser, "#err-m") == "--microbatches must be >= 1; got 0"
    m_box = browser.find_element(By.ID, "m")
    assert "invalid" in m_box.get_attribute("class")
    # next to the field: the message sits in the m control's own block, under its input
    assert browser.execute_script("return document.getElementById('err-m').parentElement "
                                  "=== document.getElementById('m').parentElement")
    assert text(browser, "#err-p") == "" and "not valid" in text(browser, "#status")
    browser.save_screenshot(str(shots / "4-m0-error.png"))

    set_value(browser, "m", "8")
    wait_for(browser, lambda d: not text(d, "#err-m") and "zb-v" in text(d, "#status"))


def test_hover_shows_action_start_and_end(server, browser):
    browser.get(server.url + "?p=2&m=2")
    wait_for(browser, lambda d: "1f1b" in text(d, "#status"))
    cell = browser.find_element(By.CSS_SELECTOR, '#timeline [data-k="0,1,0"]')  # rank 1's first op: 1F0
    ActionChains(browser).move_to_element(cell).perform()
    wait_for(browser, lambda d: d.find_element(By.ID, "tip").is_displayed())
    tip = text(browser, "#tip")
    assert "1F0" in tip and "forward" in tip and "rank 1" in tip and "start 1" in tip and "end 2" in tip


def test_url_restores_the_settings_and_compares(server, browser):
    browser.get(server.url + "?schedules=gpipe,1f1b&p=4&m=8&tb=3")
    wait_for(browser, lambda d: "2 schedules" in text(d, "#status"))
    assert browser.find_element(By.ID, "tb").get_attribute("value") == "3"
    assert browser.find_element(By.CSS_SELECTOR, '#families input[value="gpipe"]').is_selected()
    # (p-1)/(m+p-1) holds for any t_f, t_b: both families, one shared time axis
    assert bubble_of(browser, "gpipe") == bubble_of(browser, "1f1b") == "27.3%"
    assert text(browser, "#err-schedules") == ""
    makespans = browser.execute_script("return [...document.querySelectorAll('#summary td.makespan')]"
                                       ".map(e => e.innerText)")
    assert makespans == ["44", "44"]


def test_downloads_and_no_request_leaves_the_machine(server, browser):
    browser.get(server.url + "?p=3&m=4")
    wait_for(browser, lambda d: "1f1b" in text(d, "#status"))
    browser.execute_script("window.__saved = []; window.save = (b, n) => window.__saved.push([n, b.type, b.size]);")
    browser.find_element(By.ID, "dl-svg").click()
    browser.find_element(By.ID, "dl-png").click()
    browser.find_element(By.CSS_SELECTOR, '#summary a[data-dl="csv"]').click()
    saved = wait_for(browser, lambda d: len(d.execute_script("return window.__saved")) == 3
                     and d.execute_script("return window.__saved"))
    by_name = {name: (kind, size) for name, kind, size in saved}
    assert by_name["1f1b-p3-m4.svg"][0] == "image/svg+xml"
    assert by_name["1f1b-p3-m4.png"][0] == "image/png" and by_name["1f1b-p3-m4.png"][1] > 1000
    assert by_name["1f1b-p3-m4.csv"][0].startswith("text/csv")
    urls = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert urls and all(u.startswith(server.url) or u.startswith("blob:") for u in urls), urls


def test_a_link_to_a_family_this_version_lacks_says_so(server, browser):
    browser.get(server.url + "?schedules=gpipe,warp-drive&p=2&m=2")
    wait_for(browser, lambda d: "gpipe" in text(d, "#status"))
    assert "warp-drive" in text(browser, "#err-schedules") and "not in this version" in text(browser, "#err-schedules")
    assert browser.find_element(By.CSS_SELECTOR, '#families input[value="gpipe"]').is_selected()


def cap_cell(browser, schedule):
    return text(browser, f'#summary tr[data-schedule="{schedule}"] td.cap')


def test_memory_cap_marks_peaks_over_it_and_a_bad_cap_by_its_field(server, browser, shots):
    if not {"zb-v", "v-half", "v-min"} <= set(api.available()):
        pytest.skip("v-half and v-min are not built yet")
    browser.get(server.url + "?schedules=zb-v,v-half,v-min&p=8&m=16")
    wait_for(browser, lambda d: "3 schedules" in text(d, "#status"))
    assert count(browser, "#summary td.cap") == 0 and count(browser, "#timeline line.cap") == 0  # no cap, no column

    set_value(browser, "cap", "5")
    wait_for(browser, lambda d: cap_cell(d, "zb-v"))
    # the controllable-memory paper's peaks in a rank's share: zb-v p, v-half (p+2)//2, v-min (p+4)//3
    assert cap_cell(browser, "zb-v") == "8 > 5 \u2717 over on 8 of 8 ranks"
    assert cap_cell(browser, "v-half") == "5 \u2264 5 \u2713 within"
    assert cap_cell(browser, "v-min") == "4 \u2264 5 \u2713 within"
    assert count(browser, '#summary tr[data-schedule="zb-v"] td.peaks .over') == 8
    assert count(browser, "#summary td.peaks .over") == 8
    assert count(browser, "#timeline line.cap") == 3 * 8  # a dashed cap line on every rank's memory strip
    assert count(browser, "#timeline text.over") == 8 and "over the cap" in text(browser, "#legend")
    assert "cap=5" in browser.current_url
    browser.save_screenshot(str(shots / "5-cap-zb-v-v-half-v-min.png"))

    set_value(browser, "cap", "0")
    wait_for(browser, lambda d: text(d, "#err-cap"))
    assert text(browser, "#err-cap").startswith("--cap must be > 0 and finite")
    assert "invalid" in browser.find_element(By.ID, "cap").get_attribute("class")
    assert browser.execute_script("return document.getElementById('err-cap').parentElement "
                                  "=== document.getElementById('cap').parentElement")
    assert "not valid" in text(browser, "#status")

    # the share I frees moves the peaks of zb-h1's later ranks under the cap
    browser.get(server.url + "?schedules=zb-h1&p=4&m=8&cap=3.5")
    wait_for(browser, lambda d: cap_cell(d, "zb-h1"))
    assert browser.find_element(By.ID, "cap").get_attribute("value") == "3.5"
    assert cap_cell(browser, "zb-h1") == "4 > 3.5 \u2717 over on 4 of 4 ranks"
    set_value(browser, "free_at_i", "0.5")
    wait_for(browser, lambda d: cap_cell(d, "zb-h1") == "4 > 3.5 \u2717 over on 1 of 4 ranks")
    assert text(browser, '#summary tr[data-schedule="zb-h1"] td.peaks') == "4 3.5 3 2.5"
    assert "free_at_i=0.5" in browser.current_url
    set_value(browser, "free_at_i", "1.5")
    wait_for(browser, lambda d: text(d, "#err-free_at_i"))
    assert text(browser, "#err-free_at_i") == "--free-at-i must be <= 1; got 1.5"
    # the cap is in the peak column's unit, which "durations are for" sets
    assert text(browser, "#cap-unit") == "micro-batches of a rank's share"
    Select(browser.find_element(By.ID, "per")).select_by_value("stage")
    wait_for(browser, lambda d: text(d, "#cap-unit") == "micro-batches of one stage")


def test_the_address_takes_per_stage_costs_and_reports_what_the_page_cannot_use(server, browser):
    browser.get(server.url + "?tf=1,1,1,2&tb=2,2,2,4")  # the CLI's lists: its makespan
    wait_for(browser, lambda d: text(d, '#summary tr[data-schedule="1f1b"] td.makespan') == "57")
    assert browser.find_element(By.ID, "tf").get_attribute("value") == "1,1,1,2"
    assert "tf=1%2C1%2C1%2C2" in browser.current_url and "tb=2%2C2%2C2%2C4" in browser.current_url
    assert text(browser, "#err-address") == "" and text(browser, "#err-tf") == ""

    browser.get(server.url + "?tf=1,1,2&zoom=3&colour=red&p=abc&per=chunk")  # nothing here is dropped silently
    wait_for(browser, lambda d: text(d, "#err-tf"))
    assert text(browser, "#err-tf") == "--tf has 3 per-stage values; the schedule has 4 stages"
    assert "invalid" in browser.find_element(By.ID, "tf").get_attribute("class")
    address = text(browser, "#err-address")
    assert 'names "colour", which the page does not know' in address and "zoom=3" in address
    assert text(browser, "#err-p").startswith("the address gives p=abc; this control takes a number")
    assert text(browser, "#err-per").startswith("the address gives per=chunk; this control takes rank or stage")
    assert "not valid" in text(browser, "#status")


def test_fsdp_over_a_slow_link_draws_a_communication_lane_and_says_what_was_exposed(server, browser, shots):
    """A student sets FSDP and a bandwidth and watches a bubble appear: the lane under each rank, the collective
    cause in the legend of Why it waits, and the exposed communication in the summary (rank 0 waits 2 for the
    first all-gather and 2 for the last reduce-scatter)."""
    browser.get(server.url + "?schedules=1f1b&p=4&m=8&fsdp=2&bandwidth=0.25")
    wait_for(browser, lambda d: bubble_of(d, "1f1b") == "35.1%")
    assert text(browser, '#summary tr[data-schedule="1f1b"] td.comm') == "4"
    assert "exposed comm" in text(browser, "#summary")
    browser.save_screenshot(str(shots / "comm-lane-fsdp2.png"))
    browser.get(server.url + "?schedules=1f1b&p=4&m=8&fsdp=2&bandwidth=0.25&mode=why")
    wait_for(browser, lambda d: "collective" in text(d, "#legend"))
