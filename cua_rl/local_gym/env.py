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
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor

from Xlib.error import ConnectionClosedError

from .actions import ActionError, parse_action, perform
from .browser import page_events
from .fork import (
    Capture,
    ForkRefused,
    HomeRefused,
    Step,
    difference,
    fork_count,
    frames_equal,
    screen_key,
    state_difference,
    wait_for_screen,
)
from .live import LiveViewError
from .manager import CapacityError, Execution, GymManager, GymOptions, Reservation
from .screen import settle
from .suite import OptionsError, create_options, make_suite
from .tasks import TaskDef, TaskSet
from .xinput import InputRefused

logger = logging.getLogger(__name__)

# Settling after an action (screen.settle): wait up to CHANGE_WAIT for the first changed pixels, then until the
# screen is unchanged for a moment. Keys and clicks may open dialogs, whose first pixels come 80-300 ms later;
# typed characters show within ~10-20 ms.
CHANGE_WAIT_S = {"key": 0.3, "click": 0.3, "press": 0.3, "type": 0.12, "scroll": 0.12, "drag": 0.12}
SCREENSHOT_FORMATS = ("png", "jpeg")
REOPEN_X_S = 10.0   # how long re-opening the gym's lost X connections to a desktop may take (``_reopen_x``)


def _retrieve(run: asyncio.Future) -> None:
    """Read a finished evaluation's outcome, so one that ended after its request gave up logs no 'never retrieved'."""
    if not run.cancelled():
        run.exception()


