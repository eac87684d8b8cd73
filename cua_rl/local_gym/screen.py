"""Screenshots of one display through MIT-SHM (mss ``xshmgetimage``), and waiting for the screen to settle.

Why raw-frame comparison: "the screen has settled" means two grabs a little apart are byte-identical;
a grab is ~0.25 ms and comparing two 4 MB frames is a memcmp, so polling every few ms is cheap.
Encoded images are cached per frame: the agent's screenshot right after an action is usually the very
frame the action's settle wait ended on, which ``prepare`` has already started encoding.

Why ``DamageWatch`` for the settle wait after an action: polling costs a grab and a 4 MB compare every few
milliseconds for as long as the wait lasts (300 ms after a click that changes nothing: ~50 grabs). X's DAMAGE
extension has the server say when pixels change, so a still screen costs nothing and a settled one costs one
grab (gym CPU per step at 16 desktops 15.6 -> 12.4 ms, docs/bench/gym_bench_damage.json). The same reports
make a settled frame reusable: until DAMAGE says a pixel changed, it is the screen, so the screenshot after an
action and the next action's 'before' cost a round trip instead of a 4 MB grab (``Screen.frame_now``,
``Screen.arm_and_grab``; docs/bench/gym_bench_still_frame.json).

Why the encoders are not Pillow's. JPEG: simplejpeg encodes the X server's BGRX frame as it is (libjpeg-turbo
reads that layout) where Pillow first unpacks it into an RGB copy; quality and 4:2:0 subsampling as Pillow's,
the file within 0.1 % of its size. PNG: Pillow tries five row filters per row and deflates with zlib (~10 ms
for a 1280x800 desktop); here the rows are unfiltered and deflated by zlib-ng (a drop-in zlib ~8x faster at
these levels, and level 2 compresses a desktop better than zlib's level 1): the same pixels, lossless, in
about a third of the time (bench/screenshot_bench.py, docs/bench/screenshot_bench.json). And only what changed:
the frame is deflated in stripes of 16 rows, each its own segment of the zlib stream, and a stripe equal to the
last encoded frame's keeps its segment, so a step that redraws a line of text deflates one or two stripes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import threading
import time
import zlib
from concurrent.futures import Future

import mss
import numpy as np
import simplejpeg
from PIL import Image
from zlib_ng import zlib_ng

from .xgrabs import impervious_xcb, impervious_xlib

PNG_LEVEL = 2   # zlib-ng's deflate level for screenshots (see the module docstring)
PNG_STRIPE_ROWS = 16   # the rows ``Screen.png`` re-encodes together when any pixel of them changed

logger = logging.getLogger(__name__)


# The settle wait (``settle``): after the first change, the screen is settled once unchanged for STABLE_S; at most
# MAX_SETTLE_S after that first change. Polling (no DAMAGE) grabs every POLL_S.
POLL_S, STABLE_S, MAX_SETTLE_S = 0.006, 0.012, 2.0


async def settle(screen, before: bytearray, change_wait_s: float,
                 max_s: float = MAX_SETTLE_S) -> tuple[bool, bytearray]:
    """Whether an action (or a page's start) changed the screen, and the settled frame: the first change within
    ``change_wait_s``, then no change for ``STABLE_S`` (at most ``max_s`` after the first change, for screens
    that never stop moving). With X DAMAGE (``screen.damage``, armed before ``before`` was grabbed) the waits
    cost nothing and the frame one grab."""
    if getattr(screen, "damage", None) is not None:
        damage = screen.damage
        if not await damage.changed_within(change_wait_s):
            return False, before
        t0 = time.monotonic()
        # Quiet for STABLE_S since the last change as the X server reported it: a change that came while the
        # caller still waited (e.g. for a page to count its input) has already been quiet for a while.
        while time.monotonic() - t0 < max_s:
            quiet = STABLE_S - (time.monotonic() - damage.last_change)
            if quiet <= 0 or not await damage.changed_within(quiet):
                break
        frame = screen.grab()
        return frame != before, frame
    return await _settle_by_polling(screen, before, change_wait_s, max_s)


async def _settle_by_polling(screen, before: bytearray, change_wait_s: float,
                             max_s: float) -> tuple[bool, bytearray]:
    """Grabs run inline: one is well under a millisecond with MIT-SHM, cheaper than a thread hop. A screen
    may set its own ``poll_s``/``stable_s`` (a VM's frames take milliseconds and its guest draws slower)."""
    poll_s, stable_s = getattr(screen, "poll_s", POLL_S), getattr(screen, "stable_s", STABLE_S)
    t0 = time.monotonic()
    last, last_change, first_change = before, t0, None
    while True:
        await asyncio.sleep(poll_s)
        cur = screen.grab()
        now = time.monotonic()
        if cur != last:
            last, last_change = cur, now
            if first_change is None and cur != before:
                first_change = now
        elif first_change is not None and now - last_change >= stable_s:
            break
        elif first_change is None and now - t0 >= change_wait_s:
            break
        if first_change is not None and now - first_change >= max_s:
            break
    return last != before, last


def _changed_stripes(frame: np.ndarray, before: np.ndarray | None, rows: int) -> list[int]:
    """The indices of the stripes of ``rows`` rows in which ``frame`` differs from ``before`` (all of them
    without one): compared as 64-bit words, about 0.3 ms for a 1280x800 frame."""
    n = -(-frame.shape[0] // rows)
    if before is None or before.shape != frame.shape:
        return list(range(n))
    words, before = frame.reshape(frame.shape[0], -1), before.reshape(frame.shape[0], -1)
    if words.shape[1] % 8 == 0:
        words, before = words.view(np.uint64), before.view(np.uint64)
    row_changed = (words != before).any(axis=1)
    return [i for i in range(n) if row_changed[i * rows:(i + 1) * rows].any()]


def png_file(width: int, height: int, idat: bytes) -> bytes:
    """A PNG file of 8-bit RGB rows whose zlib stream is ``idat``."""
    def chunk(tag: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)   # 8 bits, truecolour, no interlace
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


class Screen:
    def __init__(self, display_name: str) -> None:
        self._mss = mss.MSS(display=display_name, backend="xshmgetimage")
        try:   # a desktop's app that grabs the X server stops no frame (xgrabs.py)
            impervious_xcb(self._mss._impl.conn)
        except BaseException:
            self._mss.close()
            raise
        self._lock = threading.Lock()
        mon = self._mss.monitors[0]
        self.width, self.height = mon["width"], mon["height"]
        self._monitor = {"left": 0, "top": 0, "width": self.width, "height": self.height}
        self._init_cache()
        self.damage = DamageWatch.open(display_name)

    def _init_cache(self) -> None:
        """The encoding cache of ``cached``/``encode`` (one frame's encodings; subclasses call it too)."""
        self._cache_lock = threading.Lock()
        self._cache_frame: bytearray | None = None
        self._cache: dict[tuple[str, int], Future] = {}
        self._rows_lock = threading.Lock()   # ``png``'s row buffer
        self._rows: np.ndarray | None = None
        self._png_frame: np.ndarray | None = None   # the last frame ``png`` encoded, and its stripes' segments
        self._segments: list[bytes] = []
        self._still: tuple[bytearray, int] | None = None   # ``remember``'s frame and the damage count it holds for

    def close(self) -> None:
        """Close both connections (the damage watch's first; each whatever the other did)."""
        try:
            if self.damage is not None:
                self.damage.close()
        finally:
            with self._lock:
                try:
                    self._mss.close()
                except Exception:  # the X server may already be gone
                    pass

    def grab(self) -> bytearray:
        """One raw BGRA frame (a private copy)."""
        with self._lock:
            return self._mss.grab(self._monitor).raw

    # A settled frame stays the screen until X DAMAGE reports a change: reusing it saves a 4 MB grab (and the X
    # server's copy into shared memory) for the screenshot after an action and for the next action's 'before'.
    # Valid only while no damage was forgotten since it was grabbed (``DamageWatch.subtracts``). On the loop.
    def remember(self, frame: bytearray) -> None:
        """``frame`` was grabbed after the damage was last forgotten (a settle wait's result)."""
        if self.damage is not None:
            self._still = (frame, self.damage.subtracts)

    def prepare(self, frame: bytearray, fmt: str = "png", quality: int = 85) -> None:
        """A settle wait's result, about to be shown: remember it and start encoding it in the background (the
        agent's next call is almost always a screenshot of this very frame, in the format it asked for last)."""
        self.remember(frame)
        asyncio.get_running_loop().run_in_executor(None, self.encode, frame, fmt, quality)

    def _remembered(self) -> bytearray | None:
        still = self._still
        if still is None or self.damage is None or still[1] != self.damage.subtracts:
            return None
        return still[0]

    def frame_now(self) -> bytearray:
        """The screen now: the remembered frame when nothing changed since (one round trip), else a grab."""
        frame = self._remembered()
        return frame if frame is not None and not self.damage.dirty() else self.grab()

    def arm_and_grab(self) -> bytearray:
        """Before an action: forget the damage so far (``DamageWatch.arm``) and return the screen as it is."""
        if self.damage is None:
            return self.grab()
        frame = self._remembered()
        changed = self.damage.arm()
        return frame if frame is not None and not changed else self.grab()

    def image(self, raw: bytearray) -> Image.Image:
        """A grabbed frame as a PIL image (Pillow unpacks BGRX into its own RGB copy; no copy before that)."""
        return Image.frombuffer("RGB", (self.width, self.height), raw, "raw", "BGRX", 0, 1)

    def jpeg(self, raw: bytearray, quality: int) -> bytes:
        """The frame as JPEG, encoded from the X server's BGRX layout as it is (see the module docstring)."""
        pixels = np.frombuffer(raw, np.uint8).reshape(self.height, self.width, 4)
        return simplejpeg.encode_jpeg(pixels, quality=quality, colorspace="BGRX", colorsubsampling="420")

    def png(self, raw: bytearray) -> bytes:
        """The frame as PNG: RGB rows, each with filter type 0, deflated by zlib-ng (see the module docstring).
        The rows are written into one buffer kept per screen: fresh 3 MB buffers per frame cost more in page
        faults than the conversion itself on a virtual machine (Pillow's unpack: 0.9 ms alone, 6-9 ms once
        numpy is imported and the allocator hands it new pages each time).

        Only the stripes of ``PNG_STRIPE_ROWS`` rows that differ from the last frame encoded here are converted
        and deflated again: each stripe is its own deflate segment (a full flush after it, so none refers back
        into another), kept per screen and joined with the others into one zlib stream. A typed letter
        re-encodes one or two stripes of fifty, not the desktop."""
        w, h = self.width, self.height
        frame = np.frombuffer(raw, np.uint8).reshape(h, w, 4)
        with self._rows_lock:
            if self._rows is None or self._rows.shape != (h, 1 + 3 * w):
                self._rows = np.zeros((h, 1 + 3 * w), np.uint8)   # column 0: each row's filter type, 0
                self._png_frame, self._segments = None, [b""] * -(-h // PNG_STRIPE_ROWS)
            rgb = self._rows[:, 1:].reshape(h, w, 3)
            deflate = zlib_ng.compressobj(PNG_LEVEL, zlib_ng.DEFLATED, -15)   # raw deflate: the header is ours
            changed, self._png_frame = _changed_stripes(frame, self._png_frame, PNG_STRIPE_ROWS), None
            for i in changed:   # (were one to fail, the next frame re-encodes every stripe: _png_frame is None)
                rows = slice(i * PNG_STRIPE_ROWS, (i + 1) * PNG_STRIPE_ROWS)
                rgb[rows, :, 0], rgb[rows, :, 1], rgb[rows, :, 2] = frame[rows, :, 2], frame[rows, :, 1], frame[rows, :, 0]
                self._segments[i] = deflate.compress(self._rows[rows]) + deflate.flush(zlib_ng.Z_FULL_FLUSH)
            self._png_frame = frame
            # zlib header (deflate, 32 KB window, "fast" level), the segments, an empty final block, Adler-32
            idat = b"".join([b"\x78\x5e", *self._segments, b"\x03\x00",
                             struct.pack(">I", zlib_ng.adler32(self._rows))])
            return png_file(w, h, idat)

    def _encode_now(self, raw: bytearray, fmt: str, quality: int) -> bytes:
        return self.jpeg(raw, quality) if fmt == "jpeg" else self.png(raw)

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


class DamageWatch:
    """The X server's DAMAGE reports for the whole screen (the root window and everything drawn on it), read on
    the asyncio loop that first waits on it: ``arm`` before an action, then ``changed_within`` answers whether
    any pixel changed within a time (no polling, no CPU while the screen is still)."""

    def __init__(self, display_name: str) -> None:
        from Xlib import display as xdisplay
        from Xlib.ext import damage

        self._display = xdisplay.Display(display_name)
        try:
            if not self._display.has_extension("DAMAGE"):
                raise RuntimeError("the X server has no DAMAGE extension")
            self._display.damage_query_version()
            self._damage = self._display.screen().root.damage_create(damage.DamageReportNonEmpty)
            impervious_xlib(self._display)   # (syncs)
        except BaseException:
            self._display.close()
            raise
        # python-xlib registers a copy of the event class per display: match the event code, not the class
        self._notify_code = self._display.query_extension("DAMAGE").first_event + damage.DamageNotifyCode
        self._fd = self._display.fileno()   # (python-xlib's fileno raises once the connection is lost)
        self.lost: Exception | None = None   # why the connection was lost (``_drain``); then every wait raises it
        self._loop: asyncio.AbstractEventLoop | None = None
        self._flag: asyncio.Event | None = None
        self.notifications = 0
        self.last_change = 0.0   # time.monotonic() when a change was last read from the X server
        self.subtracts = 0   # how often the damage was forgotten: a frame grabbed after one is current until a change

    @classmethod
    def open(cls, display_name: str) -> "DamageWatch | None":
        try:
            return cls(display_name)
        except Exception as exc:  # noqa: BLE001 - settling falls back to comparing grabs
            logger.warning("no X DAMAGE on %s (%s); settle waits poll the screen", display_name, exc)
            return None

    def _attach(self) -> asyncio.Event:
        if self.lost is not None:
            raise self.lost
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            loop.add_reader(self._fd, self._drain)
            self._loop, self._flag = loop, asyncio.Event()
            self.subtracts += 1   # what the old loop's flag knew is gone: no frame from before is proof now
        return self._flag

    def _drain(self) -> None:
        """Read every queued event (python-xlib also queues those that arrive while it reads a reply). A lost
        connection stops the watch (its reader is removed at once: a closed socket must not be polled, nor its
        number, which the next socket opened may take) and wakes its waiter, which raises ``lost``."""
        hit = False
        try:
            while self._display.pending_events():
                hit = (self._display.next_event().type & 0x7F) == self._notify_code or hit
        except Exception as exc:  # noqa: BLE001 - the X server closed the connection
            self.lost = exc
            loop, self._loop = self._loop, None
            if loop is not None and not loop.is_closed():
                with contextlib.suppress(Exception):
                    loop.remove_reader(self._fd)
            if self._flag is not None:
                self._flag.set()
            logger.warning("the DAMAGE connection was lost: %s", exc)
            return
        if hit:
            self.notifications += 1
            self.last_change = time.monotonic()
            self._flag.set()

    def arm(self) -> bool:
        """Forget all damage so far; the next change reports. Call on the loop right before the 'before' grab.
        True when something had changed since the last arm or reported change (its events come before the
        sync's reply, so none is lost between a caller's check and this subtract)."""
        count = self.subtracts
        flag = self._attach()
        self._display.damage_subtract(self._damage)
        self.subtracts += 1
        self._display.sync()  # processed before the caller grabs: a change after it cannot be missed
        self._drain()
        dirty = flag.is_set() or self.subtracts != count + 1   # or a new loop: what the old one saw is gone
        flag.clear()
        return dirty

    def dirty(self) -> bool:
        """Whether any pixel changed since the last arm or reported change: one round trip, no grab."""
        count = self.subtracts
        flag = self._attach()
        self._display.sync()
        self._drain()
        return flag.is_set() or self.subtracts != count

    async def changed_within(self, timeout_s: float) -> bool:
        """True as soon as pixels change (and re-arm for the next change); False after ``timeout_s`` of none."""
        flag = self._attach()
        self._drain()
        if not flag.is_set():
            try:
                await asyncio.wait_for(flag.wait(), timeout_s)
            except TimeoutError:
                return False
        if self.lost is not None:
            raise self.lost
        flag.clear()
        self._display.damage_subtract(self._damage)
        self.subtracts += 1
        self._display.flush()
        return True

    def close(self) -> None:
        """Stop watching; callable from any thread (desktops are stopped in worker threads), also after the
        connection was lost."""
        loop, fd = self._loop, self._fd
        if loop is not None and not loop.is_closed():
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop or not loop.is_running():  # a stopped loop would never run a callback
                with contextlib.suppress(Exception):      # (a loop closing meanwhile has no reader to remove)
                    loop.remove_reader(fd)
            else:
                done = threading.Event()
                loop.call_soon_threadsafe(lambda: (loop.remove_reader(fd), done.set()))
                done.wait(2.0)
        self._loop = None
        try:
            self._display.close()
        except Exception:  # noqa: BLE001 - the X server may already be gone
            pass
