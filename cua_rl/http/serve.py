"""Run an ASGI app (FastAPI) with uvicorn on a background thread, on a loopback port.

Why: tests and the launcher need real HTTP servers in-process (real sockets, real serialisation), and
they must start fast, report their actual port, and stop cleanly so no process or port is left behind.
Binding the socket ourselves means ``port=0`` works and the port is known before uvicorn starts.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field

import uvicorn


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free right now (for servers started by another process, which must be told one)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class ServedApp:
    """A running server: ``url`` is ``http://host:port`` with no trailing slash; call ``stop()``."""

    host: str
    port: int
    server: uvicorn.Server = field(repr=False)
    thread: threading.Thread = field(repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self, timeout_s: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)

    def __enter__(self) -> "ServedApp":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class DrainingServer(uvicorn.Server):
    """uvicorn's server, told the app that it is stopping before it waits for the requests in flight: the app's
    ``app.state.drain`` (a plain callable, if it has one) runs first, so a request that would outlast the grace
    period (a gym's create waiting for a desktop) can end now with a clear answer instead of being cancelled,
    which uvicorn reports as an error with the request's traceback."""

    async def shutdown(self, sockets=None) -> None:
        drain = getattr(getattr(self.config.app, "state", None), "drain", None)
        if callable(drain):
            drain()
        await super().shutdown(sockets)


# Idle connections are kept 30 s, longer than httpx clients keep theirs (5 s): the client always drops an
# idle connection first, so a request never races the server closing it ("Server disconnected without
# sending a response", seen under load with uvicorn's default of 5 s). The gym and monitor CLIs use it too.
KEEP_ALIVE_S = 30


def serve_app_in_thread(app, host: str = "127.0.0.1", port: int = 0, *, log_level: str = "warning",
                        start_timeout_s: float = 20.0) -> ServedApp:
    """Start ``app`` on ``host:port`` (0 = any free port) and return once it accepts connections."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    actual_port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level=log_level, lifespan="auto", timeout_graceful_shutdown=2,
                            timeout_keep_alive=KEEP_ALIVE_S)
    server = DrainingServer(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True,
                              name=f"uvicorn-{host}:{actual_port}")
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            thread.join(5)
            sock.close()
            raise RuntimeError(f"server on {host}:{actual_port} did not start")
        time.sleep(0.02)
    return ServedApp(host=host, port=actual_port, server=server, thread=thread)