class GymError(Exception):
    """A refused or failed call: ``status`` is the HTTP status the genv API answers with, ``detail`` says why,
    ``fault`` (on an execution's screenshot and action calls) whose failure it was: "gym" or "policy"."""

    def __init__(self, status: int, detail: str, fault: str | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.fault = status, detail, fault


class InjectedFault(RuntimeError):
    """An action failed on purpose as the gym's (``GymOptions.fault_rate``: the learning bench's mutation)."""


def _injected_fault(ex: Execution, rate: float) -> bool:
    """Whether this execution's next action fails on purpose: a draw from a generator seeded by the execution's
    id (the same execution fails the same actions whatever else runs)."""
    rng = ex.state.setdefault("fault_rng", random.Random(ex.execution_id))
    return rng.random() < rate


def _fault(ex: Execution, who: str, status: int, detail: str) -> GymError:
    """Count a failed call of ``ex`` as ``who``'s (docs/protocols.md 1.5) and the error that answers it."""
    _count(ex, who)
    return GymError(status, detail, fault=who)


def _count(ex: Execution, who: str) -> None:
    """One failed call of ``ex``, ``who``'s; a gym fault stays unrecovered until a call of ``ex`` is served."""
    ex.faults[who] += 1
    if who == "gym":
        ex.faults["gym_unrecovered"] += 1


def _served(ex: Execution) -> None:
    """A screenshot or action of ``ex`` served: every gym fault before it was recovered from (docs/protocols.md 1.4)."""
    ex.faults["gym_unrecovered"] = 0


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
        # Screenshot encoding (CPU only, never waits on a desktop) has threads of its own: nothing an execution
        # does elsewhere (an evaluate, an X round trip) can take them.
        self._encoder = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 2), thread_name_prefix="gym-encode")

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

    def drain(self) -> None:
        """The server is stopping: no new executions, creates waiting on a desktop are refused now."""
        if self._manager is not None:
            self._manager.drain()

    async def close(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        if self._manager is not None:
            await self._manager.close()
            logger.info("gym %s shut down; every desktop ended", self.gym_id)
        self._encoder.shutdown(wait=False, cancel_futures=True)
        if hasattr(self.suite, "close"):
            self.suite.close()

    async def __aenter__(self) -> "LocalGym":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # ---- lookups ---------------------------------------------------------------------------------------
    def health(self) -> dict:
        m = self.manager
        return {"ok": True, "gym_id": self.gym_id, "suite": self.suite.kind, "tasks": len(self.tasks),
                "executions": len(m.executions), "capacity": m.capacity(), "pool": m.pool_stats()}

    def capacity(self) -> dict:
        """``GET .../capacity``: ``{"free": n, "max": m}`` executions (docs/protocols.md §1.10)."""
        return self.manager.capacity()

    def metrics_text(self) -> str:
        """``GET /metrics``: Prometheus text (metrics.py)."""
        m = self.manager
        room = m.capacity()
        return m.metrics.render(m.states(), room["free"], room["max"])

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
                "age_s": round(time.monotonic() - ex.created, 3), "faults": dict(ex.faults),
                "actions": len(ex.history), "forked_from": ex.forked_from}

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
        except Exception as exc:  # noqa: BLE001 - whatever kept the desktop from starting: a 503 that says what
            logger.error("create execution of %s failed: %s", task_id, exc, exc_info=not isinstance(exc, RuntimeError))
            raise GymError(503, f"could not start a desktop: {exc}") from exc
        try:
            extra = await self._begin(ex, seed)
        except BaseException:
            await self.manager.terminate(ex.execution_id)
            raise
        return self._reply(ex, extra)

    async def _begin(self, ex: Execution, seed: int | None) -> dict:
        """The task's start on a new execution (``suite.begin``): its create reply's extra fields; remembers
        what a fork of it needs. A failure is a 503; the caller ends the execution."""
        try:
            extra = await self.suite.begin(ex, seed)
        except Exception as exc:  # noqa: BLE001 - the caller ends the execution, the client is told why
            logger.error("starting task %s in execution %s failed: %s", ex.task.task_id, ex.execution_id, exc)
            raise GymError(503, f"could not start task {ex.task.task_id}: {exc}") from exc
        d = ex.desktop
        ex.seed, ex.begun = extra.get("seed", seed), extra
        ex.mask = self.suite.volatile(ex.task, d.spec.width, d.spec.height)
        return extra

    def _reply(self, ex: Execution, extra: dict) -> dict:
        """The create reply of an execution (a fork's children get one each)."""
        d = ex.desktop
        kind = getattr(d, "device_type", "browser" if self.suite.kind == "miniwob" else "desktop")
        return {"execution_id": ex.execution_id, "task_id": ex.task.task_id, "status": "running",
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
        ex.state["shot_format"] = (fmt, quality)
        try:
            raw = await self._frame_now(ex)
            screen = ex.desktop.screen
            data = screen.cached(raw, fmt, quality) or await asyncio.get_running_loop().run_in_executor(
                self._encoder, screen.encode, raw, fmt, quality)
        except Exception as exc:  # noqa: BLE001 - the X server of this desktop is gone
            logger.error("screenshot of %s failed: %s", eid, exc)
            raise _fault(ex, "gym", 503, f"desktop of execution {eid} is not responding: {exc}") from exc
        _served(ex)
        return data, fmt

    async def _frame_now(self, ex: Execution, arm: bool = False) -> bytearray:
        """The desktop's screen now (``Screen.frame_now``; with ``arm``, ``Screen.arm_and_grab`` before an action),
        once more on connections opened again when the gym's were lost (``_reopen_x``)."""
        d = ex.desktop
        screen = d.screen
        try:
            return screen.arm_and_grab() if arm else screen.frame_now()
        except Exception as exc:  # noqa: BLE001 - maybe a lost connection: re-opened and tried once more
            if not await self._reopen_x(ex, screen, exc):
                raise
            return d.screen.arm_and_grab() if arm else d.screen.frame_now()

    async def _reopen_x(self, ex: Execution, broken, exc: Exception) -> bool:
        """The gym's X connections to ``ex``'s desktop failed (``broken``: the input or screen object that raised
        ``exc``). When the desktop's X server still runs, the server closed them: open them again (once per
        loss; concurrent calls wait for it). True when they are open again (or were already opened anew)."""
        d = ex.desktop
        if not getattr(d, "uses_x", False) or not hasattr(d, "reconnect") or not d.x_server_running():
            return False
        lock = ex.state.setdefault("x_reopen", asyncio.Lock())
        async with lock:
            if broken is not d.screen and broken is not d.xinput:
                return d.screen is not None and d.xinput is not None   # another call opened them again
            logger.warning("execution %s: the gym's X connection to %s failed (%s): opening them again",
                           ex.execution_id, d.display, exc)
            try:
                await asyncio.wait_for(asyncio.to_thread(d.reconnect), REOPEN_X_S)
            except Exception as err:  # noqa: BLE001 - the caller answers with the first failure
                logger.error("execution %s: could not open the X connections to %s again: %s", ex.execution_id,
                             d.display, err)
                return False
            return True

    async def act(self, eid: str, raw_action: object) -> dict:
        """Perform one action and wait for the screen to settle: ``{ok, screen_changed}``, or ``ok: false`` with
        the error and ``fault: "gym"`` when playing it failed on our side (the X server refused the input, a
        page did not take it; the desktop is kept). Whose failure each is: docs/protocols.md 1.5. A malformed
        action is the policy's (4xx, nothing played); a desktop that stopped answering before the action was
        played is a 503 (nothing played, it may be sent again), after it a 500 (it was played)."""
        ex = self.execution(eid)
        try:
            action = parse_action(raw_action)
        except ActionError as exc:
            raise _fault(ex, "policy", exc.status, exc.detail) from exc
        async with ex.lock:
            if eid not in self.manager.executions:
                raise GymError(404, f"execution {eid!r} was terminated")
            d = ex.desktop
            try:
                before = await self._frame_now(ex, arm=True)
            except Exception as exc:  # noqa: BLE001 - the X server of this desktop is gone
                raise _fault(ex, "gym", 503, f"desktop of execution {eid} is not responding: {exc}") from exc
            screen_at = screen_key(before, d.spec.width, d.spec.height, ex.mask)   # what a fork replays it on
            try:
                if self.manager.opt.fault_rate and _injected_fault(ex, self.manager.opt.fault_rate):
                    raise InjectedFault(f"fault injected at rate {self.manager.opt.fault_rate} (GymOptions.fault_rate)")
                await self._input(ex, action)
            except InputRefused as exc:   # the keyboard has no key for what was asked: the policy's, nothing sent
                _count(ex, "policy")
                return {"ok": False, "error": str(exc), "fault": "policy", "screen_changed": False}
            except ConnectionClosedError as exc:
                xin = d.xinput
                if not await self._reopen_x(ex, xin, exc):
                    raise _fault(ex, "gym", 500, f"desktop of execution {eid} stopped answering while the action "
                                                 f"was played: {exc}") from exc
                # The X server, still running, closed the gym's connection midway: the desktop's doing (the gym
                # never gives it cause), so the policy's failure. The connections are open again for the next one.
                ex.faults["policy"] += 1
                ex.unreplayable = ex.unreplayable or (
                    f"action {len(ex.history) + 1} ({action.type}) was cut off when the desktop's X server closed "
                    "the gym's connection: what it did cannot be replayed")
                return {"ok": False, "error": "the desktop's X server closed the gym's input connection while the "
                        "action was played (it may have been played in part); the connection is open again",
                        "fault": "policy", "screen_changed": False}
            except Exception as exc:  # noqa: BLE001 - the X server said no; report, keep the desktop
                logger.warning("action %s on %s failed in the gym: %s", action.type, eid, exc)
                _count(ex, "gym")
                with contextlib.suppress(Exception):
                    d.xinput.reset_modifiers()
                if not isinstance(exc, InjectedFault):   # an injected one played nothing
                    ex.unreplayable = ex.unreplayable or (
                        f"action {len(ex.history) + 1} ({action.type}) failed on the display midway ({exc}): what it "
                        "did cannot be replayed")
                return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "fault": "gym", "screen_changed": False}
            ex.history.append(Step(raw_action, screen_at))
            screen = d.screen
            try:
                changed, frame = await settle(screen, before, CHANGE_WAIT_S.get(action.type, 0.0))
            except Exception as exc:  # noqa: BLE001 - played, then the desktop stopped answering: not to be resent
                if not await self._reopen_x(ex, screen, exc):
                    raise _fault(ex, "gym", 500, f"desktop of execution {eid} stopped answering after the action: "
                                                 f"{exc}") from exc
                frame = d.screen.grab()   # the connections are open again: the screen as the action left it
                changed = frame != before
            d.screen.remember(frame)
            _served(ex)
            ex.last_used = time.monotonic()
            # The agent's next call is almost always a screenshot of this very frame, in the format it
            # asked for last time: start encoding it now.
            fmt, quality = ex.state.get("shot_format", ("png", 85))
            asyncio.get_running_loop().run_in_executor(self._encoder, d.screen.encode, frame, fmt, quality)
        return {"ok": True, "screen_changed": changed}

    async def _input(self, ex: Execution, action) -> None:
        """Play a parsed action on the execution's desktop; on a browser desktop, return once the page has
        received its input (browser.py). Raises what the display said when it refused."""
        d = ex.desktop
        inputs = await d.input_count() if hasattr(d, "input_count") else None
        await perform(action, d.xinput, d.spec.width, d.spec.height, ex.state)
        if inputs is not None:
            await d.wait_input(inputs, page_events(action, d.xinput))
            await d.painted()   # its effect on the screen before the settle wait (a checkbox's tick)

    def _prepare_screenshot(self, ex: Execution, frame, like: Execution) -> None:
        """Start encoding ``frame`` of a new child in the format its parent's agent asked for last: the child's
        first screenshot is usually this frame."""
        fmt, quality = like.state.get("shot_format", ("png", 85))
        ex.state["shot_format"] = (fmt, quality)
        asyncio.get_running_loop().run_in_executor(self._encoder, ex.desktop.screen.encode, frame, fmt, quality)

    async def evaluate(self, eid: str, body: dict | None = None) -> dict:
        """The task's validators on the execution's final state (``body``: e.g. ``{"answer_text": ...}``).

        One evaluate of an execution runs at a time, within ``evaluate_timeout_s``: one that takes longer fails
        (503) and keeps running on its own (``suite.evaluate`` blocks on a thread of its own, never on a shared
        one), and the execution's later evaluates are refused until it ends. Other executions never notice."""
        ex = self.execution(eid)
        limit = self.options.evaluate_timeout_s
        async with ex.evaluating:
            if ex.evaluation is not None and not ex.evaluation.done():
                raise GymError(503, f"an earlier evaluate of execution {eid} is still running past its {limit:g} s "
                                    f"limit: this execution cannot be evaluated now")
            ex.evaluation = run = asyncio.ensure_future(self.suite.evaluate(ex, body or {}))
            run.add_done_callback(_retrieve)
            try:
                result = await asyncio.wait_for(asyncio.shield(run), limit)
            except TimeoutError:
                logger.error("evaluating execution %s took longer than %g s; failed", eid, limit)
                raise GymError(503, f"evaluating execution {eid} took longer than {limit:g} s") from None
            except Exception as exc:  # noqa: BLE001 - e.g. the browser of this execution is gone
                logger.error("evaluating execution %s failed: %s", eid, exc)
                raise GymError(503, f"could not evaluate execution {eid}: {exc}") from exc
        # faults: this execution's calls that failed on the gym's side (and actions refused as malformed), so a
        # trainer can drop an episode the gym failed even when its agent does not say so (protocols.md 1.4)
        return {**result, "execution_id": eid, "task_id": ex.task.task_id, "faults": dict(ex.faults)}

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

    # ---- forks (fork.py) --------------------------------------------------------------------------------
    async def fork(self, eid: str, body: object = {}) -> dict:  # noqa: B006 - never mutated
        """``count`` new executions in the state execution ``eid`` is in now (``body``: ``{"count": N}``); the
        parent goes on untouched. Replayed on X11 and browser desktops, resumed from a snapshot on VMs (fork.py).
        422: a bad body; 404: no such execution; 409: the task is not forkable, or a child did not reach the
        parent's state (nothing is left of the fork); 429: the children do not fit under ``max_executions``;
        503: a desktop could not start."""
        try:
            count = fork_count(body)
        except ValueError as exc:
            raise GymError(422, str(exc)) from exc
        parent = self.execution(eid)
        refusal = self.suite.fork_refusal(parent.task)
        if refusal is not None:
            raise GymError(409, refusal)
        t0 = time.monotonic()
        snapshot = hasattr(parent.desktop, "freeze")
        try:
            async with self.manager.reserve(count) as room:
                if snapshot:
                    children = await self._fork_snapshot(parent, count, room)
                else:
                    children = await self._fork_replay(parent, count, room)
        except CapacityError as exc:
            raise GymError(429, str(exc)) from exc
        except ForkRefused as exc:
            logger.warning("fork of execution %s (task %s) refused: %s", eid, parent.task.task_id, exc.reason)
            raise GymError(409, exc.reason) from exc
        took = time.monotonic() - t0
        logger.info("forked execution %s into %d (%s, %d actions) in %.0f ms", eid, count,
                    "snapshot" if snapshot else "replay", len(parent.history), took * 1e3)
        return {"parent": eid, "task_id": parent.task.task_id, "mechanism": "snapshot" if snapshot else "replay",
                "actions": len(children[0].history), "seconds": round(took, 3),
                "executions": [{"id": c.execution_id, **self._reply(c, c.begun)} for c in children],
                "mask": [list(r) for r in parent.mask]}

    async def _fork_replay(self, parent: Execution, count: int, room: Reservation) -> list[Execution]:
        """The parent is held (its actions wait) while its children are made: its state at the end is still its
        state at the fork, give or take what its apps write by themselves a moment later (an editor saving its
        settings file lazily), which the children are compared with (``_replay``)."""
        if parent.unreplayable:
            raise ForkRefused(parent.unreplayable)
        async with parent.lock:
            if parent.execution_id not in self.manager.executions:
                raise GymError(404, f"execution {parent.execution_id!r} was terminated")
            d = parent.desktop
            try:
                d.screen.frame_now()
            except Exception as exc:  # noqa: BLE001 - the parent's desktop is gone
                raise GymError(503, f"desktop of execution {parent.execution_id} is not responding: {exc}") from exc
            await self._parent_state(parent)   # a state it cannot compare (fork.HomeRefused) makes no child
            capture = Capture(list(parent.history), parent.seed, parent.mask, d.spec.width, d.spec.height)
            children: list[Execution] = []
            jobs = [self._replay_child(parent, capture, room, children) for _ in range(count)]
            await self._all_or_none(jobs, children)
        return children

    async def _all_or_none(self, jobs, children: list[Execution]) -> None:
        """Run a fork's ``jobs`` (each makes one child and appends it to ``children``); when any fails, or the
        fork is cancelled, end every child made and raise the failure that says most (409, then 429, 503)."""
        try:
            results = await asyncio.gather(*jobs, return_exceptions=True)
        except BaseException:
            await asyncio.shield(self._end_all(children))
            raise
        failures = [r for r in results if isinstance(r, BaseException)]
        if not failures:
            return
        await self._end_all(children)
        if self.manager.closed:
            raise CapacityError("the gym is shutting down")
        rank = lambda e: (0 if isinstance(e, ForkRefused) else 1 if isinstance(e, CapacityError)  # noqa: E731
                          else 2 if isinstance(e, GymError) else 3)
        worst = min(failures, key=rank)
        if rank(worst) == 3:
            logger.error("a fork's child failed: %r", worst)
            raise GymError(503, f"a child could not be made: {type(worst).__name__}: {worst}") from worst
        raise worst

    async def _end_all(self, children: list[Execution]) -> None:
        await asyncio.gather(*(self.manager.terminate(c.execution_id) for c in children), return_exceptions=True)

    async def _replay_child(self, parent: Execution, capture: Capture, room: Reservation,
                            children: list[Execution]) -> None:
        try:
            ex = await self.manager.create(parent.task, reserved=room)
        except RuntimeError as exc:
            if isinstance(exc, CapacityError):
                raise
            raise GymError(503, f"could not start a desktop: {exc}") from exc
        children.append(ex)
        ex.forked_from = parent.execution_id
        async with ex.lock:   # nobody else acts on it (the reaper passes it by; terminate waits)
            await self._begin(ex, capture.seed)
            frame = await self._replay(ex, parent, capture)
            ex.history = list(capture.steps)
            self._prepare_screenshot(ex, frame, parent)

    async def _parent_state(self, parent: Execution) -> dict:
        try:
            return await self.suite.fork_state(parent)
        except HomeRefused as exc:   # its HOME is past what a fork compares whole: a refusal, not a failure
            raise ForkRefused(f"the parent's {exc.reason}") from exc
        except Exception as exc:  # noqa: BLE001 - the parent's desktop is gone
            raise GymError(503, f"desktop of execution {parent.execution_id} is not responding: {exc}") from exc

    async def _child_state(self, ex: Execution) -> dict:
        try:
            return await self.suite.fork_state(ex)
        except HomeRefused as exc:
            raise ForkRefused(f"the child's {exc.reason}") from exc

    async def _replay(self, ex: Execution, parent: Execution, capture: Capture) -> bytearray:
        """Play the parent's actions on the child, each once the child's screen is what the parent's was when
        it was played; then wait for the parent's frame and compare the task states. Returns the child's frame.

        A screen of the parent's that the child never shows may have been a passing one (the parent acted while
        its screen still changed: a page still painting when an action came at once): the child plays on, and
        only when the next screen does not come either is the replay refused. The final comparisons decide."""
        d, w, h, mask = ex.desktop, capture.width, capture.height, capture.mask
        wait_s = self.options.fork_wait_s   # for each screen the child must show, and for its task state
        gone = lambda: self.manager.closed or ex.execution_id not in self.manager.executions  # noqa: E731
        n, missed, passing = len(capture.steps), 0, []
        for i, step in enumerate(capture.steps, 1):
            action = parse_action(step.action)
            if action.type == "wait":   # time passing: the wait for the next action's screen covers it
                continue
            frame = await wait_for_screen(d.screen, lambda f: screen_key(f, w, h, mask) == step.screen,
                                          wait_s, gone)
            if frame is None:
                self._check_open(ex)
                missed += 1
                passing.append(i)
                if missed > 1:
                    raise ForkRefused(f"the replay diverged before action {i} of {n} ({action.type}): within "
                                      f"{wait_s:g} s each, the child's screen never showed what the parent's showed "
                                      f"when it played that action nor the one before")
                logger.info("fork child %s never showed the parent's screen before action %d of %d: playing on",
                            ex.execution_id, i, n)
            else:
                missed = 0
            try:
                await self._input(ex, action)
            except Exception as exc:  # noqa: BLE001 - the child's display refused what the parent's took
                self._check_open(ex)
                raise ForkRefused(f"action {i} of {n} ({action.type}) failed on the child: {exc}") from exc
        unseen = f" (it never showed the parent's screen before action {passing[0]})" if passing else ""
        # The parent's screen as it is now, not as the fork found it: the parent is held (no action reaches it),
        # but an act settles after STABLE_S of quiet, so it may still be drawing what its last action began (CI: a
        # terminal drew the second typed key one fork-and-exec later, and a child that reached the parent's state
        # was refused for the parent's half-drawn frame). Both end where the actions lead.
        parent_screen = parent.desktop.screen
        frame = await wait_for_screen(d.screen, lambda f: frames_equal(f, parent_screen.grab(), w, h, mask),
                                      wait_s, gone)
        if frame is None:
            self._check_open(ex)
            raise ForkRefused(f"after replaying {n} actions{unseen} the child's screen is not the parent's at the "
                              f"fork: {difference(parent_screen.grab(), d.screen.grab(), w, h, mask)}")
        deadline = time.monotonic() + wait_s
        while (diff := state_difference(await self._parent_state(parent), await self._child_state(ex))):
            if time.monotonic() > deadline:
                raise ForkRefused(f"after replaying {n} actions{unseen} the child's screen is the parent's but its "
                                  f"task state is not: {diff}")
            await asyncio.sleep(0.05)
        return frame

    def _check_open(self, ex: Execution) -> None:
        """A child's wait ended early because the gym closed or the child was ended: say so, not 'diverged'."""
        if self.manager.closed:
            raise CapacityError("the gym is shutting down")
        if ex.execution_id not in self.manager.executions:
            raise GymError(503, f"the child {ex.execution_id} was ended while the fork made it")

    async def _fork_snapshot(self, parent: Execution, count: int, room: Reservation) -> list[Execution]:
        """VMs: the parent's machine frozen once (paused meanwhile), each child resumed from that on a disk
        overlay of its own (vm/backend.py)."""
        desk = parent.desktop
        timeout = self.options.start_timeout_s
        async with parent.lock:
            if parent.execution_id not in self.manager.executions:
                raise GymError(404, f"execution {parent.execution_id!r} was terminated")
            history = list(parent.history)
            try:
                frozen = await self.manager.run_blocking(desk.freeze, self.manager.workdir)
            except Exception as exc:  # noqa: BLE001 - QEMU refused: the parent runs on (freeze resumes it)
                logger.error("freezing the VM of execution %s failed: %s", parent.execution_id, exc)
                raise GymError(503, f"could not snapshot the VM of execution {parent.execution_id}: {exc}") from exc
        children: list[Execution] = []
        thaws: list[asyncio.Future] = []
        taken: set[int] = set()   # ids of the machines a child took (adopt ends one it refuses)

        async def one() -> None:
            thaw = asyncio.ensure_future(self.manager.run_blocking(type(desk).thaw, frozen, self.manager.workdir,
                                                                   timeout))
            thaws.append(thaw)
            child = await asyncio.shield(thaw)   # a cancelled fork's thaw runs on: _after_thaws ends its machine
            taken.add(id(child))
            ex = await self.manager.adopt(parent.task, child, room)
            ex.seed, ex.begun, ex.mask, ex.history = parent.seed, parent.begun, parent.mask, list(history)
            ex.forked_from = parent.execution_id
            children.append(ex)
            self._prepare_screenshot(ex, child.screen.grab(), parent)

        try:
            await self._all_or_none([one() for _ in range(count)], children)
        finally:
            await asyncio.shield(self._after_thaws(thaws, taken, frozen))
        return children

    async def _after_thaws(self, thaws: list[asyncio.Future], taken: set[int], frozen) -> None:
        """Once every thaw of a fork has ended (those of a cancelled fork run on in their threads), stop the
        machines no child took, then release the frozen state (a thaw reads it until it has loaded)."""
        await asyncio.gather(*thaws, return_exceptions=True)
        for thaw in thaws:
            if not thaw.cancelled() and thaw.exception() is None and id(thaw.result()) not in taken:
                await self.manager.discard(thaw.result())
        await asyncio.to_thread(frozen.release)

    async def terminate(self, eid: str) -> dict:
        if not await self.manager.terminate(eid):
            raise GymError(404, f"unknown execution {eid!r}")
        return {"execution_id": eid, "status": "terminated"}
