"""The workshop's modes in a real headless Chromium: Play, Why it waits, Build your own, Teach, and the picture.

Screenshots of each state go under pytest's tmp dir (or $STAGEWISE_SCREENSHOTS).
"""

import re

import pytest
from workshop_helpers import (browser, capture_saves, click, count, legend_entry, open_page, require_browser,  # noqa: F401
                              server, set_value, shots, text, wait_for, words)

from stagewise import torch_csv
from stagewise.schedules import generate

require_browser()
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def cursor_t(browser) -> float:
    return float(browser.execute_script("return document.querySelector('#layers .cursor').dataset.t"))


def counter(browser, schedule, column):
    return text(browser, f'#play-counters tr[data-schedule="{schedule}"] td.{column}')


def seek(browser, t):
    browser.execute_script("const r = document.getElementById('t-range'); r.value = arguments[0]; "
                           "r.dispatchEvent(new Event('input', {bubbles: true}));", t)


def test_play_advances_the_cursor_and_the_counters(server, browser, shots):
    open_page(browser, server, "?p=4&m=8&mode=play")
    assert cursor_t(browser) == 0 and text(browser, "#t-now") == "t = 0 of 33"
    browser.find_element(By.ID, "step").click()  # to the next start or end: 0F0 ends at 1
    assert cursor_t(browser) == 1 and counter(browser, "1f1b", "busy") == "1"
    assert counter(browser, "1f1b", "idle") == "3 of 4" and counter(browser, "1f1b", "sofar") == "75.0%"
    assert count(browser, "#layers .msg.activation") == 1  # 0F0's activation, sent to rank 1 at 1
    browser.find_element(By.ID, "play").click()
    wait_for(browser, lambda d: cursor_t(d) > 6)
    browser.find_element(By.ID, "play").click()  # pause
    t = cursor_t(browser)
    assert 6 < t < 33 and "t=" in browser.current_url
    busy = float(counter(browser, "1f1b", "busy"))
    assert busy > 1
    # the cells ahead of the cursor are pale: the mask starts at the cursor
    x = browser.execute_script("return [document.querySelector('#layers .cursor').getAttribute('x1'), "
                               "document.querySelector('#layers .ahead').getAttribute('x')]")
    assert x[0] == x[1]
    seek(browser, 3.5)  # rank 0 has started its four warm-up forwards: four activations live
    levels = browser.execute_script("return [...document.querySelectorAll('#layers .levels circle')]"
                                    ".map(c => Number(c.dataset.level))")
    assert levels == [4, 3, 2, 1]
    # the op each rank runs stays whole and outlined; at latency 0 a message is a straight arrow a row long
    assert count(browser, "#layers .now") == 4
    arrows = browser.execute_script("return [...document.querySelectorAll('#layers .msg')].map(p => p.getAttribute('d'))")
    assert arrows and all("Q" not in d for d in arrows)
    assert all(float(r) >= 2.5 for r in browser.execute_script(
        "return [...document.querySelectorAll('#layers .levels circle')].map(c => c.getAttribute('r'))"))
    assert counter(browser, "1f1b", "fill") == "6 of 18"  # 1 + 2 + 3: ranks 1-3 waiting for micro-batch 0
    browser.save_screenshot(str(shots / "play-1f1b-p4-m8.png"))
    seek(browser, 33)  # at the end the bubble so far is the bubble, and the closed form
    assert counter(browser, "1f1b", "sofar") == "27.3%" and counter(browser, "1f1b", "drain") == "18 of 18"
    browser.find_element(By.ID, "step-back").click()
    assert cursor_t(browser) == 31  # 0B7 starts at 31


