"""Forking a live execution: what a fork records, replays and compares (``LocalGym.fork`` runs it).

Why: step-level credit compares continuations that share everything before them (docs/local_gym.md, "Forks");
that needs N new executions in the parent's exact state, the parent going on untouched. Two mechanisms:

- **replay** (X11 desktops and MiniWoB++ browsers). The gym owns each desktop's start and its task's seed, and
  its apps draw no clock and no blinking caret, so a fresh execution of the same task and seed that is given the
  same input shows the same screen. Every action an execution plays is recorded with the checksum of the screen
  it was played on (``Step``). A child is a fresh execution (a warm spare when there is one), begun with the
  parent's seed; each recorded action is played on it once its screen shows what the parent's showed when the
  parent played that action (so a dialog the parent waited for is waited for), and at the end its screen must
  equal the parent's frame at the fork and its task state (``suite.fork_state``: the HOME's files, every one whole
  (``home_state``), the page's DOM and task globals) the parent's. A child that never gets there is a
  ``ForkRefused`` (HTTP 409) naming where it went astray, and so is a HOME too large or deep to compare whole
  (``HomeRefused``): a fork never hands out another state.
- **snapshot** (QEMU VMs): the parent's RAM, devices and disk are frozen and each child resumes them on an
  overlay of its own (``vm/backend.py``, ``VMDesktop.freeze``/``thaw``).

Equal means byte-identical, except inside ``mask``: the pixel rectangles of the regions a task declares volatile
(``TaskDef.volatile``: at most ``MAX_MASK`` of the screen), where a clock or a spinner may draw anything.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import math
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from zlib_ng import zlib_ng

from .home_paths import OPEN_DIR, OPEN_FILE

MAX_COUNT = 16             # children per fork
MAX_MASK = 0.02            # a task's volatile regions cover at most this share of the screen
# What one read of a HOME's state compares whole; a HOME past any of them is a refused fork (``home_state``), never
# one compared in part. The bytes are the default HOME quota (``SandboxLimits.home_bytes``: a HOME the default
# quota allows is always compared; ~0.3 s to read and hash on SHA-NI), the entries its tmpfs's inode cap
# (mounts.py), the depth far past any app's folders (~6) and what bounds the walk's open descriptors.
MAX_HOME_BYTES = 256 << 20
MAX_HOME_ENTRIES = 16384
MAX_HOME_DEPTH = 64
KEY_FILE_BYTES = 1 << 20   # a settings file larger than this is compared byte for byte, not parsed


class ForkRefused(Exception):
    """The fork cannot give children in the parent's state (HTTP 409): the task is not forkable, the parent's
    actions cannot be replayed, or a child did not reach the parent's state. ``reason`` says which."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class HomeRefused(ForkRefused):
    """A HOME the fork's state check cannot compare whole (``home_state``: past one of its bounds). ``reason``
    starts with "HOME", so the caller can say whose: the parent's or a child's."""


@dataclass(frozen=True)
class Step:
    """One action the execution played (the request's action object) and the checksum of its screen, outside
    the mask, right before the action (``screen_key``)."""

    action: dict
    screen: int


@dataclass
class Capture:
    """The parent at the fork: its history, seed and mask (pixels). Not its frame: a child is compared with the
    parent's screen as it is when the child is done (``LocalGym._replay``)."""

    steps: list[Step]
    seed: int | None
    mask: list[list[int]]
    width: int
    height: int


def fork_count(body: object) -> int:
    """The ``count`` of a fork request (``{"count": N}``, 1..MAX_COUNT; ``{}``, what no body reads as, is one);
    ``ValueError`` saying what is wrong (a JSON ``null`` too: as create's, a body is an object)."""
    if body == {}:
        return 1
    if not isinstance(body, dict):
        raise ValueError(f'the fork body must be a JSON object such as {{"count": 4}}, got {type(body).__name__}')
    unknown = set(body) - {"count"}
    if unknown:
        raise ValueError(f"unknown fork field(s) {sorted(unknown)}; the body is {{\"count\": N}}")
    count = body.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
        raise ValueError(f"count must be an integer in 1..{MAX_COUNT}, got {count!r}")
    return count


