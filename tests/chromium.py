"""Real headless Chromium for the tests that look at our pages (Debian's ``chromium`` + ``chromium-driver``,
driven by Selenium): the monitor's viewer, the gym's live view. The ``browser`` fixture (tests/conftest.py)
is one driver per test."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

import pytest

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@contextlib.contextmanager
def driver(profile: Path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    if not (shutil.which(CHROMIUM) and shutil.which(DRIVER)):
        pytest.fail("chromium and chromium-driver are missing (scripts/apt-packages.txt, apt-packages-test.txt; "
                    "run CUA_RL_APT=test scripts/setup.sh)")
    os.environ["SE_OFFLINE"] = "true"        # never let Selenium Manager look for downloads
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1400,1000"):
        opts.add_argument(arg)
    # Chromium's singleton folder (org.chromium.Chromium.*) goes in TMPDIR and stays there when the browser is
    # killed: a TMPDIR of this driver's own, removed with it, leaves nothing in /tmp however it ends (a short
    # path: the socket's must fit a Unix socket address, 108 bytes; one under pytest's tmp_path did not).
    tmp = Path(tempfile.mkdtemp(prefix="cua-chromium-"))
    chrome = webdriver.Chrome(service=Service(DRIVER, env={**os.environ, "TMPDIR": str(tmp)}), options=opts)
    chrome.set_page_load_timeout(30)
    try:
        yield chrome
    finally:
        try:
            chrome.quit()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def wait_for(chrome, condition, timeout=30.0):
    """Wait until ``condition`` holds in the page. The ceiling is generous: the monitor's page redraws every 3 s,
    and on a loaded 2-core CI machine Chromium drew the first point of a live run after more than 10 s (session 31's
    quick tier); a page that never gets there still fails."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(chrome, timeout, poll_frequency=0.1).until(lambda d: condition(d))


def css(chrome, selector):
    from selenium.webdriver.common.by import By

    return chrome.find_elements(By.CSS_SELECTOR, selector)


def canvas(chrome):
    """What noVNC's page shows now (its canvas), as an RGB image."""
    import io

    from PIL import Image
    from selenium.webdriver.common.by import By

    png = chrome.find_element(By.CSS_SELECTOR, "#screen canvas").screenshot_as_png
    return Image.open(io.BytesIO(png)).convert("RGB")


def changed_pixels(a, b, threshold: int = 24) -> int:
    """Pixels of two same-size images that differ by more than ``threshold`` in any channel's grey level."""
    from PIL import ImageChops

    diff = ImageChops.difference(a, b).convert("L").point(lambda v: 255 if v > threshold else 0)
    return diff.histogram()[255]


def watch(chrome, url: str, timeout: float = 30.0):
    """Open a live view's noVNC page, wait until it is connected and shows a picture; that picture."""
    import time

    chrome.get(url)
    wait_for(chrome, lambda d: "Connected" in d.find_element("id", "status").text, timeout=timeout)
    wait_for(chrome, lambda d: canvas(d).getextrema() != ((0, 0), (0, 0), (0, 0)), timeout=timeout)
    time.sleep(1.0)   # the first full frame has arrived everywhere on the canvas
    return canvas(chrome)
