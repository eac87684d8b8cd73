"""Paths relative to a desktop's HOME: the one rule for them (``home_parts``), and how the gym opens them.

Why: the gym runs as root and the desktop is hostile. A task's set-up (``files``, ``dirs``) and its validators name
paths under HOME, and both go by ``home_parts``: relative, no ``..``, so nothing a task says reaches outside HOME
(a task with such a path is refused when it loads). And between two looks at a path the agent can swap its file
for a symbolic link (to a host file) or a FIFO (whose ``open`` waits for a writer forever). So the gym never
resolves a path under HOME by name: ``HomeDir`` walks it from HOME one folder at a time, each opened relative to
the last with ``O_NOFOLLOW|O_DIRECTORY`` (openat), opens the last part with ``O_NOFOLLOW|O_NONBLOCK``, and
decides what it opened from the descriptor (``fstat``), never from an earlier look. A link anywhere on the path
is refused (``PathRefused``), inside HOME or not; a FIFO, socket or device is never read.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import Iterator

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
OPEN_DIR, OPEN_FILE = _DIR, _FILE   # the flags for other walkers of a HOME (fork.home_state)


class PathRefused(ValueError):
    """What is at a path under HOME is not read: a link on the way, or not a regular file. The message says
    why and never quotes a file's content."""


def home_parts(rel: str) -> tuple[str, ...]:
    """``rel`` (a path relative to HOME) as its parts, ``.`` dropped; ``()`` is HOME itself. ValueError saying
    why for an absolute path, ``..`` anywhere, a NUL, a ``~`` start or a non-string."""
    if not isinstance(rel, str):
        raise ValueError(f"a path under HOME is a string, got {type(rel).__name__}")
    if "\0" in rel:
        raise ValueError(f"{rel!r} has a NUL character")
    if rel.startswith(("/", "~")):
        raise ValueError(f"{rel!r} must be relative to HOME (no leading '/' or '~')")
    parts = tuple(p for p in rel.split("/") if p not in ("", "."))
    if ".." in parts:
        raise ValueError(f"{rel!r} has a '..': paths stay beneath HOME")
    return parts


def home_file_parts(rel: str) -> tuple[str, ...]:
    """``home_parts`` of a path that names something in HOME (a file or folder to create), not HOME itself."""
    parts = home_parts(rel)
    if not parts:
        raise ValueError(f"{rel!r} names HOME itself, not a file or folder in it")
    return parts


class HomeDir:
    """One HOME folder, opened from the host without following links or blocking (the module docstring)."""

    def __init__(self, home: Path | str) -> None:
        self.home = Path(home)

    @contextlib.contextmanager
    def _parent(self, parts: tuple[str, ...]) -> Iterator[int | None]:
        """A descriptor of the folder that holds ``parts[-1]`` (None when a folder on the way is missing)."""
        fd = os.open(self.home, _DIR)
        try:
            for name in parts[:-1]:
                try:
                    nxt = os.open(name, _DIR, dir_fd=fd)
                except FileNotFoundError:
                    yield None
                    return
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise PathRefused(f"'{name}' on the way is a link or not a folder (links are never "
                                          f"followed)") from None
                    raise
                os.close(fd)
                fd = nxt
            yield fd
        finally:
            os.close(fd)

    def lstat(self, rel: str) -> os.stat_result | None:
        """What is at ``rel`` itself (a link is not followed); None when nothing is."""
        parts = home_parts(rel)
        if not parts:
            return os.stat(self.home, follow_symlinks=False)
        with self._parent(parts) as fd:
            if fd is None:
                return None
            try:
                return os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return None

    def read(self, rel: str, limit: int) -> bytes | None:
        """Up to ``limit`` bytes of the regular file at ``rel``; None when nothing is there. ``PathRefused``
        for a link, a FIFO, a folder or anything else that is not a regular file."""
        parts = home_file_parts(rel)
        with self._parent(parts) as fd:
            if fd is None:
                return None
            try:
                f = os.open(parts[-1], _FILE, dir_fd=fd)
            except FileNotFoundError:
                return None
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise PathRefused("is a link (links are never followed)") from None
                if exc.errno == errno.ENXIO:   # a socket
                    raise PathRefused("is not a regular file") from None
                if exc.errno == errno.EACCES:
                    raise PathRefused("cannot be read (permission denied)") from None
                raise
        try:
            if not stat.S_ISREG(os.fstat(f).st_mode):
                raise PathRefused("is not a regular file")
            chunks, left = [], limit
            while left > 0 and (chunk := os.read(f, min(left, 1 << 16))):
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks)
        finally:
            os.close(f)

    def listdir(self, rel: str) -> list[str] | None:
        """The names in the folder at ``rel``; None when there is no folder there. ``PathRefused`` for a link."""
        parts = home_parts(rel)
        if not parts:
            return os.listdir(self.home)
        with self._parent(parts) as fd:
            if fd is None:
                return None
            try:
                d = os.open(parts[-1], _DIR, dir_fd=fd)
            except FileNotFoundError:
                return None
            except OSError as exc:   # O_DIRECTORY|O_NOFOLLOW on a link: ENOTDIR (or ELOOP)
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                try:
                    is_link = stat.S_ISLNK(os.stat(parts[-1], dir_fd=fd, follow_symlinks=False).st_mode)
                except FileNotFoundError:
                    return None
                if is_link:
                    raise PathRefused("is a link (links are never followed)") from None
                return None
        try:
            return os.listdir(d)
        finally:
            os.close(d)
