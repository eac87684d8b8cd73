"""Stops a run whose model server died, instead of letting it wait forever.

Why: AReaL 1.0.4 does not notice that its inference server (vLLM or SGLang) is gone. Every turn then fails,
the workflow drops each episode as an infrastructure failure (never a reward), every group is rejected, and
the trainer waits for a batch that never comes while the rollouts create and drop desktops in a loop (seen
with vLLM SIGKILLed mid-rollout: tests/e2e/test_faults.py). A server that refuses connections does not come
back (nothing restarts it), so the watch, in the trainer process, asks each server's ``/health`` every few
seconds; when one has refused connections for ``grace_s`` it logs the cause and sends the trainer SIGTERM,
which ``cua_rl.train`` turns into an orderly exit (workers and servers stopped, the monitor run failed). Only
a refused connection counts: a slow or busy server (a weight update, a long prefill) answers eventually.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import threading
import time
from typing import Callable, Iterator

import httpx

from cua_rl.http.retry import never_sent

logger = logging.getLogger("cua-train")

# The sentence the launcher's summary quotes as the cause (cua_rl.run.summary.failure_cause).
GONE = "the model server at {addr} stopped answering (connection refused for {seconds:.0f} s)"
GONE_RE = re.compile(r"the model server at \S+ stopped answering \(connection refused for \d+ s\)")


def server_addrs(trainer) -> list[str]:
    """``host:port`` of each inference server AReaL launched (empty until they are up)."""
    infos = getattr(getattr(trainer, "rollout", None), "server_infos", None) or []
    return [f"{info.host}:{info.port}" for info in infos]


def refuses(addr: str, timeout_s: float = 5.0) -> bool:
    """True when nothing listens at ``addr`` any more; any answer, even an error status, is a live server."""
    try:
        httpx.get(f"http://{addr}/health", timeout=timeout_s)
    except httpx.HTTPError as exc:
        return never_sent(exc)
    return False


class ModelServerWatch:
    def __init__(self, addrs: Callable[[], list[str]], *, interval_s: float = 3.0, grace_s: float = 15.0,
                 on_gone: Callable[[str], None] | None = None) -> None:
        self.addrs, self.interval_s, self.grace_s = addrs, interval_s, grace_s
        self.on_gone = on_gone or (lambda _why: os.kill(os.getpid(), signal.SIGTERM))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="model-server-watch", daemon=True)

    def start(self) -> "ModelServerWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        refused_since: dict[str, float] = {}
        while not self._stop.wait(self.interval_s):
            for addr in self.addrs():
                if not refuses(addr):
                    refused_since.pop(addr, None)
                    continue
                first = refused_since.setdefault(addr, time.monotonic())
                if time.monotonic() - first >= self.grace_s and not self._stop.is_set():
                    why = GONE.format(addr=addr, seconds=time.monotonic() - first)
                    logger.error("%s: it exited or was killed, and its episodes can only be lost; stopping the "
                                 "run", why)
                    self.on_gone(why)
                    return


@contextlib.contextmanager
def watch_model_servers(trainer, **kwargs) -> Iterator[ModelServerWatch]:
    """Watch ``trainer``'s inference servers while the body runs (stopped before the trainer stops them)."""
    watch = ModelServerWatch(lambda: server_addrs(trainer), **kwargs).start()
    try:
        yield watch
    finally:
        watch.stop()
