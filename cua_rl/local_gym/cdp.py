"""A Chrome DevTools Protocol client over Chromium's ``--remote-debugging-pipe`` (fds 3 and 4 of the browser).

Why the pipe and not a port: the browser runs in a sandbox with no network at all, so a DevTools port
would only exist inside the sandbox's own network namespace. The pipe is two plain file descriptors that
the gym keeps; nothing listens anywhere, and only the gym can drive the browser.

Wire format: JSON messages, each terminated by a NUL byte. Replies carry the request's ``id``; events
carry a ``method`` (and the ``sessionId`` of the page they come from). One reader thread per browser
resolves replies (``concurrent.futures.Future``) and hands events to the handlers registered with ``on``;
handlers run on that thread and must be quick. ``call`` blocks; ``acall`` is the asyncio form.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from concurrent.futures import Future, InvalidStateError
from typing import Any, Callable

logger = logging.getLogger(__name__)

EventHandler = Callable[[dict, str | None], None]   # (params, session id)


class CDPError(RuntimeError):
    """The browser answered a command with an error, or the pipe is closed."""


class CDPPipe:
    """Owns the gym's ends of the two pipes: ``send_fd`` (browser reads it as fd 3), ``recv_fd`` (fd 4)."""

    def __init__(self, send_fd: int, recv_fd: int, name: str = "browser") -> None:
        self._send_fd, self._recv_fd = send_fd, recv_fd
        self._name = name
        self._lock = threading.Lock()           # one writer at a time; also guards _next_id and _pending
        self._next_id = 0
        self._pending: dict[int, Future] = {}
        self._handlers: dict[str, EventHandler] = {}
        self._closed = False
        self._reader = threading.Thread(target=self._read_loop, name=f"cdp-{name}", daemon=True)
        self._reader.start()

    # -- sending ------------------------------------------------------------------------------------
    def send(self, method: str, params: dict | None = None, session: str | None = None) -> Future:
        """Send one command; the future gets its ``result`` dict or a ``CDPError``."""
        fut: Future = Future()
        with self._lock:
            if self._closed or self._send_fd < 0:
                fut.set_exception(CDPError(f"{self._name}: DevTools pipe is closed"))
                return fut
            self._next_id += 1
            msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
            if session is not None:
                msg["sessionId"] = session
            self._pending[self._next_id] = fut
            data = json.dumps(msg, separators=(",", ":")).encode() + b"\0"
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(self._send_fd, view):]
            except OSError as exc:
                self._pending.pop(self._next_id, None)
                fut.set_exception(CDPError(f"{self._name}: cannot write to the DevTools pipe: {exc}"))
        return fut

    def call(self, method: str, params: dict | None = None, session: str | None = None,
             timeout_s: float = 10.0) -> dict:
        """Blocking command; raises ``CDPError`` (or ``TimeoutError``)."""
        return self.send(method, params, session).result(timeout_s)

    async def acall(self, method: str, params: dict | None = None, session: str | None = None,
                    timeout_s: float = 10.0) -> dict:
        return await asyncio.wait_for(asyncio.wrap_future(self.send(method, params, session)), timeout_s)

    def on(self, method: str, handler: EventHandler) -> None:
        """Run ``handler(params, session_id)`` on the reader thread for every ``method`` event."""
        self._handlers[method] = handler

    # -- receiving ----------------------------------------------------------------------------------
    def _read_loop(self) -> None:
        buf = bytearray()
        try:
            while True:
                try:
                    chunk = os.read(self._recv_fd, 1 << 20)
                except OSError:
                    break
                if not chunk:
                    break
                buf += chunk
                while (end := buf.find(b"\0")) >= 0:
                    raw = bytes(buf[:end])
                    del buf[:end + 1]
                    self._dispatch(raw)
        finally:
            self._fail_pending("the browser closed its DevTools pipe (it exited)")
            try:
                os.close(self._recv_fd)
            except OSError:
                pass

    def _dispatch(self, raw: bytes) -> None:
        try:
            msg = json.loads(raw)
        except ValueError:
            logger.warning("%s: unreadable DevTools message %r", self._name, raw[:200])
            return
        if "id" in msg:
            with self._lock:
                fut = self._pending.pop(msg["id"], None)
            if fut is None:
                return
            try:
                if "error" in msg:
                    err = msg["error"]
                    fut.set_exception(CDPError(f"{err.get('message', err)} ({err.get('data', '')})".strip()))
                else:
                    fut.set_result(msg.get("result", {}))
            except InvalidStateError:   # its caller gave up (acall's timeout cancelled it): nobody to tell; the
                pass                    # reader must go on (it died here, and the gym built a new browser)
            return
        handler = self._handlers.get(msg.get("method", ""))
        if handler is not None:
            try:
                handler(msg.get("params", {}), msg.get("sessionId"))
            except Exception:  # noqa: BLE001 - a handler bug must not stop the reader
                logger.exception("%s: handler of %s failed", self._name, msg.get("method"))

    def _fail_pending(self, why: str) -> None:
        with self._lock:
            self._closed = True
            pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(CDPError(f"{self._name}: {why}"))

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, join_s: float = 0.0) -> None:
        """Close the gym's sending end. The reader closes the receiving end itself once the browser's end
        is gone (the browser exited), so no fd is ever closed under a thread blocked reading it."""
        self._fail_pending("closed by the gym")
        with self._lock:
            fd, self._send_fd = self._send_fd, -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass
        if join_s > 0:
            self._reader.join(join_s)
