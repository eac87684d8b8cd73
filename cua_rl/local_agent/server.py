"""The HTTP API of the agent service (docs/protocols.md §2.1), compatible with the gbox-mini-agent.

``POST /runs`` starts a run as an asyncio task on the server's loop and answers ``{"runId"}`` at once;
the other endpoints read that run's record. ``POST /runs/{id}/cancel`` ends a run (``run_end`` with reason
``cancelled``). Finished runs stay readable until ``keep_finished_runs``/``finished_ttl_s`` push them out.

With a ``token`` every route but ``/health`` needs it, and state changes are JSON only (cua_rl/http/auth.py); the
service sends the gym token (``gym_token``, else ``CUA_GYM_TOKEN``) to the gyms its runs drive. A continuation
(``startFrom``) must show the model key its parent run was started with.

In-process use (tests, the embedded launcher)::

    handle = start_agent_server()          # 127.0.0.1, a free port
    ... MiniAgentClient(handle.url) ...
    handle.stop()                          # cancels running runs, closes the port
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
import uuid
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import httpx
from fastapi import FastAPI, HTTPException, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from ..genv import GenvClient
from ..http.auth import AGENT_TOKEN, exposure_error, protect
from ..http.input import MiB, limit_body
from ..http.serve import ServedApp, serve_app_in_thread
from .formats import format_names
from .record import ResumePoint, RunRecord, parse_time
from .runner import AgentRun, AgentSettings
from .schema import RunRequest

logger = logging.getLogger(__name__)
# The only body is the start-run payload: an instruction and two small objects (a few KB in practice).
# 1 MiB keeps room for long instructions and refuses floods before they are buffered.
MAX_BODY_BYTES = 1 * MiB
# What this service does beyond gbox-mini-agent's protocol, listed by ``GET /health`` so a caller can refuse a
# mode this agent cannot serve (a tree group needs ``startFrom``: docs/local_agent.md)
FEATURES = ("startFrom",)


class RunManager:
    """All runs of one service instance. Lives on the server's event loop."""

    def __init__(self, settings: AgentSettings, gym_token: str | None = None) -> None:
        self.settings = settings
        self.gym_token = gym_token   # None: GenvClient's own (CUA_GYM_TOKEN)
        self.runs: dict[str, RunRecord] = {}
        self.tasks: dict[str, asyncio.Task] = {}
        self.hints_supported: dict[str, bool] = {}
        self.http: httpx.AsyncClient | None = None
        self.gyms: dict[tuple[str, str], GenvClient] = {}  # (gymBaseUrl, gymId) -> shared client

    async def open(self) -> None:
        limits = httpx.Limits(max_connections=4 * self.settings.max_concurrent_runs, max_keepalive_connections=64)
        self.http = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(self.settings.model_timeout_s,
                                                                           connect=10.0))

    async def close(self) -> None:
        """Cancel what still runs (each ends with ``run_end``), then close the shared HTTP client."""
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self.http is not None:
            await self.http.aclose()
        for gym in self.gyms.values():
            await gym.aclose()

    @property
    def running(self) -> int:
        return len(self.tasks)

    def start(self, request: RunRequest) -> RunRecord:
        if self.running >= self.settings.max_concurrent_runs:
            raise HTTPException(503, f"{self.running} runs in progress; this service allows "
                                     f"{self.settings.max_concurrent_runs} at once (retry later)")
        path = self._path_so_far(request)
        start = path[-1].continued(self.runs[request.start_from.run_id]) if path else None
        self._prune()
        run_id = uuid.uuid4().hex
        record = RunRecord(run_id=run_id, request=request.redacted(), agent=request.agent,
                           key_digest=_digest(request.model.api_key))
        record.resume_points = path   # a continuation's points go on from its parent's: steps count path steps
        self.runs[run_id] = record
        assert self.http is not None, "RunManager.open() was not awaited"
        key = (request.env.gym_base_url, request.env.gym_id)
        if key not in self.gyms:
            self.gyms[key] = GenvClient(*key, retry=self.settings.gym_retry, token=self.gym_token)
        run = AgentRun(record, request, self.settings, self.http, self.gyms[key], self.hints_supported, start)
        task = asyncio.create_task(run.run(), name=f"agent-run-{run_id}")
        self.tasks[run_id] = task
        task.add_done_callback(lambda _t, rid=run_id: self.tasks.pop(rid, None))
        logger.info("run %s started: agent=%s execution=%s maxSteps=%d", run_id, request.agent,
                    request.env.execution_id, request.max_steps)
        return record

    def _path_so_far(self, request: RunRequest) -> list[ResumePoint]:
        """Where ``startFrom`` continues: the parent run's resume points up to its state after the first ``steps``
        steps of its path ([] without ``startFrom``; a continuation's own points follow its parent's, so a
        continuation forks again as a root does), refused (422, the
        field named) when this service has no such run or it has not finished that many steps yet, or when the
        continuation would build other prompts than the parent's (another task, prompt format or history size);
        403 when it does not show the parent's model key (``owns``)."""
        start = request.start_from
        if start is None:
            return []
        parent = self.runs.get(start.run_id)
        if parent is None:
            raise HTTPException(422, f"startFrom.runId: no run {start.run_id} on this agent service (finished runs "
                                     f"are kept {self.settings.finished_ttl_s:g} s; a continuation starts from a run "
                                     f"of the same service)")
        owns(parent, request)
        if len(parent.resume_points) < start.steps:
            raise HTTPException(422, f"startFrom.steps: run {start.run_id} has finished "
                                     f"{len(parent.resume_points)} steps of its path that can be continued, "
                                     f"not {start.steps}")
        asked = request.redacted()
        for name in ("task", "agent", "standardActionSpace", "historyImages"):
            if parent.request.get(name) != asked.get(name):
                raise HTTPException(422, f"startFrom: {name} differs from run {start.run_id}'s "
                                         f"({parent.request.get(name)!r} there, {asked.get(name)!r} here): a "
                                         f"continuation must build the prompts its parent would")
        path = parent.resume_points[:start.steps]
        assert path[-1].steps == start.steps, f"run {start.run_id}'s resume points skip a step ({path[-1].steps})"
        return path

    async def cancel(self, run_id: str) -> RunRecord:
        record = self.get(run_id)
        task = self.tasks.get(run_id)
        if task is not None and not record.finished:
            record.cancel_requested = True
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        return record

    def get(self, run_id: str) -> RunRecord:
        record = self.runs.get(run_id)
        if record is None:
            raise HTTPException(404, f"run {run_id} not found")
        return record

    def _prune(self) -> None:
        """Forget finished runs past the TTL, then the oldest beyond ``keep_finished_runs``."""
        now = time.monotonic()
        finished = [r for r in self.runs.values() if r.finished and r.ended_monotonic is not None]
        for record in finished:
            if now - record.ended_monotonic > self.settings.finished_ttl_s:
                del self.runs[record.run_id]
        finished = sorted((r for r in self.runs.values() if r.finished), key=lambda r: r.ended_monotonic or 0)
        for record in finished[: max(0, len(finished) - self.settings.keep_finished_runs)]:
            del self.runs[record.run_id]


def _digest(key) -> bytes:
    """SHA-256 of a model key (a ``SecretStr``), b"" for none: what a run keeps to know its owner."""
    return b"" if key is None else hashlib.sha256(key.get_secret_value().encode()).digest()


def owns(parent: RunRecord, request: RunRequest) -> None:
    """403 unless ``request`` shows the model key ``parent`` was started with (``startFrom.apiKey``, else its own
    ``model.apiKey``): a continuation hands the parent's screenshots, replies and task to its own model, so only
    whoever started the parent may ask for one. A parent started without a key can be continued by nobody."""
    start = request.start_from
    shown = start.api_key if start is not None and start.api_key is not None else request.model.api_key
    if not parent.key_digest:
        raise HTTPException(403, f"startFrom: run {parent.run_id} was started without model.apiKey, so no "
                                 f"continuation can show it started it; it cannot be continued")
    if not hmac.compare_digest(_digest(shown), parent.key_digest):
        raise HTTPException(403, f"startFrom: run {parent.run_id} was started with another model key; a "
                                 f"continuation must show its parent's key (startFrom.apiKey, or model.apiKey)")


def _absolute(request: Request, value: Any) -> Any:
    """Screenshot paths in steps are stored relative; callers get URLs on this server."""
    base = str(request.base_url).rstrip("/")
    if isinstance(value, dict):
        return {k: (base + v if k == "url" and isinstance(v, str) and v.startswith("/runs/") else _absolute(request, v))
                for k, v in value.items()}
    if isinstance(value, list):
        return [_absolute(request, v) for v in value]
    return value


def _time_param(value: str | None, name: str) -> datetime | None:
    if value is None or value == "":
        return None
    try:
        return parse_time(value)
    except (ValueError, OverflowError, OSError):  # OverflowError/OSError: a number past the calendar
        raise HTTPException(400, f"'{name}' must be ISO-8601 or epoch milliseconds, got {value!r}") from None


