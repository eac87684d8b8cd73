"""Screenshots of one display through MIT-SHM (mss ``xshmgetimage``), and waiting for the screen to settle.

Why raw-frame comparison: "the screen has settled" means two grabs a little apart are byte-identical;
a grab is ~0.25 ms and comparing two 4 MB frames is a memcmp, so polling every few ms is cheap.
Encoded images are cached per frame: the agent's screenshot right after an action is usually the very
frame the action's settle wait ended on, which ``prepare`` has already started encoding.
"""

from __future__ import annotations

import io
import threading
import time
from concurrent.futures import Future

import mss
from PIL import Image


class Screen:
    def __init__(self, display_name: str) -> None:
        self._mss = mss.MSS(display=display_name, backend="xshmgetimage")
        self._lock = threading.Lock()
        mon = self._mss.monitors[0]
        self.width, self.height = mon["width"], mon["height"]
        self._monitor = {"left": 0, "top": 0, "width": self.width, "height": self.height}
        self._cache_lock = threading.Lock()
        self._cache_frame: bytearray | None = None
        self._cache: dict[tuple[str, int], Future] = {}

    def close(self) -> None:
        with self._lock:
            try:
                self._mss.close()
            except Exception:  # the X server may already be gone
                pass

    @property
    def uses_shm(self) -> bool:
        status = getattr(getattr(self._mss, "_impl", self._mss), "shm_status", None)
        return status is not None and status.name == "AVAILABLE"

    def grab(self) -> bytearray:
        """One raw BGRA frame (a private copy)."""
        with self._lock:
            return self._mss.grab(self._monitor).raw

    def _encode_now(self, raw: bytearray, fmt: str, quality: int) -> bytes:
        img = Image.frombuffer("RGB", (self.width, self.height), bytes(raw), "raw", "BGRX", 0, 1)
        out = io.BytesIO()
        if fmt == "png":
            img.save(out, "PNG", compress_level=1)
        else:
            img.save(out, "JPEG", quality=quality)
        return out.getvalue()

    def cached(self, raw: bytearray, fmt: str, quality: int = 85) -> bytes | None:
        """The finished encoding of an identical frame, if there is one (non-blocking)."""
        with self._cache_lock:
            if self._cache_frame is None or self._cache_frame != raw:
                return None
            fut = self._cache.get((fmt, quality if fmt == "jpeg" else 0))
        return fut.result() if fut is not None and fut.done() and fut.exception() is None else None

    def encode(self, raw: bytearray, fmt: str = "png", quality: int = 85) -> bytes:
        """Encode ``raw``; reuses (or waits for) an encoding of an identical frame. Blocking."""
        key = (fmt, quality if fmt == "jpeg" else 0)
        with self._cache_lock:
            if self._cache_frame is not None and self._cache_frame == raw:
                fut = self._cache.get(key)
                owner = fut is None
                if owner:
                    fut = self._cache[key] = Future()
            else:
                self._cache_frame, fut = raw, Future()
                self._cache = {key: fut}
                owner = True
        if owner:
            try:
                fut.set_result(self._encode_now(raw, fmt, quality))
            except Exception as exc:  # noqa: BLE001 - handed to every waiter
                fut.set_exception(exc)
        return fut.result()

    def wait_stable(self, stable_s: float = 0.1, timeout_s: float = 2.0, interval_s: float = 0.01) -> bytearray:
        """Blocking: poll until the frame is unchanged for ``stable_s`` (or the timeout); return it."""
        deadline = time.monotonic() + timeout_s
        last = self.grab()
        since = time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(interval_s)
            cur = self.grab()
            now = time.monotonic()
            if cur != last:
                last, since = cur, now
            elif now - since >= stable_s:
                break
        return last
