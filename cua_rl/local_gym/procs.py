"""Start desktop processes so that none of them can outlive the gym server.

Why: a SIGKILLed server runs no cleanup code, so every child gets PR_SET_PDEATHSIG(SIGKILL) and its own
process group. The death signal fires when the *thread* that forked the child ends, so children are only
ever started from the long-lived spawner threads of ``Spawner`` (never from short-lived threads). The
signal is set after the uid switch, because the kernel clears it when credentials change.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

logger = logging.getLogger(__name__)
T = TypeVar("T")

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def _child_setup(parent_pid: int, extra: Callable[[], None] | None) -> Callable[[], None]:
    def setup() -> None:
        # Runs in the child after setsid/setuid, before exec.
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # parent died between fork and prctl
            os._exit(1)
        if extra is not None:
            extra()
    return setup


def popen(argv: list[str], *, uid: int | None = None, gid: int | None = None, env: dict | None = None,
          pass_fds: tuple[int, ...] = (), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
          stderr=subprocess.DEVNULL, cwd: str | None = None,
          preexec: Callable[[], None] | None = None) -> subprocess.Popen:
    """Start ``argv`` in its own session, killed by the kernel when the spawning thread dies."""
    kwargs: dict = {}
    if uid is not None and os.geteuid() == 0 and uid != 0:
        kwargs.update(user=uid, group=gid if gid is not None else uid, extra_groups=[])
    return subprocess.Popen(argv, env=env, stdin=stdin, stdout=stdout, stderr=stderr,
                            pass_fds=pass_fds, cwd=cwd, start_new_session=True,
                            preexec_fn=_child_setup(os.getpid(), preexec), **kwargs)


def kill_group(proc: subprocess.Popen, grace_s: float = 0.5) -> None:
    """SIGTERM the child's process group, then SIGKILL what is left; reap the child."""
    if proc.poll() is None:
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers that left the leader behind
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(1.0)
    except subprocess.TimeoutExpired:
        logger.error("process %s did not exit after SIGKILL", proc.pid)


class Spawner:
    """A fixed set of long-lived threads that start (and stop) desktops; see the module docstring."""

    def __init__(self, workers: int = 2) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="desktop-spawn")
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[..., T], *args, **kwargs):
        with self._lock:
            if self._closed:
                raise RuntimeError("spawner is closed")
            return self._pool.submit(fn, *args, **kwargs)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)


def wait_until(pred: Callable[[], bool], timeout_s: float, interval_s: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval_s)
    return pred()