def test_switching_modes_keeps_the_picture_and_adds_the_mode_layers(server, browser):
    open_page(browser, server, "?schedules=gpipe,1f1b&p=4&m=8")
    first = browser.find_element(By.ID, "timeline")
    browser.find_element(By.CSS_SELECTOR, '#modes button[data-mode="play"]').click()
    wait_for(browser, lambda d: count(d, "#layers .cursor") == 2)  # one cursor per chart, on the same picture
    assert browser.find_element(By.ID, "timeline") == first and "mode=play" in browser.current_url
    browser.find_element(By.ID, "step").click()
    wait_for(browser, lambda d: count(d, "#layers .msg") == 2)  # the messages came for Play: 0F0's, twice
    browser.find_element(By.CSS_SELECTOR, '#modes button[data-mode="view"]').click()
    wait_for(browser, lambda d: count(d, "#layers .cursor") == 0)
    assert "mode=" not in browser.current_url


def gap_index(browser, rank, pos) -> int:
    return browser.execute_script("return Modes.results(shown)[0].gaps.findIndex(g => g[0] === arguments[0] "
                                  "&& g[3] === arguments[1])", rank, pos)


def test_clicking_a_known_idle_gap_of_1f1b_names_what_it_waits_for(server, browser, shots):
    open_page(browser, server, "?p=4&m=8&mode=why")
    j = gap_index(browser, 0, 4)  # rank 0, after its four warm-up forwards, before 0B0
    browser.find_element(By.CSS_SELECTOR, f'#timeline .gap[data-g="0,{j}"]').click()
    wait_for(browser, lambda d: "waits for" in (text(d, "#why-detail") or ""))
    detail = text(browser, "#why-detail")
    assert text(browser, "#why-detail .why-plain") == ("rank 0 waits for micro-batch 0's gradient: it comes back only "
                                                       "after micro-batch 0 has gone through every later stage (the "
                                                       "pipeline is still filling).")  # plain words first
    assert "rank 0 idle 4..10 (6)" in detail and "0B0 waits for 1B0 (gradient from rank 1)" in detail
    assert "2B0 \u2190 3B0 \u2190 3F0 \u2190 2F0 \u2190 1F0 \u2190 0F0" in detail and "fill" in detail
    assert count(browser, "#layers .overlay .wait") == 7  # one arrow per wait on the chain
    assert "gap=0%2C0%2C4" in browser.current_url or "gap=0,0,4" in browser.current_url
    browser.save_screenshot(str(shots / "why-1f1b-p4-m8.png"))
    # the late op after a gap explains the same gap; an op that did not wait says so
    browser.find_element(By.CSS_SELECTOR, '#timeline [data-k="0,3,13"]').click()  # 3B5: no gap before it
    wait_for(browser, lambda d: "did not wait" in text(d, "#why-detail"))
    browser.find_element(By.CSS_SELECTOR, '#timeline [data-k="0,0,13"]').click()  # 0B5, after a drain gap
    wait_for(browser, lambda d: "0B5 waits for 1B5" in text(d, "#why-detail"))
    assert "drain (the pipeline drains)" in text(browser, "#why-detail .why-exact")
    assert legend_entry(browser, "fill") == "fill the pipeline fills"
    assert legend_entry(browser, "drain") == "drain the pipeline drains"


def drag(browser, rank, pos, to_t):
    """Drag op ``pos`` of ``rank`` so that its middle lands at time ``to_t``."""
    dx = browser.execute_script("const op = opAt(Modes.results(shown)[0], arguments[0], arguments[1]); "
                                "return L.x(arguments[2]) - L.x((op[4] + op[5]) / 2)", rank, pos, to_t)
    cell = browser.find_element(By.CSS_SELECTOR, f'#timeline [data-k="0,{rank},{pos}"]')
    ActionChains(browser).click_and_hold(cell).move_by_offset(int(dx / 2), 0).move_by_offset(
        int(dx) - int(dx / 2), 0).release().perform()


def first_line(browser):
    return browser.execute_script("return document.getElementById('programs').value.split('\\n')[0]")