# -- screens ---------------------------------------------------------------------------------------------
def mask_pixels(regions, width: int, height: int) -> list[list[int]]:
    """Regions as fractions of the screen ``(x0, y0, x1, y1)`` -> pixel rectangles ``[x0, y0, x1, y1]`` (x1, y1
    exclusive), each widened to whole pixels so it covers every pixel the region touches."""
    out = []
    for x0, y0, x1, y1 in regions:
        px0, py0 = int(x0 * width), int(y0 * height)
        px1, py1 = min(width, math.ceil(x1 * width)), min(height, math.ceil(y1 * height))
        if px1 > px0 and py1 > py0:
            out.append([px0, py0, px1, py1])
    return out


def mask_share(regions) -> float:
    """The share of the screen that regions given as fractions cover (overlaps counted once, on a 1000 grid)."""
    grid = np.zeros((1000, 1000), bool)
    for x0, y0, x1, y1 in regions:
        grid[int(y0 * 1000):int(np.ceil(y1 * 1000)), int(x0 * 1000):int(np.ceil(x1 * 1000))] = True
    return float(grid.mean())


def _pixels(frame, width: int, height: int) -> np.ndarray:
    """A frame as (rows, bytes per row): X frames are BGRX, VM frames a PPM whose header is cut off first."""
    data = np.frombuffer(frame, np.uint8)
    if bytes(data[:2]) == b"P6":   # a PPM: a header, then RGB rows
        return data[len(data) - width * height * 3:].reshape(height, width * 3)
    return data.reshape(height, len(data) // height)


def _blanked(frame, width: int, height: int, mask) -> bytes | bytearray:
    """``frame`` with the masked rectangles zeroed (a copy; the frame itself when there is no mask)."""
    if not mask:
        return frame
    rows = _pixels(frame, width, height).copy()
    per = rows.shape[1] // width
    for x0, y0, x1, y1 in mask:
        rows[y0:y1, x0 * per:x1 * per] = 0
    return rows.tobytes()


def screen_key(frame, width: int, height: int, mask) -> int:
    """The checksum of a frame outside the mask (CRC-32 by zlib-ng: ~0.2 ms for a 1280x800 frame)."""
    return zlib_ng.crc32(_blanked(frame, width, height, mask))


def frames_equal(a, b, width: int, height: int, mask) -> bool:
    return len(a) == len(b) and (a == b or (bool(mask) and _blanked(a, width, height, mask)
                                             == _blanked(b, width, height, mask)))


def difference(a, b, width: int, height: int, mask) -> str:
    """Where two frames differ outside the mask, in words (for a refusal's reason)."""
    if len(a) != len(b):
        return f"the frames differ in size ({len(a)} and {len(b)} bytes)"
    pa = _pixels(_blanked(a, width, height, mask), width, height)
    pb = _pixels(_blanked(b, width, height, mask), width, height)
    per = pa.shape[1] // width
    diff = (pa != pb).reshape(height, width, per).any(axis=2)
    ys, xs = np.nonzero(diff)
    if not len(ys):
        return "no pixel differs"
    return (f"{len(ys)} pixels differ, within [{xs.min()}, {ys.min()}, {xs.max() + 1}, {ys.max() + 1}] "
            f"(x0, y0, x1, y1)")


async def wait_for_screen(screen, want: Callable[[bytearray], bool], timeout_s: float,
                          stop: Callable[[], bool] = lambda: False) -> bytearray | None:
    """The first frame of ``screen`` that ``want`` accepts, within ``timeout_s`` (None after it, or once ``stop``
    says so). With X DAMAGE a still screen is grabbed once and then only after it changes; without, every
    ``poll_s``."""
    damage = getattr(screen, "damage", None)
    deadline = time.monotonic() + timeout_s
    while True:
        if damage is not None:
            damage.arm()   # forget earlier changes: one after this grab wakes the wait below
        frame = screen.grab()
        if want(frame):
            if damage is not None:
                screen.remember(frame)   # grabbed after the damage was forgotten: the screen until a change
            return frame
        left = deadline - time.monotonic()
        if left <= 0 or stop():
            return None
        if damage is not None:
            await damage.changed_within(min(left, 0.25))
        else:
            await asyncio.sleep(min(left, getattr(screen, "poll_s", 0.006)))


# -- task state --------------------------------------------------------------------------------------------
# What apps keep in HOME for themselves with the time in it: not the task's state, and never equal across two
# desktops (the editor's list of recent files records when each was opened).
HOME_BOOKKEEPING = (".local/share/recently-used.xbel", ".cache")
# Settings files that GLib's key-file writer rewrites whole, its groups in the order they were first set: two
# desktops given the same input may set them in another order (the editor stores its window state when the
# window maps, a moment before or after a setting the agent changed). Compared as their groups and keys.
KEY_FILES = (".config/glib-2.0/settings/keyfile", ".config/pcmanfm/default/pcmanfm.conf",
             ".config/libfm/libfm.conf")


def home_state(home: Path, skip: tuple[str, ...] = HOME_BOOKKEEPING) -> dict:
    """A desktop's files as ``{path: what}``, paths relative to HOME, ``skip`` and what is below it left out:
    ``dir <mode>``, ``file <mode> <n> bytes sha256 <hex>`` (every byte read, streamed), ``keyfile <mode> <its
    groups and keys>``, ``link <target>``, ``other <kind> <mode>``. Blocking; run it on a bounded executor.

    Every file is compared whole or the fork is refused: ``HomeRefused`` when HOME holds more than
    ``MAX_HOME_BYTES``, more than ``MAX_HOME_ENTRIES`` entries or folders more than ``MAX_HOME_DEPTH`` deep (the
    reason starts with "HOME", for the caller to say whose). Walked as ``home_paths`` opens HOME, iteratively (no
    recursion; one descriptor per folder level, at most ``MAX_HOME_DEPTH`` + 1): each folder opened relative to
    the one above it, nothing followed (links are read as links), files opened O_NOFOLLOW|O_NONBLOCK and read only
    when the descriptor is a regular file (a FIFO the agent made never blocks the gym, a link it swaps in is never
    read through)."""
    walk = _Walk(skip)
    try:
        walk.enter(os.open(home, OPEN_DIR), "")
        while walk.stack:
            walk.step()
    finally:
        walk.close()
    return walk.out


class _Walk:
    """The state of one ``home_state`` walk: the open folders from HOME down (each with the names it has left to
    look at) and what is left of the bounds."""

    def __init__(self, skip: tuple[str, ...]) -> None:
        self.skip, self.out = skip, {}
        self.stack: list[tuple[int, str, list[str]]] = []
        self.bytes_left, self.entries_left = MAX_HOME_BYTES, MAX_HOME_ENTRIES

    def close(self) -> None:
        while self.stack:
            os.close(self.stack.pop()[0])

    def enter(self, fd: int, rel: str) -> None:
        """Take the open folder ``fd`` (``rel`` under HOME) as the next to walk (closed once walked)."""
        try:
            if len(self.stack) > MAX_HOME_DEPTH:
                raise HomeRefused(f"HOME is more than {MAX_HOME_DEPTH} folders deep (at {_short(rel)}): a fork "
                                  f"compares every file, in folders at most {MAX_HOME_DEPTH} deep")
            names = []
            with os.scandir(fd) as entries:
                for entry in entries:
                    self.entries_left -= 1
                    if self.entries_left < 0:
                        raise HomeRefused(f"HOME holds more than {MAX_HOME_ENTRIES} files and folders: a fork "
                                          f"compares every file, of at most {MAX_HOME_ENTRIES}")
                    names.append(entry.name)
        except BaseException:
            os.close(fd)
            raise
        self.stack.append((fd, rel, names))

    def step(self) -> None:
        """Look at the next name of the deepest open folder (or close it when none is left)."""
        dir_fd, rel, names = self.stack[-1]
        if not names:
            os.close(self.stack.pop()[0])
            return
        name = names.pop()
        path = f"{rel}/{name}" if rel else name
        if path in self.skip:
            return
        try:
            mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        except OSError:   # removed since the listing
            return
        if stat.S_ISLNK(mode):
            try:
                self.out[path] = f"link {os.readlink(name, dir_fd=dir_fd)}"
            except OSError as exc:   # swapped or removed since the look above
                self.out[path] = f"unreadable {errno.errorcode.get(exc.errno, exc.errno)}"
            return
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
            self.out[path] = _other(mode)
            return
        try:
            fd = os.open(name, OPEN_DIR if stat.S_ISDIR(mode) else OPEN_FILE, dir_fd=dir_fd)
        except OSError as exc:   # swapped for a link or removed since the look above
            self.out[path] = f"unreadable {errno.errorcode.get(exc.errno, exc.errno)}"
            return
        try:
            kind = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        if stat.S_ISDIR(kind.st_mode):
            self.out[path] = f"dir {stat.S_IMODE(kind.st_mode):04o}"
            self.enter(fd, path)   # closes fd, now or once walked
            return
        try:
            if stat.S_ISREG(kind.st_mode):
                self.out[path] = self._file(fd, kind, path in KEY_FILES)
            else:
                self.out[path] = _other(kind.st_mode)
        finally:
            os.close(fd)

    def _file(self, fd: int, st: os.stat_result, keyfile: bool) -> str:
        """A regular file's entry, every byte read (``HomeRefused`` once HOME's bytes pass ``MAX_HOME_BYTES``)."""
        if st.st_size > self.bytes_left:   # known too large before anything is read
            self._too_large()
        digest, size, data = hashlib.sha256(), 0, []
        keep = keyfile and st.st_size <= KEY_FILE_BYTES
        while chunk := os.read(fd, 1 << 20):   # the file may grow while it is read: counted as read
            size += len(chunk)
            self.bytes_left -= len(chunk)
            if self.bytes_left < 0:
                self._too_large()
            digest.update(chunk)
            if keep:
                data.append(chunk)
        mode = f"{stat.S_IMODE(st.st_mode):04o}"
        if keep and size <= KEY_FILE_BYTES:
            return f"keyfile {mode} " + key_file(b"".join(data).decode("utf-8", errors="replace"))
        return f"file {mode} {size} bytes sha256 {digest.hexdigest()}"

    @staticmethod
    def _too_large() -> None:
        raise HomeRefused(f"HOME holds more than {MAX_HOME_BYTES >> 20} MiB: a fork compares every byte, of at "
                          f"most {MAX_HOME_BYTES >> 20} MiB")


def _other(mode: int) -> str:
    kinds = {stat.S_IFIFO: "fifo", stat.S_IFSOCK: "socket", stat.S_IFCHR: "char-device", stat.S_IFBLK: "block-device"}
    return f"other {kinds.get(stat.S_IFMT(mode), 'unknown')} {stat.S_IMODE(mode):04o}"


def _short(rel: str, keep: int = 60) -> str:
    """A path for a message: quoted, its middle cut when long."""
    return repr(rel) if len(rel) <= keep else repr(f"{rel[:keep // 2]}...{rel[-keep // 2:]}")


def key_file(text: str) -> str:
    """A GLib key file in a canonical form: its groups sorted, each group's keys sorted (comments dropped)."""
    groups: dict[str, dict[str, str]] = {}
    group = groups.setdefault("", {})
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            group = groups.setdefault(line[1:-1], {})
        else:
            key, _, value = line.partition("=")
            group[key.strip()] = value.strip()
    return "\n".join(f"[{g}] {k}={v}" for g in sorted(groups) for k, v in sorted(groups[g].items()))


def state_difference(parent: dict, child: dict) -> str | None:
    """The first key whose value differs between two task states, in words; None when they are equal."""
    for key in sorted(set(parent) | set(child)):
        if key not in child:
            return f"{key}: the child has none"
        if key not in parent:
            return f"{key}: the parent has none"
        if parent[key] != child[key]:
            a, b = str(parent[key]), str(child[key])
            at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            return f"{key}: differs at character {at} ({a[max(0, at - 20):at + 40]!r} != {b[max(0, at - 20):at + 40]!r})"
    return None