async def _invalid_payload(_request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 naming each bad field and why, without FastAPI's echo of the input: it may hold model.apiKey
    (and a NaN in it would not even serialise)."""
    errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
              for e in exc.errors()]
    return JSONResponse({"detail": errors}, status_code=422)


def create_app(settings: AgentSettings | None = None, *, token: str | None = None,
               gym_token: str | None = None) -> FastAPI:
    """The FastAPI app; one :class:`RunManager` per app. ``token``: the bearer token every route but ``/health``
    needs (None: none, for a service on loopback); ``gym_token``: what it sends to gyms (None: ``CUA_GYM_TOKEN``)."""
    manager = RunManager(settings or AgentSettings(), gym_token)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        await manager.open()
        try:
            yield
        finally:
            await manager.close()

    app = FastAPI(title="cua-agent (gbox-mini-agent compatible)", lifespan=lifespan)
    app.state.manager = manager
    limit_body(app, MAX_BODY_BYTES)
    app.add_exception_handler(RequestValidationError, _invalid_payload)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"ok": True, "agents": format_names(), "running": manager.running, "runs": len(manager.runs),
                "features": list(FEATURES)}

    @app.post("/runs")
    async def start_run(request: RunRequest) -> dict[str, Any]:
        record = manager.start(request)
        return {"runId": record.run_id, "status": record.status}

    @app.get("/runs")
    async def list_runs() -> dict[str, Any]:
        return {"runs": [{"runId": r.run_id, "status": r.status, "reason": r.reason, "steps": len(r.steps)}
                         for r in manager.runs.values()]}

    @app.get("/runs/{run_id}")
    async def run_status(run_id: str) -> dict[str, Any]:
        return manager.get(run_id).summary()

    @app.post("/runs/{run_id}/cancel")
    async def cancel_run(run_id: str) -> dict[str, Any]:
        record = await manager.cancel(run_id)
        return {"runId": run_id, "status": record.status, "ok": record.ok, "reason": record.reason}

    @app.get("/runs/{run_id}/events")
    async def run_events(run_id: str, from_: str | None = Query(None, alias="from"),
                         to: str | None = None) -> dict[str, Any]:
        record = manager.get(run_id)
        events = record.events_between(_time_param(from_, "from"), _time_param(to, "to"))
        return {"runId": run_id, "status": record.status, "events": events}

    @app.get("/runs/{run_id}/steps")
    async def run_steps(request: Request, run_id: str) -> dict[str, Any]:
        return {"runId": run_id, "steps": _absolute(request, manager.get(run_id).steps)}

    @app.get("/runs/{run_id}/steps/{index}")
    async def run_step(request: Request, run_id: str, index: int) -> dict[str, Any]:
        steps = manager.get(run_id).steps
        if not 0 <= index < len(steps) or "endTs" not in steps[index]:
            raise HTTPException(404, f"step {index} (0-based) of run {run_id} is not available yet")
        return {"step": _absolute(request, steps[index])}

    @app.get("/runs/{run_id}/trajectory")
    async def run_trajectory(request: Request, run_id: str) -> dict[str, Any]:
        record = manager.get(run_id)
        trajectory = [{"step": s["step"], "screenshot": f"/runs/{run_id}/screenshots/{s['step']}",
                       "thinking": s.get("thinking"), "text": s.get("text"), "invalid": s.get("invalid"),
                       "actions": [{"name": a["name"], "args": a["args"], "gymAction": a["gymAction"],
                                    "result": a["rawResult"], "error": a.get("rawFeedback")} for a in s["actions"]],
                       "timing": s.get("timing")} for s in record.steps]
        final = f"/runs/{run_id}/screenshots/final" if "final" in record.screenshots else None
        return _absolute(request, {"runId": run_id, "status": record.status, "answer": record.answer,
                                   "trajectory": trajectory, "finalScreenshot": final})

    @app.get("/runs/{run_id}/tokens")
    async def run_tokens(run_id: str) -> dict[str, Any]:
        return {"runId": run_id, "tokens": manager.get(run_id).tokens}

    @app.get("/runs/{run_id}/screenshots/{name}")
    async def run_screenshot(run_id: str, name: str) -> Response:
        found = manager.get(run_id).screenshot_png(name)
        if found is None:
            raise HTTPException(404, f"run {run_id} has no screenshot {name!r}")
        data, media = found
        return Response(content=data, media_type=media)

    protect(app, token)   # last: outside the body limit, so a stranger's body is never read
    return app


def start_agent_server(host: str = "127.0.0.1", port: int = 0, settings: AgentSettings | None = None,
                       *, log_level: str = "warning", token: str | None = None,
                       gym_token: str | None = None) -> ServedApp:
    """Serve the agent API on a background thread; returns a handle with ``.url`` and ``.stop()``.

    ``port=0`` picks a free port. ``stop()`` cancels running runs (each gets its ``run_end``) and frees
    the port. Also usable as a context manager: ``with start_agent_server() as agent: ...``. ``token`` and
    ``gym_token``: as ``create_app``'s; an address other than loopback needs a ``token`` (ValueError otherwise).
    """
    refused = exposure_error("start_agent_server", host, token, False, AGENT_TOKEN)
    if refused:
        raise ValueError(refused)
    return serve_app_in_thread(create_app(settings, token=token, gym_token=gym_token), host, port,
                               log_level=log_level)
