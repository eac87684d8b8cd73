"""Process helpers for the gym tests: which processes a desktop (or a whole server) consists of."""

from __future__ import annotations

import os
import time


def descendants(root_pids: list[int]) -> set[int]:
    """Every live process below (and including) ``root_pids``, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), list(root_pids)
    while todo:
        pid = todo.pop()
        if pid in found or not os.path.exists(f"/proc/{pid}"):
            continue
        found.add(pid)
        todo.extend(children.get(pid, []))
    return found


def alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` that still exist and are not zombies."""
    out = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.add(pid)
    return out


def wait_gone(pids: set[int], timeout_s: float = 10.0) -> set[int]:
    deadline = time.monotonic() + timeout_s
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive(pids)
