"""A live view of one execution's screen in the browser: view-only VNC through noVNC.

Why: watching an agent work (or stall) on its desktop tells a researcher more in ten seconds than a page of
logs. The monitor's rollout page links to ``GET /api/v1/{gym}/executions/{id}/live`` on the gym, which starts
the view on first use and redirects to it; nothing runs for executions nobody watches.

One view is a VNC server, ``ViewOnlyRFB`` and ``websockify`` (Debian's, with ``novnc``'s pages):
- an X desktop or browser: ``x11vnc`` on the execution's X display, on a loopback port. The desktop is hostile
  (the policy types into its terminal), and every X client on the display can talk to x11vnc through root-window
  properties (``X11VNC_REMOTE``: remote control, ``VNC_CONNECT``: reverse connections). So x11vnc runs as the
  desktop's own uid (``Desktop.uid``: what its apps run as), view-only, with ``-safer -noremote -novncconnect
  -nocmds`` (no remote control, no reverse connections, no commands), no rc file and no selection exchange;
- a VM: QEMU's own VNC server, which the machine has from its start without a listener (``-vnc none``) and opens
  on a loopback port on request (QMP ``display-update``);
- either way the page reaches the server only through ``ViewOnlyRFB``, a proxy that passes the picture and drops
  every key, pointer and clipboard message (QEMU has no view-only mode; for x11vnc it is a second wall);
- ``websockify`` serving noVNC's page and bridging its WebSocket to the proxy, bound to 127.0.0.1 unless the
  gym is told another address (``GymOptions.live_view_host``, ``--live-view-host``): there is no password,
  so anyone who can reach the port sees the screen. It accepts a WebSocket only from its own page's origin
  (websockify's ``ExpectOrigin``, ``page_origins``), so no other web site open in the viewer's browser can.
Both end with the execution (``GymManager.terminate``, the reaper and the gym's close all end there), and the
kernel kills them if the gym dies (``procs.popen``). docs/security.md says what this promises and how it is tested.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import struct
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..http.serve import free_port
from . import procs

logger = logging.getLogger(__name__)

NOVNC = Path("/usr/share/novnc")
BINARIES = {"x11vnc": "x11vnc", "websockify": "websockify"}   # binary -> Debian package (novnc: the pages)
WILDCARDS = ("0.0.0.0", "::", "")   # a view bound to one of these listens on every interface
LOOPBACK = ("127.0.0.1", "localhost", "::1")
# x11vnc, safe by construction: view-only, loopback only, no password (the proxy and websockify guard the way in),
# and nothing a client of the display can reach: no remote control (-noremote) or reverse connections
# (-novncconnect), both again in -safer; no external commands (-nocmds), no rc file, no selection exchange, no
# shared memory, no DNS.
X11VNC_FLAGS = ("-viewonly", "-shared", "-forever", "-nopw", "-localhost", "-quiet", "-nossl", "-noipv6", "-noshm",
                "-safer", "-noremote", "-novncconnect", "-nocmds", "-norc", "-nosel", "-nolookup")


class LiveViewError(RuntimeError):
    """The live view cannot start; the message says what is missing."""


def missing() -> list[str]:
    """What this machine lacks for live views (Debian package names); empty when it has everything."""
    lack = [pkg for binary, pkg in BINARIES.items() if shutil.which(binary) is None]
    if not (NOVNC / "vnc_lite.html").exists():
        lack.append("novnc")
    return lack


def _wait_listening(host: str, port: int, proc: subprocess.Popen, what: str, timeout_s: float) -> None:
    if host in WILDCARDS:
        host = "::1" if host == "::" else "127.0.0.1"
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


def _url_host(name: str) -> str:
    return f"[{name}]" if ":" in name else name


def _machine_names() -> set[str]:
    """This machine's names and addresses, as a viewer may put them in its address bar."""
    names = {*LOOPBACK, socket.gethostname(), socket.getfqdn()}
    for name in (socket.gethostname(), socket.getfqdn()):
        try:
            names |= {info[4][0] for info in socket.getaddrinfo(name, None)}
        except OSError:
            continue
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:   # the address of the default route
        try:
            probe.connect(("192.0.2.1", 9))
            names.add(probe.getsockname()[0])
        except OSError:
            pass
    return names


