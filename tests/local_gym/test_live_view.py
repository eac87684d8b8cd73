"""The live view (local_gym/live.py) in real headless Chromium: the gym's ``/live`` route starts x11vnc and
websockify for an execution's desktop and redirects to noVNC's page; the page shows the desktop, and the
picture changes after the agent types; it is view-only (keys typed into the page change nothing on the
desktop); it listens on 127.0.0.1 only; terminating the execution ends it."""

from __future__ import annotations

import io
import socket
import time
from urllib.parse import urlsplit

import httpx
import pytest
from PIL import Image

from cua_rl.genv import GenvClient
from cua_rl.local_gym import live
from cua_rl.local_gym.server import start_gym_server
from tests.chromium import canvas as _canvas, changed_pixels as _changed_pixels, wait_for, watch
from tests.hosts import pids

pytestmark = pytest.mark.desktop


def _other_address() -> str | None:
    """An address of this machine that is not loopback (None when it has none)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
            addr = probe.getsockname()[0]
        except OSError:
            return None
    return None if addr.startswith("127.") else addr


def test_a_view_on_every_interface_is_addressed_by_the_name_the_viewer_used():
    """A gym on another host with ``--live-view-host 0.0.0.0``: the page's address is the gym's host name as
    the viewer reached it; a view on one address keeps that address whatever the viewer used."""
    assert live.LiveView(":1", "0.0.0.0", 5901).url("gym.lan").startswith("http://gym.lan:5901/vnc_lite.html?")
    assert live.LiveView(":1", "0.0.0.0", 5901).url(None).startswith("http://0.0.0.0:5901/")
    assert live.LiveView(":1", "127.0.0.1", 5901).url("gym.lan").startswith("http://127.0.0.1:5901/")


async def test_the_live_view_shows_the_desktop_change_and_ends_with_its_execution(browser):
    assert live.missing() == [], "x11vnc, websockify and novnc are in scripts/apt-packages.txt"
    before = pids("^x11vnc") | pids("websockify")
    with start_gym_server(gym_id="desktop", pool_size=0, x_spares=0) as gym:
        async with GenvClient(gym.url, gym.gym_id) as client:
            ex = await client.create_execution("001")
            eid = ex.execution_id
            base = f"{gym.url}/api/v1/{gym.gym_id}/executions/{eid}/live"
            async with httpx.AsyncClient(timeout=30) as http:
                url = (await http.get(base, params={"redirect": "0"})).json()["url"]
                redirect = await http.get(base)
                assert redirect.status_code == 303 and redirect.headers["location"] == url
                assert (await http.get(base, params={"redirect": "0"})).json()["url"] == url   # one view
            port = urlsplit(url).port
            assert urlsplit(url).hostname == "127.0.0.1"
            other = _other_address()
            if other is not None:   # bound to loopback: another interface of this machine is refused
                with pytest.raises(OSError):
                    socket.create_connection((other, port), timeout=2).close()

            first = watch(browser, url)

            # view-only: keys typed into the page never reach the desktop
            desktop_before = Image.open(io.BytesIO(await client.screenshot(eid))).convert("RGB")
            from selenium.webdriver.common.action_chains import ActionChains
            ActionChains(browser).move_to_element(browser.find_element("css selector", "#screen canvas")) \
                .click().send_keys("viewer typed this").perform()
            time.sleep(1.0)
            desktop_after = Image.open(io.BytesIO(await client.screenshot(eid))).convert("RGB")
            assert _changed_pixels(desktop_before, desktop_after) == 0

            # the agent types: the picture in the page changes
            reply = await client.act(eid, {"type": "type", "text": "Hello from the agent " * 3})
            assert reply["ok"]
            changed = wait_for(browser, lambda d: _changed_pixels(first, _canvas(d)) > 500 or None, timeout=15)
            assert changed
            print(f"live view: {_changed_pixels(first, _canvas(browser))} pixels changed after typing")

            running = (pids("^x11vnc") | pids("websockify")) - before
            assert len(running) >= 2, running
            await client.terminate(eid)
        assert (pids("^x11vnc") | pids("websockify")) - before == set()
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