def torch_order(csv_text, p, stages, m):
    """The per-rank actions torch's own loader reads from the CSV (``_PipelineScheduleRuntime._load_csv``,
    which validates the order and lowers it with its sends and receives)."""
    pytest.importorskip("torch")
    import os
    import tempfile
    from unittest import mock

    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime
    from torch.distributed.pipelining.stage import PipelineStage

    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank, stage.group_size, stage.submod, stage.num_stages = 0, p, None, stages
    runtime = _PipelineScheduleRuntime([stage] * (stages // p), m)
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
        f.write(csv_text)
    try:
        runtime._load_csv(f.name)
    finally:
        os.unlink(f.name)
    assert runtime.pipeline_order_with_comms  # lowered with its communication
    return [[str(a) for a in runtime.pipeline_order[r]] for r in range(p)]


def test_a_drag_that_deadlocks_shows_the_cycle_and_a_valid_drag_updates_the_bubble(server, browser, shots):
    open_page(browser, server, "?p=4&m=8&mode=build")
    wait_for(browser, lambda d: "1f1b's own" in (text(d, "#build-bubble") or ""))
    # the family's own order is not "(edited)"; every rank's line is in view
    assert text(browser, "#build-bubble").startswith("your order is 1f1b's own: bubble 27.3%")
    assert count(browser, '#summary tr[data-schedule="1f1b"]') == 1
    assert browser.execute_script("return document.getElementById('programs').rows") == 4 + 1
    # 0B0 before 0F2: rank 0 waits for 1B0, which rank 1 runs only after 1F2, which needs 0F2
    drag(browser, 0, 4, 2.0)
    wait_for(browser, lambda d: text(d, "#err-programs"))
    assert text(browser, "#err-programs .plain").startswith("the ranks wait for each other in a loop, so none can go "
                                                           "on: rank 0 waits at its op 3 (0B0) for 1B0, rank 1's op 4")
    assert text(browser, "#err-programs .exact") == ("deadlock: wait cycle: rank 0 position 3 (0B0) waits for 1B0 at "
                                                     "rank 1 position 4; rank 1 position 3 (1F2) waits for 0F2 at rank 0 "
                                                     "position 4; back to rank 0")  # positions from 1
    assert first_line(browser).startswith("0F0 0F1 0B0 0F2 0F3")
    # two waits and the two program orders that close the loop, each its own curve
    assert count(browser, "#layers .cycle") == 4 and count(browser, "#layers .cycle.after") == 2
    paths = browser.execute_script("return [...document.querySelectorAll('#layers .cycle')].map(p => p.getAttribute('d'))")
    assert len(set(paths)) == 4 and count(browser, "#layers .stuck") == 2
    assert count(browser, "#timeline .pending") > 0 and "does not run" in text(browser, "#build-bubble")
    assert count(browser, "#timeline .strip") == 0 and "peak" not in text(browser, "#charts")  # it never runs
    browser.save_screenshot(str(shots / "build-deadlock-1f1b-p4-m8.png"))

    browser.find_element(By.ID, "reset-build").click()
    wait_for(browser, lambda d: not text(d, "#err-programs") and first_line(d).startswith("0F0 0F1 0F2 0F3 0B0"))
    drag(browser, 0, 4, 3.0)  # 0B0 before 0F3: it runs, later
    wait_for(browser, lambda d: "33.3%" in (text(d, "#build-bubble") or ""))
    assert "27.3% (1f1b) \u2192 33.3% (your order)" in text(browser, "#build-bubble")
    assert text(browser, '#summary tr[data-schedule="1f1b (edited)"] td.bubble') == "33.3%"
    assert count(browser, "#layers .cycle") == 0 and count(browser, "#timeline .strip") == 4
    browser.save_screenshot(str(shots / "build-valid-1f1b-p4-m8.png"))

    capture_saves(browser)
    browser.find_element(By.ID, "dl-edited").click()
    name, kind, csv_text = wait_for(browser, lambda d: d.execute_script("return window.__saved[0]"))
    assert name == "1f1b-edited-p4-m8.csv" and kind == "text/csv"
    rows = [line.split(",") for line in csv_text.splitlines()]
    assert rows[0][:5] == ["0F0", "0F1", "0F2", "0B0", "0F3"]
    assert [[str(op) for op in prog] for prog in torch_csv.loads(csv_text).programs] == rows
    assert torch_order(csv_text, 4, 4, 8) == rows


def test_typed_programs_are_checked_as_typed(server, browser):
    open_page(browser, server, "?p=2&m=2&mode=build")
    wait_for(browser, lambda d: "1f1b's own" in (text(d, "#build-bubble") or ""))
    box = browser.find_element(By.ID, "programs")
    box.clear()
    box.send_keys("0F0 0F1 0B0 0B1\n1F0 1B0 1F1 1Bx")
    wait_for(browser, lambda d: "not an action" in (text(d, "#err-programs") or ""))
    assert text(browser, "#err-programs").startswith("row 2 (rank 1) column 4: not an action: '1Bx'")
    assert "invalid" in box.get_attribute("class")
    box.send_keys("\b1")  # 1B1
    wait_for(browser, lambda d: not text(d, "#err-programs") and "1f1b's own" in text(d, "#build-bubble"))


def test_downloads_of_the_view_parse_with_torch(server, browser):
    open_page(browser, server, "?schedules=zb-v&p=4&m=8")
    capture_saves(browser)
    browser.find_element(By.CSS_SELECTOR, '#summary a[data-dl="csv"]').click()
    name, _, csv_text = wait_for(browser, lambda d: d.execute_script("return window.__saved[0]"))
    ours = generate("zb-v", 4, 8)
    assert name == "zb-v-p4-m8.csv" and torch_csv.loads(csv_text).programs == ours.programs
    assert torch_order(csv_text, 4, 8, 8) == [[str(op) for op in prog] for prog in ours.programs]


def test_teach_quotes_the_page_numbers_and_its_terms_light_the_picture(server, browser, shots):
    open_page(browser, server, "?p=4&m=8&mode=teach")
    wait_for(browser, lambda d: "The papers' formula" in (text(d, "#panel-teach") or ""))
    panel = text(browser, "#panel-teach")
    assert "(p\u22121) / (m+p\u22121) = (4\u22121) / (8+4\u22121) = 3/11 = 27.3%" in panel
    assert "4 \u00d7 33 \u2212 96 = 36" in panel and "fill 18" in panel and "drain 18" in panel
    assert legend_entry(browser, "fill") == "fill the pipeline fills"  # the hatches it lights, in the legend
    fills = browser.execute_script("return Modes.results(shown)[0].gaps.filter(g => g[4] === 'fill').length")
    ActionChains(browser).move_to_element(browser.find_element(By.CSS_SELECTOR, '#panel-teach [data-term="gaps:fill"]')
                                          ).perform()
    wait_for(browser, lambda d: count(d, "#timeline .gap.hl") == fills)
    assert fills == 6 and "hl-any" in browser.find_element(By.ID, "timeline").get_attribute("class")
    ActionChains(browser).move_to_element(browser.find_element(By.CSS_SELECTOR, '#panel-teach [data-term="kind:F"]')
                                          ).perform()
    wait_for(browser, lambda d: count(d, "#timeline [data-k].hl") == 32)  # the 32 forwards
    browser.save_screenshot(str(shots / "teach-1f1b-p4-m8.png"))


def test_every_chart_has_a_time_axis_labels_fit_and_numbers_show_at_any_m(server, browser):
    open_page(browser, server, "?schedules=gpipe,interleaved-1f1b&p=4&m=16&cap=4")
    assert count(browser, "#timeline .axis") == 2
    overflow = browser.execute_script(
        "const w = document.getElementById('timeline').width.baseVal.value; return [...document.querySelectorAll("
        "'#timeline text')].filter(t => { const b = t.getBBox(); return b.x + b.width > w + 0.5 || b.x < 0; })"
        ".map(t => t.textContent)")
    assert overflow == []  # "peak 5.5 > cap" used to lose its end
    labels = browser.execute_script("return [...document.querySelectorAll('#timeline text[pointer-events]')]"
                                    ".map(t => t.textContent)")
    assert labels.count("15") >= 2 + 4  # gpipe's F and B of micro-batch 15, interleaved's on its 2 chunks


def test_the_downloaded_picture_has_what_the_mode_drew(server, browser):
    open_page(browser, server, "?p=4&m=8&mode=why&gap=0,0,4")
    wait_for(browser, lambda d: count(d, "#layers .wait") == 7)
    capture_saves(browser)
    browser.find_element(By.ID, "dl-svg").click()
    name, kind, svg = wait_for(browser, lambda d: d.execute_script("return window.__saved[0]"))
    assert name == "1f1b-p4-m8.svg" and kind == "image/svg+xml" and svg.startswith("<svg")
    assert svg.count('class="wait"') == 7 and 'class="chosen-gap"' in svg  # the chain, on the picture
    assert 'class="gap"' in svg and 'display="none"' not in svg.split('class="gap"')[1].split(">")[0]
    browser.find_element(By.CSS_SELECTOR, '#modes button[data-mode="view"]').click()
    wait_for(browser, lambda d: count(d, "#layers .wait") == 0)
    capture_saves(browser)
    browser.find_element(By.ID, "dl-svg").click()
    _, _, svg = wait_for(browser, lambda d: d.execute_script("return window.__saved[0]"))
    assert 'class="wait"' not in svg and 'display="none"' in svg.split('class="gap"')[1].split(">")[0]


def answered(browser, title):
    return browser.execute_script(
        "const p = document.getElementById('panel-teach'), h = p.querySelector('h3'), q = p.querySelector('.question');"
        "return h && q && h.textContent === arguments[0] ? q.dataset.answered : null", title)


def toggle(browser, name):
    browser.find_element(By.CSS_SELECTOR, f'#families input[value="{name}"]').click()


#: per lesson, what the student changes to answer it (the values tests/test_workshop_teach.py checks too)
LESSON_ANSWERS = [
    ("bubble", [("m", "64")]),
    ("memory", [("m", "16")]),
    ("interleaving", [("v", "4")]),
    ("zero-bubble", [("m", "10")]),
    ("v-shape", [("cap", "5"), ("toggle", "zb-v"), ("toggle", "v-min")]),
    ("dualpipe", [("a2a", "0.25")]),
    ("uneven", [("tf", "1.25,1.25,1.25,1.25"), ("tb", "2.5,2.5,2.5,2.5")]),
    ("slices", [("slices", "3")]),
]


def test_each_lesson_ends_with_a_question_its_controls_answer(server, browser, shots):
    from stagewise.workshop import teach

    titles = {x.key: x.title for x in teach.LESSONS}
    assert [k for k, _ in LESSON_ANSWERS] == list(titles)  # every lesson, in order
    open_page(browser, server, "?mode=teach")
    for key, changes in LESSON_ANSWERS:
        browser.find_element(By.CSS_SELECTOR, f'#panel-teach [data-lesson="{key}"]').click()
        wait_for(browser, lambda d: answered(d, titles[key]) == "false")  # the lesson's own start: not yet
        assert f"lesson={key}" in browser.current_url
        assert count(browser, "#panel-teach a.term") >= 1  # its terms light the picture
        for field, value in changes:
            if field == "toggle":
                toggle(browser, value)
            else:
                set_value(browser, field, value)
        wait_for(browser, lambda d: answered(d, titles[key]) == "true")
        assert text(browser, "#panel-teach .answer").startswith("\u2713 answered")
        assert count(browser, f'#panel-teach [data-lesson="{key}"].done') == 1
        browser.save_screenshot(str(shots / f"lesson-{key}.png"))


#: one view per cause, reached by changing controls in one page: (controls to set, cause, schedule shown)
CAUSE_VIEWS = [
    ([], "fill"), ([], "drain"),
    ([("tf", "1,1,1,2"), ("tb", "2,2,2,4")], "slow stage"),
    ([("tf", "1"), ("tb", "2"), ("latency", "1")], "link"),
    ([("latency", "0"), ("toggle", "1f1b"), ("toggle", "dualpipe-v")], "order"),
]


def test_every_cause_is_said_in_plain_words_with_its_own_hatch_in_the_legend(server, browser):
    from stagewise.workshop import api

    open_page(browser, server, "?p=4&m=8&mode=why")
    patterns = set()
    for changes, cause in CAUSE_VIEWS:
        for field, value in changes:
            (toggle if field == "toggle" else lambda b, v, f=field: set_value(b, f, v))(browser, value)
        find = "const r = Modes.results(shown)[0]; return r ? r.gaps.findIndex(g => g[4] === arguments[0]) : -1"
        wait_for(browser, lambda d: d.execute_script(find, cause) >= 0)
        j = browser.execute_script(find, cause)
        view = browser.execute_script("return [readControls(), Modes.results(shown)[0].schedule, "
                                      "Modes.results(shown)[0].gaps[arguments[0]]]", j)
        settings, schedule, (rank, _, _, pos, _) = view
        click(browser, f'#timeline .gap[data-g="0,{j}"]')
        want = api.why(api.parse_settings(settings), schedule, rank, pos)
        wait_for(browser, lambda d: words(d, "#why-detail .why-plain") == want["plain"] + ".")
        assert want["cause"] == cause and not re.search(r"\d[FBIW]\d|OVERLAP", want["plain"])  # no op codes
        assert f"{cause} ({want['label']})" in words(browser, "#why-detail .why-exact")  # the exact terms next
        assert legend_entry(browser, cause) == f"{cause} {want['label']}"
        # the first cause's label sits on the chart's own label row, over the ranks, naming the right rank
        wait_for(browser, lambda d: d.execute_script("return !!document.querySelector('#layers .first-cause')"))
        label = browser.execute_script("const t = document.querySelector('#layers .first-cause'); "
                                       "return [Number(t.getAttribute('y')), geo[0].y, Number(t.dataset.rank), t.textContent]")
        first = want["blocker"] or want["origin"]
        assert label[0] < label[1] and label[2] == first["rank"] and f"rank {first['rank']}" in label[3]
        fill = browser.execute_script("return document.querySelector(`#timeline .gap[data-g='0,${arguments[0]}']`)"
                                      ".getAttribute('fill')", j)
        assert fill == f"url(#hatch-{cause.replace(' ', '-')})"
        patterns.add(browser.execute_script("return document.querySelector(arguments[0]).innerHTML.replace(/#\\w+/g, '')",
                                            f"#hatch-{cause.replace(' ', '-')}"))
    assert len(patterns) == len(CAUSE_VIEWS) - 1  # five causes, five patterns (not only colours)


def test_a_big_view_shows_every_rank_line_and_its_numbers_when_zoomed(server, browser, shots):
    open_page(browser, server, "?p=16&m=64&mode=build")
    wait_for(browser, lambda d: "1f1b's own" in (text(d, "#build-bubble") or ""))
    assert browser.execute_script("return document.getElementById('programs').rows") == 16 + 1
    labels = "return [...document.querySelectorAll('#timeline text[pointer-events]')].filter(t => t.textContent === '63').length"
    assert browser.execute_script(labels) == 0  # a 4 px cell holds no number: its tip says it
    cell = browser.find_element(By.CSS_SELECTOR, '#timeline [data-k="0,0,100"]')
    ActionChains(browser).move_to_element(cell).perform()
    wait_for(browser, lambda d: "micro-batch" in (text(d, "#tip") or ""))
    width = browser.execute_script("return document.getElementById('timeline').width.baseVal.value")
    browser.find_element(By.CSS_SELECTOR, '#zoom option[value="4"]').click()
    wait_for(browser, lambda d: d.execute_script(labels) >= 2)  # 63's forward and backward, at 4x
    assert browser.execute_script("return document.getElementById('timeline').width.baseVal.value") == pytest.approx(
        4 * width, rel=0.02)
    assert "zoom=4" in browser.current_url
    browser.save_screenshot(str(shots / "build-1f1b-p16-m64-zoom4.png"))
