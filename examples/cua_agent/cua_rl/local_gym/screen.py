"""Screenshots of one display through MIT-SHM (mss ``xshmgetimage``), and waiting for the screen to settle.

Why raw-frame comparison: "the screen has settled" means two grabs a little apart are byte-identical;
a grab is ~0.25 ms and comparing two 4 MB frames is a memcmp, so polling every 10 ms is cheap.
"""

from __future__ import annotations

import io
import threading
import time

import mss
from PIL import Image


class Screen:
    def __init__(self, display_name: str) -> None:
        self._mss = mss.MSS(display=display_name, backend="xshmgetimage")
        self._lock = threading.Lock()
        mon = self._mss.monitors[0]
        self.width, self.height = mon["width"], mon["height"]
        self._monitor = {"left": 0, "top": 0, "width": self.width, "height": self.height}

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

    def grab(self) -> bytes:
        """One raw BGRA frame."""
        with self._lock:
            return bytes(self._mss.grab(self._monitor).raw)

    def encode(self, raw: bytes, fmt: str = "png", quality: int = 85) -> bytes:
        img = Image.frombuffer("RGB", (self.width, self.height), raw, "raw", "BGRX", 0, 1)
        out = io.BytesIO()
        if fmt == "png":
            img.save(out, "PNG", compress_level=1)
        else:
            img.save(out, "JPEG", quality=quality)
        return out.getvalue()

    def wait_stable(self, stable_s: float = 0.1, timeout_s: float = 2.0, interval_s: float = 0.01) -> bytes:
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
