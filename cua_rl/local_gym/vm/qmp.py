"""A minimal client of QEMU's machine protocol (QMP): one JSON command at a time over a Unix socket.

Why our own: QMP is a few lines of JSON (a greeting, ``qmp_capabilities``, then ``{"execute": ...}`` /
``{"return": ...}`` or ``{"error": ...}``, with asynchronous ``{"event": ...}`` lines in between), and the VM
desktop needs only a handful of commands (``screendump``, ``input-send-event``, ``stop``/``cont``,
``human-monitor-command`` for savevm/loadvm, ``quit``). Blocking and thread-safe: the gym calls it from its
worker threads like the X11 desktops' input and screen code.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque


class QMPError(RuntimeError):
    """QEMU answered a command with an error (its class and description), or the connection failed."""


class QMP:
    def __init__(self, path: str, *, timeout_s: float = 10.0) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout_s)
        self._lock = threading.Lock()
        self._buf = b""
        self.events: deque[dict] = deque(maxlen=256)   # asynchronous events seen so far (newest last)
        try:
            self._sock.connect(path)
            greeting = self._read()
            if "QMP" not in greeting:
                raise QMPError(f"not a QMP greeting: {greeting!r:.200}")
            self.execute("qmp_capabilities")
        except BaseException:
            self._sock.close()
            raise

    @classmethod
    def connect(cls, path: str, timeout_s: float, alive=lambda: True) -> "QMP":
        """Connect once QEMU listens on ``path`` (it creates the socket while starting); ``alive`` says
        whether waiting still makes sense (the process has not exited)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return cls(path)
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline or not alive():
                    raise
                time.sleep(0.02)

    def _read(self) -> dict:
        while b"\n" not in self._buf:
            chunk = self._sock.recv(65536)
            if not chunk:
                raise QMPError("QEMU closed the QMP connection")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def execute(self, command: str, **arguments) -> object:
        """Run one command; its ``return`` value, or ``QMPError`` with QEMU's description."""
        msg = {"execute": command, **({"arguments": arguments} if arguments else {})}
        with self._lock:
            self._sock.sendall(json.dumps(msg).encode() + b"\n")
            while True:
                reply = self._read()
                if "event" in reply:
                    self.events.append(reply)
                    continue
                if "error" in reply:
                    err = reply["error"]
                    raise QMPError(f"{command}: {err.get('class')}: {err.get('desc')}")
                return reply.get("return")

    def hmp(self, command_line: str) -> str:
        """A human-monitor command (savevm, loadvm, ...): its text output (QEMU reports their errors there)."""
        out = self.execute("human-monitor-command", **{"command-line": command_line})
        return out if isinstance(out, str) else ""

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass
