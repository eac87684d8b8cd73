"""The genv-compatible HTTP API over ``LocalGym`` (env.py): each route checks the gym id, reads the body and
calls one method; ``GymError`` becomes its HTTP status with ``{"detail": ...}``.

``start_gym_server(host, port, **options)`` runs it in-process (tests, the embedded launcher) and returns a
handle with ``.url``, ``.gym_id``, ``.manager`` and ``.stop()``; ``cua-gym serve`` runs it in the foreground.
With a ``token`` every route but ``/health`` needs it, and state changes are JSON only (cua_rl/http/auth.py).
The routes parse their bodies themselves (their 4xx statuses and messages are the bad-input corpus'); the typed
models of those bodies are published in ``/openapi.json`` (``bodies.py``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field, fields

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response

from ..http.auth import GYM_TOKEN, exposure_error, protect
from ..http.hangup import ClientGone, unless_client_leaves
from ..http.input import BadJSON, MiB, limit_body, parse_json
from ..http.serve import ServedApp, serve_app_in_thread
from .bodies import ActionBody, CreateBody, EvaluateBody, ForkBody, body_spec, publish
from .env import GymError, LocalGym
from .manager import GymManager, GymOptions
from .metrics import CONTENT_TYPE
from .tasks import TaskSet

logger = logging.getLogger(__name__)

# Request bodies are actions (text at most 4000 characters: under 25 KB even fully \u-escaped), seeds and
# evaluate answers; 1 MiB is far above any of them and refuses floods before they are buffered.
MAX_BODY_BYTES = 1 * MiB


def create_app(options: GymOptions | None = None, tasks: TaskSet | None = None, *,
               token: str | None = None) -> FastAPI:
    """The genv routes over one ``LocalGym`` (started and closed with the app); ``token``: the bearer token
    every route but ``/health`` needs (None: none, for a gym on loopback)."""
    gym = LocalGym(options, tasks)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await gym.start()
        app.state.manager = gym.manager
        try:
            yield
        finally:
            await gym.close()

    app = FastAPI(title="cua-gym (genv-compatible local desktop gym)", lifespan=lifespan)
    app.state.gym = gym
    app.state.drain = gym.drain   # DrainingServer: creates in flight are refused (429) when the server stops
    limit_body(app, MAX_BODY_BYTES)

    @app.exception_handler(GymError)
    async def gym_error(_request: Request, exc: GymError) -> JSONResponse:
        body = {"detail": exc.detail} if exc.fault is None else {"detail": exc.detail, "fault": exc.fault}
        return JSONResponse(body, status_code=exc.status)

    @app.exception_handler(ClientGone)
    async def client_gone(_request: Request, exc: ClientGone) -> JSONResponse:
        """A create or fork whose client hung up (``unless_client_leaves``): what it made is ended; the answer
        (499, nginx's "client closed request") reaches nobody, the log says what happened."""
        logger.info("%s", exc)
        return JSONResponse({"detail": str(exc)}, status_code=499)

    async def end_all(ids: list[str]) -> None:
        """Terminate the executions a request made for a client that hung up (one already gone is fine)."""
        for eid in ids:
            if gym.manager.get(eid) is not None:
                await gym.terminate(eid)

    async def json_body(request: Request, expected: str, empty: object = None) -> object:
        """The body as JSON (``empty`` when there is none); 422 saying what was expected otherwise."""
        raw = await request.body()
        if not raw:
            return empty
        try:
            return parse_json(raw)
        except BadJSON as exc:
            raise HTTPException(422, f"{exc}; expected {expected}") from exc

    def check_gym(gym_id: str) -> None:
        if gym_id != gym.gym_id:
            raise HTTPException(404, f"unknown gym {gym_id!r}; this server serves {gym.gym_id!r}")

    @app.get("/health")
    async def health() -> dict:
        return gym.health()

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        """Prometheus text (metrics.py): executions by state, capacity, create/step/evaluate latencies."""
        return PlainTextResponse(gym.metrics_text(), media_type=CONTENT_TYPE)

    @app.get("/api/v1/{gym_id}/capacity")
    async def capacity(gym_id: str) -> dict:
        """Our extension of genv: ``{"free": n, "max": m}`` executions; a fleet places groups by it."""
        check_gym(gym_id)
        return gym.capacity()

    @app.get("/api/v1/{gym_id}/tasks")
    async def list_tasks(gym_id: str) -> dict:
        check_gym(gym_id)
        return {"tasks": [t.to_wire() for t in gym.tasks.tasks]}

    @app.get("/api/v1/{gym_id}/tasks/{task_id}")
    async def get_task(gym_id: str, task_id: str) -> dict:
        check_gym(gym_id)
        return gym.task(task_id).to_wire()

    @app.post("/api/v1/{gym_id}/tasks/{task_id}", openapi_extra=body_spec(CreateBody))
    async def create_execution(gym_id: str, task_id: str, request: Request) -> dict:
        check_gym(gym_id)
        gym.task(task_id)   # an unknown task is a 404 before the body is looked at
        expected = "{} or {\"options\": {\"seed\": 7}}"
        body = await json_body(request, expected, empty={})
        if body is None:    # JSON null is not "no body": a caller that sends it has a bug worth hearing about
            raise HTTPException(422, f"the body must be a JSON object ({expected}) or absent, not null")
        counts, started = gym.manager.metrics, time.monotonic()
        try:   # a client that hangs up first gets no execution left running (docs/security.md)
            created = await unless_client_leaves(request, gym.reset(task_id, body),
                                                 lambda made: end_all([made["execution_id"]]))
        except GymError as exc:
            if exc.status == 429 or exc.status >= 500:
                counts.count("refused_full" if exc.status == 429 else "create_failed")
            raise
        except Exception:   # a 500: failed all the same, and counted as such
            counts.count("create_failed")
            raise
        counts.create.observe(time.monotonic() - started)
        counts.count("created")
        return created

    @app.get("/api/v1/{gym_id}/executions/{eid}")
    async def get_execution(gym_id: str, eid: str) -> dict:
        check_gym(gym_id)
        return gym.describe(eid)

    @app.get("/api/v1/{gym_id}/executions/{eid}/screenshot")
    async def screenshot(gym_id: str, eid: str, format: str = "png", quality: int = 85) -> Response:
        check_gym(gym_id)
        data, fmt = await gym.screenshot(eid, format, quality)
        return Response(data, media_type=f"image/{fmt}")

    @app.post("/api/v1/{gym_id}/executions/{eid}/actions", openapi_extra=body_spec(ActionBody, required=True))
    async def act(gym_id: str, eid: str, request: Request) -> dict:
        check_gym(gym_id)
        gym.execution(eid)   # an unknown execution is a 404 before the body is looked at
        body = await json_body(request, "{\"action\": {...}}")
        with gym.manager.metrics.step.time():
            return await gym.act(eid, body.get("action", body) if isinstance(body, dict) else body)

    @app.post("/api/v1/{gym_id}/executions/{eid}/evaluate", openapi_extra=body_spec(EvaluateBody))
    async def evaluate(gym_id: str, eid: str, request: Request) -> dict:
        check_gym(gym_id)
        gym.execution(eid)
        body = await json_body(request, "an object such as {\"answer_text\": \"...\"} (or no body)", empty={})
        if not isinstance(body, dict):
            raise HTTPException(422, f"evaluate body must be a JSON object (or empty), got {type(body).__name__}")
        with gym.manager.metrics.evaluate.time():
            return await gym.evaluate(eid, body)

    @app.get("/api/v1/{gym_id}/executions/{eid}/live")
    async def live(gym_id: str, eid: str, request: Request) -> Response:
        """Our extension of genv: a view-only live view of the execution's screen (noVNC), started on first
        use and ended with the execution; redirects to it (``?redirect=0``: its address as JSON)."""
        check_gym(gym_id)
        url = await gym.live_view(eid, request.url.hostname)
        if request.query_params.get("redirect") == "0":
            return JSONResponse({"execution_id": eid, "url": url})
        return RedirectResponse(url, status_code=303)

    @app.post("/api/v1/{gym_id}/executions/{eid}/fork", openapi_extra=body_spec(ForkBody))
    async def fork(gym_id: str, eid: str, request: Request) -> dict:
        """Our extension of genv: ``count`` new executions in the execution's state now (docs/protocols.md §1.9)."""
        check_gym(gym_id)
        gym.execution(eid)   # an unknown execution is a 404 before the body is looked at
        body = await json_body(request, '{"count": N}', empty={})
        # a client that hangs up first gets no child left running (docs/security.md)
        return await unless_client_leaves(request, gym.fork(eid, body),
                                          lambda made: end_all([c["id"] for c in made["executions"]]))

    @app.post("/api/v1/{gym_id}/executions/{eid}/terminate")
    async def terminate(gym_id: str, eid: str) -> dict:
        check_gym(gym_id)
        return await gym.terminate(eid)

    publish(app)          # the bodies' typed models in /openapi.json (bodies.py)
    protect(app, token)   # last: outside the body limit, so a stranger's body is never read
    return app


@dataclass
class GymServer:
    """A gym served in this process (``start_gym_server``); ``stop()`` ends every desktop."""

    served: ServedApp
    gym_id: str
    app: FastAPI = field(repr=False)

    @property
    def url(self) -> str:
        return self.served.url

    @property
    def manager(self) -> GymManager:
        return self.app.state.manager

    def stop(self) -> None:
        self.served.stop(timeout_s=60)

    def __enter__(self) -> "GymServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def make_options(**opts) -> GymOptions:
    known = {f.name for f in fields(GymOptions)}
    unknown = set(opts) - known
    if unknown:
        raise TypeError(f"unknown gym options {sorted(unknown)}; known: {sorted(known)}")
    return GymOptions(**opts)


def start_gym_server(host: str = "127.0.0.1", port: int = 0, *, log_level: str = "warning", token: str | None = None,
                     **opts) -> GymServer:
    """Start the gym on ``host:port`` (0 = a free port) in a background thread; ``opts`` are ``GymOptions``.
    ``token``: what its clients must send (needed on an address other than loopback: ValueError otherwise)."""
    refused = exposure_error("start_gym_server", host, token, False, GYM_TOKEN)
    if refused:
        raise ValueError(refused)
    options = make_options(**opts)
    app = create_app(options, token=token)
    served = serve_app_in_thread(app, host, port, log_level=log_level)
    return GymServer(served=served, gym_id=options.gym_id, app=app)
