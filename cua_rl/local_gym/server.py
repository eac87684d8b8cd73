"""The genv-compatible HTTP API (external-protocols §1.1 + DESIGN.md §4.1) over ``GymManager``.

``start_gym_server(host, port, **options)`` runs it in-process (tests, the embedded launcher) and returns a
handle with ``.url``, ``.gym_id``, ``.manager`` and ``.stop()``; ``cua-gym serve`` runs it in the foreground.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field, fields

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response

from ..asgi_thread import ServedApp, serve_app_in_thread
from ..http_input import MiB, BadJSON, limit_body, parse_json
from .actions import ActionError, parse_action, perform
from .browser import page_events
from .manager import CapacityError, Execution, GymManager, GymOptions
from .suite import OptionsError, create_options, make_suite
from .tasks import TaskSet

logger = logging.getLogger(__name__)

# Settling after an action (measurements §4): wait up to CHANGE_WAIT for the first changed pixels, then
# until the screen is unchanged for STABLE, at most MAX_SETTLE in all. Keys and clicks may open dialogs,
# whose first pixels come 80-300 ms later; typed characters show within ~10-20 ms.
POLL_S, STABLE_S, MAX_SETTLE_S = 0.006, 0.012, 2.0
CHANGE_WAIT_S = {"key": 0.3, "click": 0.3, "press": 0.3, "type": 0.12, "scroll": 0.12, "drag": 0.12}
# Request bodies are actions (text at most 4000 characters: under 25 KB even fully \u-escaped), seeds and
# evaluate answers; 1 MiB is far above any of them and refuses floods before they are buffered.
MAX_BODY_BYTES = 1 * MiB


async def settle(ex: Execution, before: bytearray, change_wait_s: float) -> tuple[bool, bytearray]:
    """Whether the action changed the screen, and the settled frame: the first change within
    ``change_wait_s``, then no change for ``STABLE_S`` (at most ``MAX_SETTLE_S`` in all). With X DAMAGE
    (``screen.damage``, armed before ``before`` was grabbed) the waits cost nothing and the frame one grab."""
    screen = ex.desktop.screen
    if screen.damage is not None:
        t0 = time.monotonic()
        if not await screen.damage.changed_within(change_wait_s):
            return False, before
        while time.monotonic() - t0 < MAX_SETTLE_S and await screen.damage.changed_within(STABLE_S):
            pass
        frame = screen.grab()
        return frame != before, frame
    return await _settle_by_polling(screen, before, change_wait_s)


async def _settle_by_polling(screen, before: bytearray, change_wait_s: float) -> tuple[bool, bytearray]:
    """Grabs run inline: one is well under a millisecond with MIT-SHM, cheaper than a thread hop."""
    t0 = time.monotonic()
    last, last_change, changed = before, t0, False
    while True:
        await asyncio.sleep(POLL_S)
        cur = screen.grab()
        now = time.monotonic()
        if cur != last:
            last, last_change = cur, now
            changed = changed or cur != before
        elif changed and now - last_change >= STABLE_S:
            break
        elif not changed and now - t0 >= change_wait_s:
            break
        if now - t0 >= MAX_SETTLE_S:
            break
    return last != before, last


def create_app(options: GymOptions | None = None, tasks: TaskSet | None = None) -> FastAPI:
    opt = options or GymOptions()
    suite = make_suite(opt, tasks)
    taskset = suite.tasks
    state: dict = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        manager = GymManager(opt)
        state["manager"] = manager
        app.state.manager = manager
        reaper = asyncio.create_task(manager.reap_forever())
        if opt.prewarm:
            manager.prewarm([t for t in (taskset.get(k) for k in opt.prewarm) if t is not None])
        logger.info("gym %s (%s): %d tasks, up to %d executions", opt.gym_id, suite.kind, len(taskset),
                    opt.max_executions)
        try:
            yield
        finally:
            reaper.cancel()
            await manager.close()
            logger.info("gym %s shut down; every desktop ended", opt.gym_id)

    app = FastAPI(title="cua-gym (genv-compatible local desktop gym)", lifespan=lifespan)
    limit_body(app, MAX_BODY_BYTES)

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
        if gym_id != opt.gym_id:
            raise HTTPException(404, f"unknown gym {gym_id!r}; this server serves {opt.gym_id!r}")

    def execution(gym_id: str, eid: str) -> Execution:
        check_gym(gym_id)
        ex = state["manager"].get(eid)
        if ex is None:
            raise HTTPException(404, f"unknown execution {eid!r} (never created, terminated or reaped)")
        return ex

    @app.get("/health")
    async def health() -> dict:
        m: GymManager = state["manager"]
        return {"ok": True, "gym_id": opt.gym_id, "suite": suite.kind, "tasks": len(taskset), "executions": len(m.executions),
                "pool": m.pool_stats()}

    @app.get("/api/v1/{gym_id}/tasks")
    async def list_tasks(gym_id: str) -> dict:
        check_gym(gym_id)
        return {"tasks": [t.to_wire() for t in taskset.tasks]}

    @app.get("/api/v1/{gym_id}/tasks/{task_id}")
    async def get_task(gym_id: str, task_id: str) -> dict:
        check_gym(gym_id)
        task = taskset.get(task_id)
        if task is None:
            raise HTTPException(404, f"unknown task {task_id!r}")
        return task.to_wire()

    @app.post("/api/v1/{gym_id}/tasks/{task_id}")
    async def create_execution(gym_id: str, task_id: str, request: Request) -> JSONResponse:
        check_gym(gym_id)
        task = taskset.get(task_id)
        if task is None:
            raise HTTPException(404, f"unknown task {task_id!r}")
        body = await json_body(request, "{} or {\"options\": {\"seed\": 7}}")
        try:
            seed = create_options(body)
        except OptionsError as exc:
            raise HTTPException(422, str(exc)) from exc
        manager: GymManager = state["manager"]
        try:
            ex = await manager.create(task)
        except CapacityError as exc:
            raise HTTPException(429, str(exc)) from exc
        except RuntimeError as exc:
            logger.error("create execution of %s failed: %s", task_id, exc)
            raise HTTPException(503, f"could not start a desktop: {exc}") from exc
        try:
            extra = await suite.begin(ex, seed)
        except Exception as exc:  # noqa: BLE001 - the execution is ended, the caller told why
            logger.error("starting task %s in execution %s failed: %s", task_id, ex.execution_id, exc)
            await manager.terminate(ex.execution_id)
            raise HTTPException(503, f"could not start task {task.task_id}: {exc}") from exc
        d = ex.desktop
        kind = "browser" if suite.kind == "miniwob" else "desktop"
        return JSONResponse({"execution_id": ex.execution_id, "task_id": task.task_id, "status": "running",
                             "device": {"type": kind, "display": d.display, "width": d.spec.width,
                                        "height": d.spec.height},
                             "warm": ex.from_pool, **extra})

    @app.get("/api/v1/{gym_id}/executions/{eid}")
    async def get_execution(gym_id: str, eid: str) -> dict:
        ex = execution(gym_id, eid)
        return {"execution_id": ex.execution_id, "status": "running", "task_id": ex.task.task_id,
                "screen": {"width": ex.desktop.spec.width, "height": ex.desktop.spec.height},
                "age_s": round(time.monotonic() - ex.created, 3)}

    @app.get("/api/v1/{gym_id}/executions/{eid}/screenshot")
    async def screenshot(gym_id: str, eid: str, format: str = "png", quality: int = 85) -> Response:
        ex = execution(gym_id, eid)
        fmt = format.lower().replace("jpg", "jpeg")
        if fmt not in ("png", "jpeg"):
            raise HTTPException(422, f"format must be png or jpeg, got {format!r}")
        if not 1 <= quality <= 100:
            raise HTTPException(422, "quality must be in 1..100")
        screen = ex.desktop.screen
        ex.state["shot_format"] = (fmt, quality)
        try:
            raw = screen.grab()
            data = screen.cached(raw, fmt, quality) or await asyncio.to_thread(screen.encode, raw, fmt, quality)
        except Exception as exc:  # noqa: BLE001 - the X server of this desktop is gone
            logger.error("screenshot of %s failed: %s", eid, exc)
            raise HTTPException(503, f"desktop of execution {eid} is not responding: {exc}") from exc
        return Response(data, media_type=f"image/{fmt}")

    @app.post("/api/v1/{gym_id}/executions/{eid}/actions")
    async def act(gym_id: str, eid: str, request: Request) -> dict:
        ex = execution(gym_id, eid)
        body = await json_body(request, "{\"action\": {...}}")
        raw = body.get("action", body) if isinstance(body, dict) else body
        try:
            action = parse_action(raw)
        except ActionError as exc:
            raise HTTPException(exc.status, exc.detail) from exc
        async with ex.lock:
            if eid not in state["manager"].executions:
                raise HTTPException(404, f"execution {eid!r} was terminated")
            d = ex.desktop
            try:
                if d.screen.damage is not None:
                    d.screen.damage.arm()
                before = d.screen.grab()
            except Exception as exc:  # noqa: BLE001 - the X server of this desktop is gone
                raise HTTPException(503, f"desktop of execution {eid} is not responding: {exc}") from exc
            # Browser desktops: the action returns once the page has received its input (browser.py).
            inputs = await d.input_count() if hasattr(d, "input_count") else None
            try:
                await perform(action, d.xinput, d.spec.width, d.spec.height, ex.state)
                if inputs is not None:
                    await d.wait_input(inputs, page_events(action))
            except Exception as exc:  # noqa: BLE001 - the X server said no; report, keep the desktop
                logger.warning("action %s on %s failed: %s", action.type, eid, exc)
                with contextlib.suppress(Exception):
                    d.xinput.reset_modifiers()
                return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "screen_changed": False}
            wait = CHANGE_WAIT_S.get(action.type, 0.0)
            try:
                changed, frame = await settle(ex, before, wait)
            except Exception as exc:  # noqa: BLE001
                raise HTTPException(503, f"desktop of execution {eid} is not responding: {exc}") from exc
            ex.last_used = time.monotonic()
            # The agent's next call is almost always a screenshot of this very frame, in the format it
            # asked for last time: start encoding it now.
            fmt, quality = ex.state.get("shot_format", ("png", 85))
            asyncio.get_running_loop().run_in_executor(None, d.screen.encode, frame, fmt, quality)
        return {"ok": True, "screen_changed": changed}

    @app.post("/api/v1/{gym_id}/executions/{eid}/evaluate")
    async def evaluate(gym_id: str, eid: str, request: Request) -> dict:
        ex = execution(gym_id, eid)
        body = await json_body(request, "an object such as {\"answer_text\": \"...\"} (or no body)", empty={})
        if not isinstance(body, dict):
            raise HTTPException(422, f"evaluate body must be a JSON object (or empty), got {type(body).__name__}")
        try:
            result = await suite.evaluate(ex, body)
        except Exception as exc:  # noqa: BLE001 - e.g. the browser of this execution is gone
            logger.error("evaluating execution %s failed: %s", eid, exc)
            raise HTTPException(503, f"could not evaluate execution {eid}: {exc}") from exc
        result["execution_id"] = eid
        result["task_id"] = ex.task.task_id
        return result

    @app.post("/api/v1/{gym_id}/executions/{eid}/terminate")
    async def terminate(gym_id: str, eid: str) -> dict:
        check_gym(gym_id)
        if not await state["manager"].terminate(eid):
            raise HTTPException(404, f"unknown execution {eid!r}")
        return {"execution_id": eid, "status": "terminated"}

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


def start_gym_server(host: str = "127.0.0.1", port: int = 0, *, log_level: str = "warning", **opts) -> GymServer:
    """Start the gym on ``host:port`` (0 = a free port) in a background thread; ``opts`` are ``GymOptions``."""
    options = make_options(**opts)
    app = create_app(options)
    served = serve_app_in_thread(app, host, port, log_level=log_level)
    return GymServer(served=served, gym_id=options.gym_id, app=app)
