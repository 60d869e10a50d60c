"""The workshop page in a real headless Chromium driven by Selenium: fixtures and helpers of its browser tests.

Each test module imports the fixtures it uses (``server``, ``browser``, ``shots``); without selenium or
Debian's chromium and chromium-driver the module is skipped with the reason.
"""

import os
import shutil
import tempfile
import threading
from pathlib import Path

import pytest

from stagewise.workshop.server import Server

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--window-size=1400,1000"]


def require_browser():
    """Skip the calling test module unless selenium and Debian's chromium are there; returns webdriver."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
    if not (os.access(CHROMIUM, os.X_OK) and os.access(DRIVER, os.X_OK)):
        pytest.skip(f"needs Debian's chromium and chromium-driver at {CHROMIUM} and {DRIVER} "
                    "(apt-get install chromium chromium-driver)", allow_module_level=True)
    return webdriver


@pytest.fixture(scope="module")
def server():
    httpd = Server(0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def browser():
    webdriver = require_browser()
    profile = tempfile.mkdtemp(prefix="stagewise-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in FLAGS + [f"--user-data-dir={profile}"]:
        opts.add_argument(flag)
    driver = webdriver.Chrome(options=opts, service=webdriver.ChromeService(DRIVER))
    driver.set_script_timeout(20)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    """Where screenshots go: $STAGEWISE_SCREENSHOTS, or pytest's tmp dir."""
    out = os.environ.get("STAGEWISE_SCREENSHOTS")
    path = Path(out) if out else tmp_path_factory.mktemp("workshop")
    path.mkdir(parents=True, exist_ok=True)
    return path


def wait_for(browser, check, timeout=10):
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(browser, timeout, poll_frequency=0.05).until(lambda d: check(d))
    except TimeoutException:
        state = browser.execute_script(
            "return [location.search, document.getElementById('status').textContent, "
            "[...document.querySelectorAll('.err')].filter(e => e.textContent).map(e => e.id + ': ' + e.textContent), "
            "[...document.querySelectorAll('#families input:checked')].map(e => e.value)]")
        raise AssertionError(f"the page did not get there in {timeout} s; "
                             f"url, status, errors, ticked: {state}") from None


def click(browser, css, timeout=10):
    """Click the element at ``css``, found again if the page redrew it between finding and clicking (a chart
    is redrawn when its answer arrives and again when the window's layout settles)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    def once(d):
        try:
            d.find_element(By.CSS_SELECTOR, css).click()
            return True
        except StaleElementReferenceException:
            return False

    wait_for(browser, once, timeout)


def text(browser, css):
    """Visible text of the first match, read in one step (the page redraws under us)."""
    return browser.execute_script("const e = document.querySelector(arguments[0]); return e && e.innerText", css)


def words(browser, css):
    """The text content of the first match with its white space collapsed (no layout's line breaks)."""
    return browser.execute_script("const e = document.querySelector(arguments[0]); "
                                  "return e && e.textContent.replace(/\\s+/g, ' ').trim()", css)


def legend_entry(browser, cause):
    """The legend's entry of a cause of idle time ('fill the pipeline fills'), or None."""
    return words(browser, f'#legend .cause[data-cause="{cause}"]')


def count(browser, css):
    return browser.execute_script("return document.querySelectorAll(arguments[0]).length", css)


def set_value(browser, field, value):
    from selenium.webdriver.common.by import By

    box = browser.find_element(By.ID, field)
    box.clear()  # fires no input event: the keys below do
    box.send_keys(value)


def drawn(browser) -> int:
    """How many times the page has drawn an answer (it counts them on #view)."""
    return int(browser.execute_script("return Number(document.getElementById('view').dataset.drawn || 0)"))


def open_page(browser, server, query=""):
    """Load the page with ``query`` and wait for its first drawing."""
    browser.get(server.url + query)
    wait_for(browser, lambda d: drawn(d) > 0)


def capture_saves(browser):
    """Replace the page's file saving: each saved file's name, type and text are kept in window.__saved."""
    browser.execute_script("window.__saved = []; window.save = (b, n) => b.text().then("
                           "(t) => window.__saved.push([n, b.type, t]));")
