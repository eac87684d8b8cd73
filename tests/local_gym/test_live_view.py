"""The live view (local_gym/live.py) in real headless Chromium: the gym's ``/live`` route starts x11vnc and
websockify for an execution's desktop and redirects to noVNC's page; the page shows the desktop, and the
picture changes after the agent types; it is view-only (keys typed into the page change nothing on the
desktop); it listens on 127.0.0.1 only; terminating the execution ends it. And the desktop cannot reconfigure
its view (issue 66): the attack played from its own terminal changes nothing (a viewer over RFB, rfb_viewer.py)."""

from __future__ import annotations

import asyncio
import io
import os
import secrets
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import httpx
import pytest
from PIL import Image

from cua_rl.genv import GenvClient
from cua_rl.local_gym import live
from cua_rl.local_gym.procs import wait_until
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


def _uid_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("Uid:")).split()[1])


def _connections(listener: socket.socket) -> int:
    """How many connections ``listener`` has waiting (it never accepts them for real)."""
    count = 0
    listener.setblocking(False)
    while True:
        try:
            listener.accept()[0].close()
            count += 1
        except BlockingIOError:
            return count


async def test_a_desktop_cannot_reconfigure_its_live_view(tmp_path):
    """The attack of issue 66, from inside a desktop with gym actions only, after /live was opened: commands
    typed into the desktop's xterm ask x11vnc (through root-window properties) to turn view-only off, turn file
    transfer on and connect out to a listener of the host, twice (remote control and VNC_CONNECT). Nothing
    changes: x11vnc runs as the desktop's uid, a viewer's keys reach nothing, a root-only host file cannot be
    fetched, nobody connects out; and a page of another origin cannot open the view's WebSocket at all."""
    from rfb_viewer import RFBViewer

    secret = "HOST-SECRET-" + secrets.token_hex(8)
    secret_file = Path(f"/tmp/cua-live-secret-{secrets.token_hex(4)}")
    secret_file.write_text(secret + "\n")
    os.chmod(secret_file, 0o600)                        # the gym's (root's) alone
    remote, vncconnect = socket.create_server(("127.0.0.1", 0)), socket.create_server(("127.0.0.1", 0))
    before = pids("^x11vnc")
    try:
        with start_gym_server(gym_id="desktop", pool_size=0, x_spares=0) as gym:
            async with GenvClient(gym.url, gym.gym_id) as client:
                eid = (await client.create_execution("012")).execution_id     # xterm, focused
                desk = gym.manager.executions[eid].desktop
                async with httpx.AsyncClient(timeout=30) as http:
                    url = (await http.get(f"{gym.url}/api/v1/{gym.gym_id}/executions/{eid}/live",
                                          params={"redirect": "0"})).json()["url"]
                origin = f"http://127.0.0.1:{urlsplit(url).port}"
                ws_url = f"ws://127.0.0.1:{urlsplit(url).port}/websockify"

                vnc = pids("^x11vnc") - before
                assert vnc and {_uid_of(p) for p in vnc} == {desk.uid}, "x11vnc runs as the desktop's uid"
                with pytest.raises(aiohttp.WSServerHandshakeError):   # another site's page, same browser
                    async with RFBViewer.open(ws_url, "http://attacker.example"):
                        pass

                attack = ("for c in noviewonly ultrafilexfer connect:127.0.0.1:%d; do "
                          "xprop -root -f X11VNC_REMOTE 8s -set X11VNC_REMOTE cmd=$c; sleep 0.4; done; "
                          "xprop -root -f VNC_CONNECT 8s -set VNC_CONNECT 127.0.0.1:%d; sleep 0.6; "
                          "echo done > attack.txt\n" % (remote.getsockname()[1], vncconnect.getsockname()[1]))
                assert (await client.act(eid, {"type": "type", "text": attack}))["ok"]
                assert await asyncio.to_thread(wait_until, (desk.home / "attack.txt").exists, 15.0), \
                    "the attack never finished in the desktop's terminal"

                async with RFBViewer.open(ws_url, origin) as viewer:   # the page's own origin: accepted
                    await viewer.handshake()
                    await viewer.type_text("touch viewer-typed.txt\n")
                    fetched = await viewer.fetch_file(str(secret_file))
                await asyncio.sleep(1.0)
                assert fetched is None or secret.encode() not in fetched, "a viewer read a root-only host file"
                assert not (desk.home / "viewer-typed.txt").exists(), "a viewer's keys reached the desktop"
                assert _connections(remote) == 0, "x11vnc connected out (remote control 'connect')"
                assert _connections(vncconnect) == 0, "x11vnc connected out (VNC_CONNECT)"
                await client.terminate(eid)
    finally:
        secret_file.unlink()
        remote.close()
        vncconnect.close()
