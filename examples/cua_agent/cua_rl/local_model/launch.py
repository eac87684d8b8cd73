"""Ways to run the CPU model server: in-process (thread) for tests, or as a child process for training.

Training should use ``ModelServerProcess``: the trainer and the server then hold separate GILs and torch
thread pools, as with a real vLLM server. ``addr`` is what AReaL wants in ``AREAL_LLM_SERVER_ADDRS``.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cua_rl.asgi_thread import free_port

logger = logging.getLogger(__name__)


@dataclass
class ServedModel:
    """An in-process server: ``url``, ``addr`` (host:port), ``engine``; call ``stop()``."""

    served: Any = field(repr=False)
    engine: Any = field(repr=False)

    @property
    def url(self) -> str:
        return self.served.url

    @property
    def addr(self) -> str:
        return f"{self.served.host}:{self.served.port}"

    def stop(self) -> None:
        self.served.stop()
        self.engine.close()

    def __enter__(self) -> "ServedModel":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_model_server(model_dir: str | Path, host: str = "127.0.0.1", port: int = 0, *,
                       max_model_len: int = 8192, threads: int | None = None,
                       served_model_name: str | None = None) -> ServedModel:
    """Load the model and serve it on a background thread (port 0 = any free port).

    ``threads`` calls ``torch.set_num_threads``, which is process-wide: it also slows whatever else runs
    torch in this process. Prefer ``ModelServerProcess`` when the caller trains or computes too.
    """
    from cua_rl.asgi_thread import serve_app_in_thread

    from .engine import TinyEngine
    from .server import create_app

    engine = TinyEngine(model_dir, max_model_len=max_model_len, threads=threads)
    try:
        served = serve_app_in_thread(create_app(engine, served_model_name), host=host, port=port)
    except Exception:
        engine.close()
        raise
    return ServedModel(served=served, engine=engine)


class ModelServerProcess:
    """``cua-model serve`` as a child process; waits for /health, stops (only) its own process group."""

    def __init__(self, model_dir: str | Path, host: str = "127.0.0.1", port: int | None = None, *,
                 threads: int | None = None, max_model_len: int = 8192, log_path: str | Path | None = None,
                 start_timeout_s: float = 120.0, extra_env: dict[str, str] | None = None):
        self.host, self.port = host, port or free_port(host)
        cmd = [sys.executable, "-m", "cua_rl.local_model", "serve", str(model_dir), "--host", host,
               "--port", str(self.port), "--max-model-len", str(max_model_len), "--parent-pid", str(os.getpid())]
        if threads:
            cmd += ["--threads", str(threads)]
        env = {**os.environ, **(extra_env or {})}
        self._log = open(log_path, "ab") if log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        try:
            self._wait_healthy(start_timeout_s)
        except Exception:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"cua-model serve exited with code {self.proc.returncode}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise TimeoutError(f"cua-model serve did not become healthy within {timeout_s} s")

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        if self._log is not subprocess.DEVNULL:
            self._log.close()

    def __enter__(self) -> "ModelServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
