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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--cap", type=float, default=None, help="a memory cap per rank (the page's cap control)")
    args = ap.parse_args()
    httpd = Server(0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    driver = browser()
    cases = [[name] for name in api.available()] + [api.available()]
    print(f"{'schedules':<24} {'actions':>7} {'page ms':>8} {'in-process ms':>14} {'of 500 ms':>9} "
          f"{'page/in-process':>15} {'cap change ms':>13}")
    try:
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
    finally:
        driver.quit()
        httpd.shutdown()
        httpd.server_close()


if __name__ == "__main__":
    main()
