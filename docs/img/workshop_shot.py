"""Screenshot the workshop page, whole, in headless Chromium (Debian's chromium + chromium-driver, selenium).

Run from the repository root:
    PYTHONPATH=$PWD python docs/img/workshop_shot.py '?schedules=zb-v,v-half,v-min&p=8&m=16&cap=5' \
        docs/img/workshop-memory.png

The address holds the mode too (``mode=play&t=12``, ``mode=why&gap=0,0,4``, ``mode=teach``); for Build your
own, ``--programs`` types an order into the editor; ``--hover CSS`` leaves the pointer on an element (its tip).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
import time

from selenium import webdriver

from stagewise.workshop.server import Server

WIDTH = 1400


def shoot(query: str, out: str, *, programs: str | None = None, hover: str | None = None) -> str:
    """Load the page with ``query``, wait for its drawing, save the whole page; returns the status line."""
    httpd = Server(0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    profile = tempfile.mkdtemp(prefix="stagewise-shot-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 f"--window-size={WIDTH},1000", f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(options=opts, service=webdriver.ChromeService("/usr/bin/chromedriver"))
    try:
        driver.get(httpd.url + query)
        deadline = time.monotonic() + 20
        while not driver.execute_script("return document.getElementById('view').dataset.drawn"):
            if time.monotonic() > deadline:
                raise SystemExit("the page drew nothing in 20 s: "
                                 + driver.execute_script("return document.getElementById('status').textContent"))
            time.sleep(0.05)
        if programs is not None:  # Build your own: the order typed into the editor, checked and drawn
            driver.execute_async_script(
                "const [text, done] = arguments; const box = document.getElementById('programs'); box.value = text; "
                "Build.edited().then(done);", programs)
        # the window's outer size includes browser chrome: grow it until the viewport holds the page
        height = driver.execute_script("return document.documentElement.scrollHeight")
        inner = driver.execute_script("return window.innerHeight")
        driver.set_window_size(WIDTH, 1000 + height - inner)
        time.sleep(0.5)  # the page redraws on resize
        if hover:
            from selenium.webdriver.common.action_chains import ActionChains
            from selenium.webdriver.common.by import By

            ActionChains(driver).move_to_element(driver.find_element(By.CSS_SELECTOR, hover)).perform()
            time.sleep(0.3)
        driver.save_screenshot(out)
        return driver.execute_script("return document.getElementById('status').textContent")
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
        httpd.shutdown()
        httpd.server_close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("query", help="the page's settings, as in its address bar ('?schedules=...')")
    ap.add_argument("out", help="PNG file to write")
    ap.add_argument("--programs", help="Build your own: the programs to type, one line per rank")
    ap.add_argument("--hover", metavar="CSS", help="leave the pointer on this element")
    args = ap.parse_args()
    print(shoot(args.query, args.out, programs=args.programs, hover=args.hover), "->", args.out)


if __name__ == "__main__":
    main()
