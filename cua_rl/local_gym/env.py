"""The embedded gym as one object: ``reset`` (a new execution of a task), ``screenshot``, ``act``, ``evaluate``,
``terminate``, ``close``.

Why: the desktops, the warm pool, the task suite and the logic that waits for the screen to settle after an
action are one environment, usable without HTTP (Gymnasium's ``Env`` shape). ``server.py`` only adapts it to
the genv API; every refusal here is a ``GymError`` carrying the HTTP status a genv server answers with.

    async with LocalGym(GymOptions(gym_id="desktop")) as gym:
        ex = await gym.reset("053", seed=7)
        png = await gym.screenshot(ex["execution_id"])
        await gym.act(ex["execution_id"], {"type": "key", "keys": ["r"]})
        result = await gym.evaluate(ex["execution_id"])
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from .actions import ActionError, parse_action, perform
from .browser import page_events
from .live import LiveViewError
from .manager import CapacityError, Execution, GymManager, GymOptions
from .screen import settle
from .suite import OptionsError, create_options, make_suite
from .tasks import TaskDef, TaskSet

logger = logging.getLogger(__name__)

# Settling after an action (screen.settle): wait up to CHANGE_WAIT for the first changed pixels, then until the
# screen is unchanged for a moment. Keys and clicks may open dialogs, whose first pixels come 80-300 ms later;
# typed characters show within ~10-20 ms.
CHANGE_WAIT_S = {"key": 0.3, "click": 0.3, "press": 0.3, "type": 0.12, "scroll": 0.12, "drag": 0.12}
SCREENSHOT_FORMATS = ("png", "jpeg")


class GymError(Exception):
    """A refused or failed call: ``status`` is the HTTP status the genv API answers with, ``detail`` says why."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


class LocalGym:
    """The tasks of one suite (desktop tasks, the curriculum or MiniWoB++) on this machine's desktops.
    ``start`` (or ``async with``) opens the desktop manager, its reaper and the warm pool; ``close`` ends
    every desktop."""

    def __init__(self, options: GymOptions | None = None, tasks: TaskSet | None = None) -> None:
        self.options = options or GymOptions()
        self.suite = make_suite(self.options, tasks)
        self.tasks: TaskSet = self.suite.tasks
        self._manager: GymManager | None = None
        self._reaper: asyncio.Task | None = None

    @property
    def gym_id(self) -> str:
        return self.options.gym_id

    @property
    def manager(self) -> GymManager:
        if self._manager is None:
            raise RuntimeError("LocalGym is not started (call start() or use `async with`)")
        return self._manager

    async def start(self) -> "LocalGym":
        opt = self.options
        self._manager = GymManager(opt)
        self._reaper = asyncio.create_task(self._manager.reap_forever())
        if any(getattr(getattr(t, "setup", None), "vm", None) is None for t in self.tasks.tasks):
            self._manager.refill_x()   # bare X servers for cold creates; a gym of VM tasks only needs none
        if opt.prewarm:
            self._manager.prewarm([t for t in (self.tasks.get(k) for k in opt.prewarm) if t is not None])
        logger.info("gym %s (%s): %d tasks, up to %d executions", opt.gym_id, self.suite.kind, len(self.tasks),
                    opt.max_executions)
        return self

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        if self._manager is not None:
            await self._manager.close()
            logger.info("gym %s shut down; every desktop ended", self.gym_id)

    async def __aenter__(self) -> "LocalGym":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # ---- lookups ---------------------------------------------------------------------------------------
    def health(self) -> dict:
        m = self.manager
        return {"ok": True, "gym_id": self.gym_id, "suite": self.suite.kind, "tasks": len(self.tasks),
                "executions": len(m.executions), "pool": m.pool_stats()}

    def task(self, task_id: str) -> TaskDef:
        task = self.tasks.get(task_id)
        if task is None:
            raise GymError(404, f"unknown task {task_id!r}")
        return task

    def execution(self, eid: str) -> Execution:
        ex = self.manager.get(eid)
        if ex is None:
            raise GymError(404, f"unknown execution {eid!r} (never created, terminated or reaped)")
        return ex

    def describe(self, eid: str) -> dict:
        ex = self.execution(eid)
        return {"execution_id": ex.execution_id, "status": "running", "task_id": ex.task.task_id,
                "screen": {"width": ex.desktop.spec.width, "height": ex.desktop.spec.height},
                "age_s": round(time.monotonic() - ex.created, 3)}

    # ---- the episode -----------------------------------------------------------------------------------
    async def reset(self, task_id: str, body: object = None) -> dict:
        """A new execution of ``task_id`` on a fresh desktop; ``body`` is the create request's JSON
        (``{"options": {"seed": 7}}``, or None). 429 at capacity; 503 when no desktop could start."""
        task = self.task(task_id)
        try:
            seed = create_options(body)
        except OptionsError as exc:
            raise GymError(422, str(exc)) from exc
        try:
            ex = await self.manager.create(task)
        except CapacityError as exc:
            raise GymError(429, str(exc)) from exc
        except RuntimeError as exc:
            logger.error("create execution of %s failed: %s", task_id, exc)
            raise GymError(503, f"could not start a desktop: {exc}") from exc
        try:
            extra = await self.suite.begin(ex, seed)
        except Exception as exc:  # noqa: BLE001 - the execution is ended, the caller told why
            logger.error("starting task %s in execution %s failed: %s", task_id, ex.execution_id, exc)
            await self.manager.terminate(ex.execution_id)
            raise GymError(503, f"could not start task {task.task_id}: {exc}") from exc
        d = ex.desktop
        kind = getattr(d, "device_type", "browser" if self.suite.kind == "miniwob" else "desktop")
        return {"execution_id": ex.execution_id, "task_id": task.task_id, "status": "running",
                "device": {"type": kind, "display": d.display, "width": d.spec.width, "height": d.spec.height},
                "warm": ex.from_pool, "reused": ex.reused,
                # our extension: where to watch it (started on first request)
                "live_view": f"/api/v1/{self.gym_id}/executions/{ex.execution_id}/live",
                **extra}

    async def screenshot(self, eid: str, fmt: str = "png", quality: int = 85) -> tuple[bytes, str]:
        """(image bytes, format) of the execution's screen now; the format is remembered, so the frame after
        the next action is encoded in it ahead of the request."""
        ex = self.execution(eid)
        fmt = fmt.lower().replace("jpg", "jpeg")
        if fmt not in SCREENSHOT_FORMATS:
            raise GymError(422, f"format must be png or jpeg, got {fmt!r}")
        if not 1 <= quality <= 100:
            raise GymError(422, "quality must be in 1..100")
        screen = ex.desktop.screen
        ex.state["shot_format"] = (fmt, quality)
        try:
            raw = screen.frame_now()
            data = screen.cached(raw, fmt, quality) or await asyncio.to_thread(screen.encode, raw, fmt, quality)
        except Exception as exc:  # noqa: BLE001 - the X server of this desktop is gone
            logger.error("screenshot of %s failed: %s", eid, exc)
            raise GymError(503, f"desktop of execution {eid} is not responding: {exc}") from exc
        return data, fmt

    async def act(self, eid: str, raw_action: object) -> dict:
        """Perform one action and wait for the screen to settle: ``{ok, screen_changed}``, or ``ok: false``
        with the error when the X server refused the input (the desktop is kept)."""
        ex = self.execution(eid)
        try:
            action = parse_action(raw_action)
        except ActionError as exc:
            raise GymError(exc.status, exc.detail) from exc
        async with ex.lock:
            if eid not in self.manager.executions:
                raise GymError(404, f"execution {eid!r} was terminated")
            d = ex.desktop
            try:
                before = d.screen.arm_and_grab()
            except Exception as exc:  # noqa: BLE001 - the X server of this desktop is gone
                raise GymError(503, f"desktop of execution {eid} is not responding: {exc}") from exc
            # Browser desktops: the action returns once the page has received its input (browser.py).
            inputs = await d.input_count() if hasattr(d, "input_count") else None
            try:
                await perform(action, d.xinput, d.spec.width, d.spec.height, ex.state)
                if inputs is not None:
                    await d.wait_input(inputs, page_events(action, d.xinput))
            except Exception as exc:  # noqa: BLE001 - the X server said no; report, keep the desktop
                logger.warning("action %s on %s failed: %s", action.type, eid, exc)
                with contextlib.suppress(Exception):
                    d.xinput.reset_modifiers()
                return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "screen_changed": False}
            try:
                changed, frame = await settle(d.screen, before, CHANGE_WAIT_S.get(action.type, 0.0))
            except Exception as exc:  # noqa: BLE001
                raise GymError(503, f"desktop of execution {eid} is not responding: {exc}") from exc
            d.screen.prepare(frame, *ex.state.get("shot_format", ("png", 85)))
            ex.last_used = time.monotonic()
        return {"ok": True, "screen_changed": changed}

    async def evaluate(self, eid: str, body: dict | None = None) -> dict:
        """The task's validators on the execution's final state (``body``: e.g. ``{"answer_text": ...}``)."""
        ex = self.execution(eid)
        try:
            result = await self.suite.evaluate(ex, body or {})
        except Exception as exc:  # noqa: BLE001 - e.g. the browser of this execution is gone
            logger.error("evaluating execution %s failed: %s", eid, exc)
            raise GymError(503, f"could not evaluate execution {eid}: {exc}") from exc
        return {**result, "execution_id": eid, "task_id": ex.task.task_id}

    async def live_view(self, eid: str, viewer_host: str | None = None) -> str:
        """The address of a view-only live view of the execution's screen (live.py), started on first use;
        ``viewer_host``: the host name the viewer used to reach the gym, put into the address when the view
        listens on every interface."""
        self.execution(eid)
        try:
            view = await self.manager.live_view(eid)
        except KeyError:
            raise GymError(404, f"unknown execution {eid!r}") from None
        except LiveViewError as exc:
            raise GymError(501, str(exc)) from exc
        return view.url(viewer_host)

    async def terminate(self, eid: str) -> dict:
        if not await self.manager.terminate(eid):
            raise GymError(404, f"unknown execution {eid!r}")
        return {"execution_id": eid, "status": "terminated"}
