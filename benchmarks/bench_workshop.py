"""Workshop responsiveness: a change on the page -> redrawn timeline, for p = 16, m = 64.

Run: .venv/bin/python benchmarks/bench_workshop.py [--repeats 7] [--cap 8]

Target (issue 7): the page redraws "within a fraction of a second" for p <= 16,
m <= 64. For each family (and all families compared at once), in one process:

- page: headless Chromium on the workshop server; the time from an `input`
  event on the m control to the next painted frame after the redraw (debounce,
  request, simulation, JSON, SVG build, layout), median of the repeats;
- baseline, side by side: the same request answered in-process
  (`api.payload` + JSON encoding), the simulation work alone.

It prints both medians, the page's share of a 500 ms budget, and page / baseline; and the
page's time for a change of the memory cap (7 <-> 9), which re-simulates the schedules the
server keeps from the last request (``api.generated``) instead of regenerating them.

Then the modes (issue 22), for the slowest single family and for all families compared, each
beside the same request answered in-process:

- Play: entering it from View (``/api/messages``: every message between ranks; the cells stay,
  the layers are drawn) and one frame of the cursor (masks, arrows, memory markers and counters
  moved; median of 40 moves to a painted frame);
- Why it waits: a click on an idle gap to its explanation and chain drawn (``/api/why``);
- Build your own: a drag (one op moved in rank 0's program) to the checked, simulated, redrawn
  order (``/api/edit``).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from urllib.parse import parse_qsl, urlencode

from stagewise.workshop import api
from stagewise.workshop.server import Server

BUDGET_MS = 500.0
CHANGE = """
const [field, value, done] = arguments;
const view = document.getElementById("view"), box = document.getElementById(field);
const before = Number(view.dataset.drawn || 0);
box.value = value;
const t0 = performance.now();
box.dispatchEvent(new Event("input", { bubbles: true }));
(function poll() {
  if (Number(view.dataset.drawn || 0) > before) requestAnimationFrame(() => done(performance.now() - t0));
  else setTimeout(poll, 1);
})();
"""


def browser():
    from selenium import webdriver

    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--window-size=1400,1000", f"--user-data-dir={tempfile.mkdtemp()}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(options=opts, service=webdriver.ChromeService("/usr/bin/chromedriver"))
    driver.set_script_timeout(30)
    return driver


def page_ms(driver, url: str, repeats: int, field: str = "m", values=(62, 64)) -> float:
    """Median time from a change of ``field`` (alternating ``values``) to the redrawn page."""
    driver.get(url)
    while not driver.execute_script("return document.getElementById('view').dataset.drawn"):
        time.sleep(0.02)
    times = []
    for i in range(repeats):
        api.generated.cache_clear()  # a change of m regenerates; of the cap, only re-simulates (cached)
        if field != "m":
            api.generated(*_key(url))
        times.append(driver.execute_async_script(CHANGE, field, values[i % 2]))
    return statistics.median(times)


def _key(url: str):
    s = api.parse_settings(dict(parse_qsl(url.split("?", 1)[1])))
    return s.schedules, s.p, s.m, s.v


def baseline_ms(settings: dict, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        api.generated.cache_clear()
        t = time.perf_counter()
        api.dumps(api.payload(api.parse_settings(settings)))
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


FRAME = """
const [times, done] = arguments;
const out = [];
(function next(i) {
  if (i >= times.length) { done(out); return; }
  const t0 = performance.now();
  Play.seek(times[i]);
  requestAnimationFrame(() => { out.push(performance.now() - t0); next(i + 1); });
})(0);
"""
ENTER = """
const [mode, done] = arguments;
const view = document.getElementById("view"), seen = () => Number(view.dataset.drawn || 0);
const before = seen(), redrawn = Number(view.dataset.redrawn || 0);
// Build your own asks the server again (drawn counts answers); the other modes redraw their layers
const asks = mode === "build" || page.mode === "build";
const t0 = performance.now();
document.querySelector(`#modes button[data-mode="${mode}"]`).click();
(function poll() {
  const ready = asks ? seen() > before : Number(view.dataset.redrawn || 0) > redrawn;
  if (ready) requestAnimationFrame(() => done(performance.now() - t0));
  else setTimeout(poll, 1);
})();
"""
WHY = """
const done = arguments[0];
const gaps = Modes.results(shown)[0].gaps, g = gaps.find((x) => x[3] >= 0);
Why.detail = null;
const t0 = performance.now();
Why.choose([0, g[0], g[3]]).then(() => requestAnimationFrame(() => done(performance.now() - t0)));
"""
DRAG = """
const done = arguments[0];
const row = Build.programs[0];
row.splice(3, 0, row.splice(4, 1)[0]);  // one op one place earlier, as a drag does
document.getElementById("programs").value = Build.text();
const t0 = performance.now();
Build.edited().then(() => requestAnimationFrame(() => done(performance.now() - t0)));
"""


def in_process_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def modes(driver, url: str, settings: dict, repeats: int) -> dict:
    """Median ms of each mode's interaction on the page, and in-process for the same request."""
    from stagewise.workshop import editor

    s = api.parse_settings(settings)
    out = {}
    driver.get(url)
    while not driver.execute_script("return document.getElementById('view').dataset.drawn"):
        time.sleep(0.02)
    enter = []
    for _ in range(repeats):
        enter.append(driver.execute_async_script(ENTER, "play"))
        driver.execute_async_script(ENTER, "view")
    out["play enter"] = (statistics.median(enter), in_process_ms(lambda: api.dumps(api.messages_of(s)), repeats))
    driver.execute_async_script(ENTER, "play")
    span = driver.execute_script("return L.span")
    frames = driver.execute_async_script(FRAME, [span * k / 40 for k in range(40)])
    out["play frame"] = (statistics.median(frames), None)
    driver.execute_async_script(ENTER, "why")
    gap = next(g for g in api.payload(s)["results"][0]["gaps"] if g[3] >= 0)
    out["why click"] = (statistics.median(driver.execute_async_script(WHY) for _ in range(repeats)),
                        in_process_ms(lambda: api.why(s, s.schedules[0], gap[0], gap[3]), repeats))
    driver.execute_async_script(ENTER, "build")
    text = driver.execute_script("return Build.text()")
    out["build drag"] = (statistics.median(driver.execute_async_script(DRAG) for _ in range(repeats)),
                         in_process_ms(lambda: api.dumps(editor.edit(s, text)), repeats))
    driver.execute_async_script(ENTER, "view")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--cap", type=float, default=None, help="a memory cap per rank (the page's cap control)")
    ap.add_argument("--modes-only", action="store_true", help="only the modes' table")
    args = ap.parse_args()
    httpd = Server(0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    driver = browser()
    cases = [[name] for name in api.available()] + [api.available()]
    try:
        if not args.modes_only:
            changes(driver, httpd, cases, args)
        print(f"\nmodes at p=16, m=64: page ms (in-process ms of the same request); budget {BUDGET_MS:.0f} ms, "
              "a Play frame 50 ms")
        slowest = ["v-min"] if "v-min" in api.available() else cases[0]
        for names in (slowest, api.available()):
            settings = {"schedules": ",".join(names), "p": 16, "m": 64}
            got = modes(driver, httpd.url + "?" + urlencode(settings), settings, args.repeats)
            label = names[0] if len(names) == 1 else f"all {len(names)} compared"
            print(f"{label:<18} " + "  ".join(
                f"{k} {page:.0f}" + (f" ({base:.0f})" if base is not None else "") for k, (page, base) in got.items()))
    finally:
        driver.quit()
        httpd.shutdown()
        httpd.server_close()


def changes(driver, httpd, cases, args) -> None:
    print(f"{'schedules':<24} {'actions':>7} {'page ms':>8} {'in-process ms':>14} {'of 500 ms':>9} "
          f"{'page/in-process':>15} {'cap change ms':>13}")
    for names in cases:
        settings = {"schedules": ",".join(names), "p": 16, "m": 64}
        if args.cap is not None:
            settings["cap"] = args.cap
        actions = sum(r["actions"] for r in api.payload(api.parse_settings(settings))["results"])
        page = page_ms(driver, httpd.url + "?" + urlencode(settings), args.repeats)
        base = baseline_ms(settings, args.repeats)
        cap = page_ms(driver, httpd.url + "?" + urlencode(settings), args.repeats, "cap", (7, 9))
        label = names[0] if len(names) == 1 else f"all {len(names)} compared"
        print(f"{label:<24} {actions:>7} {page:>8.0f} {base:>14.1f} {page / BUDGET_MS:>9.0%} "
              f"{page / base:>15.1f} {cap:>13.0f}")


if __name__ == "__main__":
    main()
