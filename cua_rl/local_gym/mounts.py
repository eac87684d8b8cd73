"""The HOME quota enforced by the kernel: each desktop's HOME is a size-capped tmpfs (when the gym is root).

Why: a HOME that is a plain host folder can only be watched (the reaper polls its size and ends the
execution), so an app writing fast fills the host disk between two polls. A tmpfs mounted with
``size=`` refuses the write that would pass the quota (ENOSPC inside the sandbox) and never touches the
host disk; ``nr_inodes`` caps empty files too. It costs RAM only for what the apps write (at most the
quota per desktop).

Why a private mount namespace: a SIGKILLed gym runs no cleanup code, and a mount in the host's namespace
would outlive it. ``private_namespace()`` (called by the gym's entry points before any thread starts) moves
the process into a mount namespace of its own, so the kernel drops every HOME mount when the gym and its
desktops are gone. Without it (a gym started inside another program, e.g. the tests) the mounts live in
the host's namespace: each desktop unmounts its own, and a starting gym detaches those of dead gyms' work
folders before deleting them (``detach_under``).

Not root, or root that may not mount (an unprivileged container; a warning says so once): no mount, and the
reaper's polling stays the limit (``Desktop.home_mounted``).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

_libc = ctypes.CDLL(None, use_errno=True)
_CLONE_NEWNS = 0x00020000
_MS_NOSUID, _MS_NODEV, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x4000, 1 << 18
_MNT_DETACH = 2
_BYTES_PER_INODE = 16 << 10   # a HOME of 256 MiB may hold 16384 files and folders
SOURCE = "cua-home"           # the mount source, how detach_under tells our mounts apart


def can_mount() -> bool:
    return os.geteuid() == 0


def private_namespace() -> bool:
    """Move this process into its own mount namespace (mounts stay private to it); False when not possible.

    Call before starting threads: the kernel moves only the calling thread, and threads started later
    inherit its namespace.
    """
    if not can_mount():
        return False
    if _libc.unshare(_CLONE_NEWNS) != 0 or _libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        err = ctypes.get_errno()
        logger.warning("no private mount namespace (%s): desktop HOME mounts live in the host's namespace",
                       os.strerror(err))
        return False
    return True


_refused = False   # the kernel said no once (root without CAP_SYS_ADMIN, e.g. an unprivileged container)


def mount_home(path: Path, size_bytes: int, uid: int) -> bool:
    """Mount a tmpfs of ``size_bytes`` on ``path`` (an empty folder), owned by ``uid``, mode 0700.

    False when mounting is not allowed here (said once, as a warning): HOME stays a host folder and the
    reaper's polling is its limit."""
    global _refused
    if _refused or not can_mount():
        return False
    inodes = max(1024, size_bytes // _BYTES_PER_INODE)
    opts = f"size={size_bytes},nr_inodes={inodes},mode=0700,uid={uid},gid={uid}".encode()
    if _libc.mount(SOURCE.encode(), str(path).encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts) == 0:
        return True
    err = ctypes.get_errno()
    if err not in (errno.EPERM, errno.EACCES):
        raise OSError(err, f"cannot mount the HOME tmpfs on {path}: {os.strerror(err)}")
    _refused = True
    logger.warning("cannot mount HOME tmpfs (%s): HOME quotas are polled by the reaper, not enforced by the "
                   "kernel", os.strerror(err))
    return False


def unmount(path: Path) -> None:
    """Detach the mount on ``path`` (lazily: processes still inside keep it until they exit); none is fine."""
    if _libc.umount2(str(path).encode(), _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):   # not a mount point / already gone
            logger.warning("cannot unmount %s: %s", path, os.strerror(err))


def mounted_under(parent: Path) -> list[Path]:
    """Our HOME mounts at or below ``parent``, deepest first (from this namespace's mount table)."""
    prefix = str(parent).rstrip("/") + "/"
    found = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split()
        try:
            sep = fields.index("-")
        except ValueError:
            continue
        point = fields[4].replace("\\040", " ")
        if fields[sep + 1] == "tmpfs" and fields[sep + 2] == SOURCE and (point + "/").startswith(prefix):
            found.append(Path(point))
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def detach_under(parent: Path) -> int:
    """Unmount every HOME mount below ``parent`` (a dead gym's work folder); returns how many."""
    points = mounted_under(parent)
    for point in points:
        unmount(point)
    return len(points)
