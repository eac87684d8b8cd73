"""Start our Training Monitor in this process: for the embedded default (``launch.py``) and for tests.

Why in-process: the embedded stack's other services (gym, agent) run on threads of the launcher too, so
the monitor lives and dies with the run, binds 127.0.0.1 on a free port, and keeps its SQLite file and
screenshots in the run directory. Its project token is made fresh for each run and reaches the trainer
only through the environment (``PROJECT_TOKEN``); it is never printed or written to a file.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .. import own_command
from ..http.serve import ServedApp, serve_app_in_thread
from .blobs import BlobStore
from .server import build_app
from .store import Store, database_url_from_env, sqlite_url

if TYPE_CHECKING:   # the run's section (cua_rl.config, above this room)
    from cua_rl.config import EmbeddedStackConfig

logger = logging.getLogger(__name__)
EMBEDDED_PROJECT = "local"


@dataclass
class RunningMonitor:
    """A monitor serving on ``url``; ``stop()`` ends the server and closes the database."""

    served: ServedApp = field(repr=False)
    store: Store = field(repr=False)
    blobs: BlobStore = field(repr=False)
    database: str

    @property
    def url(self) -> str:
        return self.served.url

    def stop(self) -> None:
        self.served.stop()
        self.store.close()

    def __enter__(self) -> "RunningMonitor":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def describe_url(url: str) -> str:
    """A database URL without its password, for logs."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def start_monitor(data_dir: str | Path, *, database_url: str | None = None, host: str = "127.0.0.1",
                  port: int = 0, refresh_s: float = 3.0, read_token: str | None = None) -> RunningMonitor:
    """Serve a store (``database_url``, else ``<data_dir>/monitor.db``) with screenshots in ``<data_dir>/blobs``;
    ``read_token``: every read needs it (``server._read_guard``)."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    url = database_url or sqlite_url(data_dir / "monitor.db")
    store = Store.open(url)
    blobs = BlobStore(data_dir / "blobs")
    try:
        served = serve_app_in_thread(build_app(store, blobs, refresh_s=refresh_s, read_token=read_token), host, port)
    except BaseException:
        store.close()
        raise
    return RunningMonitor(served=served, store=store, blobs=blobs, database=describe_url(url))


def start_embedded_monitor(run_dir: str | Path, env: dict[str, str], *, host: str = "127.0.0.1",
                           port: int = 0) -> tuple[RunningMonitor, list[str]]:
    """The embedded default's monitor: SQLite in ``<run_dir>/monitor`` (``DATABASE_URL`` wins), a fresh
    token put into ``env`` as PROJECT_TOKEN, the URL printed; returns the monitor and the overrides
    (``monitor_base_url``, ``project_id``) that point training at it."""
    monitor = start_monitor(Path(run_dir) / "monitor", database_url=database_url_from_env(env), host=host,
                            port=port)
    try:
        env["PROJECT_TOKEN"] = monitor.store.create_token(EMBEDDED_PROJECT, label=f"embedded run {Path(run_dir).name}"[:128])
    except BaseException:
        monitor.stop()
        raise
    env.pop("MONITOR_PROJECT_TOKEN", None)
    print(f"[cua-rl] Training Monitor: {monitor.url}/  (store: {monitor.database})", flush=True)
    return monitor, [f"monitor_base_url={monitor.url}", f"project_id={EMBEDDED_PROJECT}"]


def monitor_for_embedded_run(embedded: EmbeddedStackConfig, monitor_url: str, run_dir: str | Path,
                             env: dict[str, str], stack: contextlib.ExitStack) -> list[str]:
    """What ``launch.py`` calls for the embedded default: start the monitor unless the run already
    reports to one (``monitor_url``, the run's ``monitor_base_url``) or ``embedded.start_monitor`` is false; it
    stops with ``stack`` and says how to browse the run afterwards. Returns the overrides for the trainer."""
    if monitor_url or not embedded.start_monitor:
        return []
    monitor, overrides = start_embedded_monitor(run_dir, env, host=embedded.host, port=embedded.monitor_port)
    data_dir = Path(run_dir) / "monitor"

    def stop() -> None:
        monitor.stop()
        print(f"[cua-rl] Training Monitor stopped; browse this run again with: "
              f"{own_command('cua-monitor', 'cua_rl.monitor')} serve --data-dir {data_dir}", flush=True)

    stack.callback(stop)
    return overrides
