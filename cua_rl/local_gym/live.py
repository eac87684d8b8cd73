"""A live view of one execution's screen in the browser: view-only VNC through noVNC.

Why: watching an agent work (or stall) on its desktop tells a researcher more in ten seconds than a page of
logs. The monitor's rollout page links to ``GET /api/v1/{gym}/executions/{id}/live`` on the gym, which starts
the view on first use and redirects to it; nothing runs for executions nobody watches.

One view is two processes, both from Debian (``x11vnc``, ``websockify`` with ``novnc``'s pages):
- ``x11vnc`` on the execution's X display, view-only (the server ignores every input event, whatever the
  page sends), on a loopback port;
- ``websockify`` serving noVNC's page and bridging its WebSocket to that port, bound to 127.0.0.1 unless the
  gym is told another address (``GymOptions.live_view_host``, ``--live-view-host``): there is no password,
  so anyone who can reach the port sees the screen.
Both end with the execution (``GymManager.terminate``, the reaper and the gym's close all end there), and the
kernel kills them if the gym dies (``procs.popen``). VM desktops (no X display) have no live view yet.
"""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..http.serve import free_port
from . import procs

logger = logging.getLogger(__name__)

NOVNC = Path("/usr/share/novnc")
BINARIES = {"x11vnc": "x11vnc", "websockify": "websockify"}   # binary -> Debian package (novnc: the pages)


class LiveViewError(RuntimeError):
    """The live view cannot start; the message says what is missing."""


def missing() -> list[str]:
    """What this machine lacks for live views (Debian package names); empty when it has everything."""
    lack = [pkg for binary, pkg in BINARIES.items() if shutil.which(binary) is None]
    if not (NOVNC / "vnc_lite.html").exists():
        lack.append("novnc")
    return lack


def _wait_listening(host: str, port: int, proc: subprocess.Popen, what: str, timeout_s: float) -> None:
    host = "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LiveViewError(f"{what} exited with code {proc.returncode} before listening")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise LiveViewError(f"{what} did not listen on port {port} within {timeout_s:g} s")


@dataclass
class LiveView:
    """The running view of one X display; ``path`` is the noVNC page on ``host:port``."""

    display: str
    host: str
    port: int = 0
    procs: list[subprocess.Popen] = field(default_factory=list)

    @classmethod
    def start(cls, display: str, host: str = "127.0.0.1", log_dir: Path | None = None,
              timeout_s: float = 10.0) -> "LiveView":
        lack = missing()
        if lack:
            raise LiveViewError(f"live views need the Debian packages {' '.join(lack)} (scripts/apt-packages.txt)")
        view = cls(display=display, host=host)
        try:
            view._start(log_dir, timeout_s)
        except BaseException:
            view.stop()
            raise
        return view

    def _start(self, log_dir: Path | None, timeout_s: float) -> None:
        rfb = free_port("127.0.0.1")
        log = open(log_dir / "live.log", "ab") if log_dir else subprocess.DEVNULL
        try:
            # -noshm: the X server runs under the desktop's uid and refuses x11vnc's (root's) shared memory
            vnc = procs.popen(["x11vnc", "-display", self.display, "-viewonly", "-shared", "-forever", "-nopw",
                               "-localhost", "-rfbport", str(rfb), "-quiet", "-nossl", "-noipv6", "-noshm"],
                              env={"PATH": "/usr/bin:/bin"}, stdout=log, stderr=log)
            self.procs.append(vnc)
            _wait_listening("127.0.0.1", rfb, vnc, "x11vnc", timeout_s)
            self.port = free_port(self.host)
            web = procs.popen(["websockify", "--web", str(NOVNC), f"{self.host}:{self.port}", f"127.0.0.1:{rfb}"],
                              env={"PATH": "/usr/bin:/bin"}, stdout=log, stderr=log)
            self.procs.append(web)
            _wait_listening(self.host, self.port, web, "websockify", timeout_s)
        finally:
            if log is not subprocess.DEVNULL:
                log.close()
        logger.info("live view of %s on %s:%d", self.display, self.host, self.port)

    @property
    def path(self) -> str:
        """noVNC's page, connecting at once, view-only, scaled to the window."""
        return "/vnc_lite.html?autoconnect=true&view_only=true&scale=true&path=websockify"

    def url(self, host: str | None = None) -> str:
        """The page's address (``host``: how the viewer reaches this machine; default the bound address)."""
        return f"http://{host or self.host}:{self.port}{self.path}"

    @property
    def alive(self) -> bool:
        return bool(self.procs) and all(p.poll() is None for p in self.procs)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            procs.kill_group(proc)
        self.procs.clear()