def page_origins(host: str, port: int) -> list[str]:
    """The origins noVNC's page has when served by a view on ``host:port``: the only ones whose WebSocket the
    view accepts. A view on one address: that address (and the loopback names for a loopback view); on every
    interface: this machine's names and addresses (``_machine_names``)."""
    if host in WILDCARDS:
        names = _machine_names()
    elif host in LOOPBACK:
        names = set(LOOPBACK)
    else:
        names = {host}
    return sorted(f"http://{_url_host(n)}:{port}" for n in names if n)


@dataclass
class LiveView:
    """The running view of one desktop; ``path`` is the noVNC page on ``host:port``."""

    display: str
    host: str
    port: int = 0
    procs: list[subprocess.Popen] = field(default_factory=list)
    proxy: "ViewOnlyRFB | None" = None

    @classmethod
    def start(cls, display: str, host: str = "127.0.0.1", log_dir: Path | None = None,
              timeout_s: float = 10.0, vnc: Callable[[int], None] | None = None,
              uid: int | None = None, xauthority: Path | None = None) -> "LiveView":
        """A view of X display ``display`` (x11vnc runs as ``uid``, the desktop's, presenting the display's cookie
        from ``xauthority``), or, with ``vnc``, of the VNC server that ``vnc(port)`` opens on a loopback port (a
        VM's QEMU); both behind ``ViewOnlyRFB``."""
        lack = missing() if vnc is None else [p for p in missing() if p != "x11vnc"]
        if lack:
            raise LiveViewError(f"live views need the Debian packages {' '.join(lack)} (scripts/apt-packages.txt)")
        view = cls(display=display, host=host)
        try:
            view._start(log_dir, timeout_s, vnc, uid, xauthority)
        except BaseException:
            view.stop()
            raise
        return view

    def _start(self, log_dir: Path | None, timeout_s: float, vnc_opener: Callable[[int], None] | None,
               uid: int | None, xauthority: Path | None = None) -> None:
        rfb = free_port("127.0.0.1")
        log = open(log_dir / "live.log", "ab") if log_dir else subprocess.DEVNULL
        try:
            if vnc_opener is None:
                if uid is None or (os.geteuid() == 0 and uid == 0):
                    raise LiveViewError("x11vnc runs as the desktop's uid, and none was given (or it is root)")
                env = {"PATH": "/usr/bin:/bin", **({"XAUTHORITY": str(xauthority)} if xauthority else {})}
                vnc = procs.popen(["x11vnc", "-display", self.display, "-rfbport", str(rfb), *X11VNC_FLAGS],
                                  uid=uid, env=env, stdout=log, stderr=log)
                self.procs.append(vnc)
                _wait_listening("127.0.0.1", rfb, vnc, "x11vnc", timeout_s)
            else:
                try:
                    vnc_opener(rfb)
                except Exception as exc:  # noqa: BLE001 - e.g. QEMU refused; the route says why
                    raise LiveViewError(f"the machine's VNC server did not open: {exc}") from exc
            self.proxy = ViewOnlyRFB(("127.0.0.1", rfb))
            self.port = free_port(self.host)
            web = procs.popen(["websockify", "--web", str(NOVNC), "--auth-plugin", "ExpectOrigin",
                               "--auth-source", " ".join(page_origins(self.host, self.port)),
                               f"{self.host}:{self.port}", f"127.0.0.1:{self.proxy.port}"],
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

    def url(self, viewer_host: str | None = None) -> str:
        """The page's address: on the bound address, or, when the view listens on every interface, on
        ``viewer_host`` (the name the viewer used to reach the gym) when given."""
        host = viewer_host if self.host in WILDCARDS and viewer_host else self.host
        return f"http://{host}:{self.port}{self.path}"

    @property
    def alive(self) -> bool:
        return bool(self.procs) and all(p.poll() is None for p in self.procs)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            procs.kill_group(proc)
        self.procs.clear()
        if self.proxy is not None:
            self.proxy.close()
            self.proxy = None


# RFB client-to-server messages (RFC 6143 §7.5 and the extensions noVNC sends): type -> its length from what
# has arrived (None: more bytes are needed), and whether it is input that a view-only viewer must not send.
def _fixed(n: int) -> Callable[[bytes], int | None]:
    return lambda b: n if len(b) >= n else None


def _counted(header: int, fmt: str, offset: int, unit: int) -> Callable[[bytes], int | None]:
    def size(b: bytes) -> int | None:
        if len(b) < header:
            return None
        return header + unit * struct.unpack_from(fmt, b, offset)[0]
    return size


def _qemu(b: bytes) -> int | None:   # QEMU's messages (255): extended key event (0), audio (1)
    if len(b) < 2:
        return None
    if b[1] == 0:
        return 12
    if len(b) < 4:
        return None
    op = struct.unpack_from(">H", b, 2)[0]
    return 10 if op == 2 else 4       # audio: enable/disable (4 bytes), set format (10)


_MESSAGES: dict[int, tuple[Callable[[bytes], int | None], bool]] = {
    0: (_fixed(20), False),                      # SetPixelFormat
    2: (_counted(4, ">H", 2, 4), False),         # SetEncodings
    3: (_fixed(10), False),                      # FramebufferUpdateRequest
    4: (_fixed(8), True),                        # KeyEvent
    5: (_fixed(6), True),                        # PointerEvent
    6: (lambda b: None if len(b) < 8 else 8 + abs(struct.unpack_from(">i", b, 4)[0]), True),   # ClientCutText
    #                                            (a negative length: the extended clipboard's)
    150: (_fixed(10), False),                    # EnableContinuousUpdates
    248: (_counted(9, ">B", 8, 1), False),       # ClientFence
    251: (_counted(8, ">B", 6, 16), True),       # SetDesktopSize: changes the machine's screen
    255: (_qemu, True),                          # QEMU: key events and audio
}


class ViewOnlyRFB:
    """A loopback RFB proxy that passes everything the server sends and, of what the viewer sends, only the
    handshake and picture requests: key, pointer, clipboard and resize messages are dropped (counted in
    ``dropped``). An unknown message ends that viewer's connection. Threads: one accept loop, two per viewer."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.dropped = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name=f"rfb-view-{self.port}", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                viewer, _ = self._listener.accept()
                server = socket.create_connection(self.target, timeout=10)
                server.settimeout(None)
            except OSError:
                return   # closed (or the VNC server is gone: the viewer's connection just ends)
            with self._lock:
                self._conns += [viewer, server]
            threading.Thread(target=self._pump, args=(server, viewer), daemon=True).start()
            threading.Thread(target=self._filter, args=(viewer, server), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            self._end(src, dst)

    def _filter(self, viewer: socket.socket, server: socket.socket) -> None:
        buf = b""

        def need(n: int) -> bytes:
            nonlocal buf
            while len(buf) < n:
                chunk = viewer.recv(65536)
                if not chunk:
                    raise ConnectionError("viewer closed")
                buf += chunk
            out, buf = buf[:n], buf[n:]
            return out

        try:
            version = need(12)                      # "RFB 003.008\n"
            server.sendall(version)
            if version[4:11] != b"003.003":
                security = need(1)                  # the security type the viewer picked
                server.sendall(security)
                if security == b"\x02":
                    server.sendall(need(16))        # VNC authentication's response
            server.sendall(need(1))                 # ClientInit
            while True:
                while not buf:
                    chunk = viewer.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                kind = _MESSAGES.get(buf[0])
                if kind is None:
                    logger.warning("live view: unknown RFB message %d from a viewer; connection closed", buf[0])
                    return
                size, is_input = kind
                while (n := size(buf)) is None or len(buf) < n:
                    chunk = viewer.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                message, buf = buf[:n], buf[n:]
                if is_input:
                    self.dropped += 1
                else:
                    server.sendall(message)
        except OSError:
            pass
        finally:
            self._end(viewer, server)

    def _end(self, *socks: socket.socket) -> None:
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            conns, self._conns = self._conns, []
        self._end(*conns)
