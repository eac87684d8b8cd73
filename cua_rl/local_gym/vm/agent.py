"""A client of the QEMU guest agent (``qemu-ga``, Linux and Windows guests): files and commands inside a VM,
for task set-up and validators. Seeing and acting never need it (QMP does those, ``machine.py``).

The agent talks JSON over the VM's virtio-serial port, which QEMU exposes as a Unix socket on the host
(``Machine.argv``). Four things make it unlike QMP:
- it has no greeting and no sense of a connection: bytes sent while the guest has not opened its end yet
  wait in QEMU and are answered once the guest's agent starts, late. So one persistent connection, and
  ``sync`` sends ``guest-sync-delimited`` with a fresh id until a reply carries *that* id, skipping stale
  replies; a ``call`` that timed out makes the next one sync first (the protocol asks for it: the late reply
  would otherwise answer the next command);
- its JSON parser outlives our connections: a request cut short (a connection closed while QEMU had passed
  only part of it to the guest, or a machine saved then) stays in it, and every later request is read as
  part of that one, never answered. So each sync is preceded by a 0xFF byte, which the parser takes as an
  error and starts afresh from (the protocol's flush; its error reply is skipped as stale);
- a reply may follow a partial line left by an earlier, interrupted exchange, so unparsable lines are
  dropped (the delimited sync's reply starts with a 0xFF byte; those bytes are dropped too);
- commands are asynchronous in the guest: ``guest-exec`` returns a pid whose status is polled.
Blocking and thread-safe like ``QMP``; every call has its own timeout.
"""

from __future__ import annotations

import base64
import json
import secrets
import socket
import threading
import time

MAX_READ = 1 << 20    # bytes read from a guest file at most (the validators' limit too)
CHUNK = 48 << 10      # guest-file-read/write per call
FLUSH = b"\xff"       # not valid in JSON: the agent's parser drops what it holds and starts afresh


class GuestAgentError(RuntimeError):
    """The agent did not answer in time, refused a command, or the channel closed."""


class GuestAgent:
    def __init__(self, path: str) -> None:
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(path)
        self._buf = b""
        self._lock = threading.Lock()
        self._unsynced = False   # a call timed out: its reply may still come, so the next call syncs first

    @classmethod
    def connect(cls, path: str, timeout_s: float, alive=lambda: True) -> "GuestAgent":
        """Connect and wait until the guest's agent answers (it starts late in the guest's boot)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                agent = cls(path)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline or not alive():
                    raise GuestAgentError(f"no guest agent socket at {path}") from None
                time.sleep(0.05)
        try:
            agent.sync(max(0.1, deadline - time.monotonic()), alive)
        except BaseException:
            agent.close()
            raise
        return agent

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass

    # -- the wire -----------------------------------------------------------------------------------
    def _send(self, command: str, arguments: dict | None) -> None:
        msg = {"execute": command, **({"arguments": arguments} if arguments else {})}
        self._sock.sendall(json.dumps(msg).encode() + b"\n")

    def _read(self, deadline: float) -> dict | None:
        """The next parsable reply, or None at ``deadline``."""
        while True:
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._sock.settimeout(left)
                try:
                    chunk = self._sock.recv(65536)
                except socket.timeout:
                    return None
                if not chunk:
                    raise GuestAgentError("the guest agent channel closed")
                self._buf += chunk
            line, self._buf = self._buf.split(b"\n", 1)
            line = line.replace(b"\xff", b"").strip()
            if not line:
                continue
            try:
                reply = json.loads(line)
            except ValueError:
                continue   # the tail of an interrupted exchange
            if isinstance(reply, dict):
                return reply

    def sync(self, timeout_s: float, alive=lambda: True) -> None:
        """Wait until the agent answers a ``guest-sync-delimited`` of our own, each preceded by the parser's
        flush (sent again every second)."""
        with self._lock:
            self._sync(timeout_s, alive)

    def _sync(self, timeout_s: float, alive=lambda: True) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and alive():
            token = secrets.randbelow(1 << 31)
            self._sock.sendall(FLUSH)
            self._send("guest-sync-delimited", {"id": token})
            wait = min(deadline, time.monotonic() + 1.0)
            while (reply := self._read(wait)) is not None:
                if reply.get("return") == token:
                    self._unsynced = False
                    return
        raise GuestAgentError(f"the guest agent did not answer within {timeout_s:.0f} s")

    def call(self, command: str, timeout_s: float = 10.0, **arguments) -> object:
        """One command; its ``return`` value, or ``GuestAgentError`` with the agent's description. After a
        call that timed out, the channel is synced first (within the same ``timeout_s``)."""
        with self._lock:
            if self._unsynced:
                self._sync(timeout_s)
            self._send(command, arguments)
            reply = self._read(time.monotonic() + timeout_s)
            if reply is None:
                self._unsynced = True
        if reply is None:
            raise GuestAgentError(f"{command}: no answer from the guest agent within {timeout_s:.0f} s")
        if "error" in reply:
            err = reply["error"]
            raise GuestAgentError(f"{command}: {err.get('class')}: {err.get('desc')}")
        return reply.get("return")

    # -- what the gym uses --------------------------------------------------------------------------
    def exec(self, argv: list[str], timeout_s: float = 30.0, stdin: bytes | None = None) -> tuple[int, bytes, bytes]:
        """Run ``argv`` in the guest and wait: (exit code, stdout, stderr). Over ``timeout_s``: an error
        (the command keeps running in the guest; the VM is ended with its execution anyway)."""
        args: dict = {"path": argv[0], "arg": argv[1:], "capture-output": True}
        if stdin is not None:
            args["input-data"] = base64.b64encode(stdin).decode()
        pid = self.call("guest-exec", **args)["pid"]
        deadline, wait = time.monotonic() + timeout_s, 0.002   # most set-up commands end in milliseconds
        while True:
            st = self.call("guest-exec-status", pid=pid)
            if st.get("exited"):
                out = base64.b64decode(st.get("out-data", ""))
                err = base64.b64decode(st.get("err-data", ""))
                return int(st.get("exitcode", -1)), out, err
            if time.monotonic() > deadline:
                raise GuestAgentError(f"{argv[0]} did not finish in the guest within {timeout_s:.0f} s")
            time.sleep(wait)
            wait = min(0.05, wait * 2)

    def read_file(self, path: str, limit: int = MAX_READ) -> bytes | None:
        """Up to ``limit`` bytes of a guest file; None when it cannot be opened (missing, a folder)."""
        try:
            handle = self.call("guest-file-open", path=path, mode="rb")
        except GuestAgentError:
            return None
        data = b""
        try:
            while len(data) < limit:
                chunk = self.call("guest-file-read", handle=handle, count=min(CHUNK, limit - len(data)))
                data += base64.b64decode(chunk.get("buf-b64", ""))
                if chunk.get("eof") or not chunk.get("count"):
                    break
        finally:
            self.call("guest-file-close", handle=handle)
        return data

    def write_file(self, path: str, data: bytes) -> None:
        """Create or replace a guest file (its folder must exist)."""
        handle = self.call("guest-file-open", path=path, mode="wb")
        try:
            for at in range(0, len(data), CHUNK):
                self.call("guest-file-write", handle=handle, **{"buf-b64": base64.b64encode(data[at:at + CHUNK]).decode()})
        finally:
            self.call("guest-file-close", handle=handle)

    def set_time(self) -> None:
        """Set the guest's clock to the host's (a VM resumed from a saved state wakes at the save's time)."""
        self.call("guest-set-time", time=time.time_ns())
