"""``cua-gym check URL --gym-id ID``: does a gym speak what docs/protocols.md §1.8 says a gym must implement?

Why: a gym author had nothing to test their server against but a training run, which first reaches the gym after
the model load. This check drives the gym through our real client (``GenvClient``, the one the trainer and our
agent use, with the token of ``CUA_GYM_TOKEN``) the way one episode does, and answers one line per check:

- ``tasks``: ``GET tasks`` lists tasks, each with an id and an instruction or description;
- ``task``: ``GET tasks/{id}`` answers that task;
- ``create``: ``POST tasks/{id}`` with a seed makes an execution (a string ``execution_id``);
- ``execution``: ``GET executions/{eid}`` answers an object (``screen.width``/``height`` numbers when present);
- ``screenshot``: ``GET executions/{eid}/screenshot`` answers a PNG (or a JSON ``data_uri``);
- ``action``: ``POST executions/{eid}/actions`` plays a pointer move and answers ``{"ok": bool, ...}``;
- ``evaluate``: ``POST executions/{eid}/evaluate`` answers a total score, validators or a success flag;
- ``terminate``: ``POST executions/{eid}/terminate`` ends it (always sent once an execution exists);
- bad input answered 4xx, with nothing made: ``bad action`` (an unknown action type), ``unknown task`` (a create
  of a task nobody has), ``unknown execution`` (a screenshot of an execution nobody made).

A check that needs an execution is ``not run`` when none was made. ``Check``, ``report`` and ``summary`` are shared
with the agent service's check (cua_rl/mini_agent/conformance.py).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Awaitable, Callable

from ..http.retry import RetryPolicy
from .client import GenvClient, GenvTimeouts
from .errors import GenvError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SEED = 7


@dataclass
class Check:
    name: str
    ok: bool | None        # None: not run (what it needs failed before it)
    detail: str = ""

    def line(self) -> str:
        """``check: NAME: ok (detail)``, ``check: NAME: FAILED: why`` or ``check: NAME: not run: why``."""
        if self.ok:
            return f"check: {self.name}: ok" + (f" ({self.detail})" if self.detail else "")
        state = "not run" if self.ok is None else "FAILED"
        return f"check: {self.name}: {state}" + (f": {self.detail}" if self.detail else "")


def summary(checks: list[Check], what: str) -> tuple[str, int]:
    """The closing line and the exit code (1 naming each failed check, 0 when every check passed)."""
    failed = [c.name for c in checks if c.ok is False]
    if failed:
        return f"{what} fails {len(failed)} of {len(checks)} checks: {', '.join(failed)}", 1
    if any(c.ok is None for c in checks):
        return f"{what}: some checks were not run", 1
    return f"{what} passes all {len(checks)} checks", 0


class Checks:
    """The checks so far; ``run(name, step)`` records one: ok with ``step``'s words, or FAILED with why."""

    def __init__(self, out: Callable[[str], None]) -> None:
        self.done: list[Check] = []
        self.out = out

    def add(self, name: str, ok: bool | None, detail: str = "") -> bool:
        check = Check(name, ok, detail)
        self.done.append(check)
        self.out(check.line())
        return bool(ok)

    async def run(self, name: str, step: Callable[[], Awaitable[str]]) -> bool:
        try:
            detail = await step()
        except CheckFailed as exc:
            return self.add(name, False, str(exc))
        except GenvError as exc:
            return self.add(name, False, _genv_words(exc))
        return self.add(name, True, detail)

    def skip(self, *names: str, why: str) -> None:
        for name in names:
            self.add(name, None, why)


class CheckFailed(Exception):
    """A check's answer was not what the protocol says."""


def _is_page(text: str) -> bool:
    return text.lstrip().lower().startswith(("<!doctype", "<html"))


def _genv_words(exc: GenvError) -> str:
    """One line: the status and the gym's detail (a web page is named as such: not our protocol)."""
    text = " ".join(str(exc.detail).split())
    text = "an HTML page, not a JSON {\"detail\": ...}: not a genv gym" if _is_page(text) else \
        (text if len(text) <= 200 else text[:200] + "...")
    status = exc.status_code
    if status == 401:
        return f"HTTP 401: needs a token (CUA_GYM_TOKEN): {text}"
    return f"HTTP {status}: {text}" if status else str(text)


async def _refused(name: str, call: Callable[[], Awaitable[object]], undo: Callable[[object], Awaitable[None]]
                   | None = None) -> str:
    """Bad input must be answered 4xx: ok with the status, else ``CheckFailed`` saying what came instead."""
    try:
        made = await call()
    except GenvError as exc:
        status = exc.status_code
        if status is not None and 400 <= status < 500 and not _is_page(str(exc.detail)):
            return f"HTTP {status}"
        raise CheckFailed(f"{name} must be refused with a 4xx, got {_genv_words(exc)}") from None
    if undo is not None:
        await undo(made)
    raise CheckFailed(f"{name} was accepted (2xx: {str(getattr(made, 'raw', made))[:120]}); it must be refused "
                      "with a 4xx and change nothing")


async def check_gym(base_url: str, gym_id: str, task_id: str | None = None, *, out: Callable[[str], None] = print,
                    timeout_s: float = 120.0) -> list[Check]:
    """Every check of the module docstring against the gym at ``base_url``; each line is also given to ``out``."""
    checks = Checks(out)
    timeouts = GenvTimeouts(connect=5.0, read=30.0, create=timeout_s, evaluate=timeout_s, act=30.0)
    async with GenvClient(base_url, gym_id, timeouts=timeouts, retry=RetryPolicy(attempts=1)) as gym:
        tasks: list = []

        async def list_tasks() -> str:
            tasks.extend(await gym.list_tasks())
            if not tasks:
                raise CheckFailed("GET tasks lists no task")
            bare = [t.id for t in tasks if not (t.raw.get("instruction") or t.raw.get("description")
                                                or (t.raw.get("meta") or {}).get("description"))]
            if bare and len(bare) == len(tasks):
                raise CheckFailed(f"no task has an instruction or description (e.g. {bare[0]})")
            return f"{len(tasks)} tasks"

        if not await checks.run("tasks", list_tasks) and task_id is None:
            checks.skip("task", "create", "execution", "screenshot", "action", "bad action", "evaluate",
                        "terminate", why="no task to play")
        else:
            chosen = task_id or tasks[0].id

            async def get_task() -> str:
                task = await gym.get_task(chosen)
                if task.id != chosen and chosen not in (task.raw.get("name"), task.number):
                    raise CheckFailed(f"GET tasks/{chosen} answered task {task.id!r}")
                if not task.instruction:
                    raise CheckFailed(f"task {chosen} has no instruction or description")
                return f"task {chosen}"

            await checks.run("task", get_task)
            await _one_execution(gym, chosen, checks)
        await checks.run("unknown task", lambda: _refused(
            "a create of an unknown task", lambda: gym.create_execution(f"cua-check-no-such-task-{secrets.token_hex(4)}"),
            lambda made: _end(gym, made.execution_id)))
        await checks.run("unknown execution", lambda: _refused(
            "a screenshot of an unknown execution", lambda: gym.screenshot(f"cua-check-{secrets.token_hex(8)}")))
    return checks.done


async def _end(gym: GenvClient, eid: str) -> None:
    try:
        await gym.terminate(eid)
    except GenvError:
        pass


async def _one_execution(gym: GenvClient, task_id: str, checks: Checks) -> None:
    """create, execution, screenshot, action, bad action, evaluate, terminate: one execution's life."""
    made: list = []

    async def create() -> str:
        made.append(await gym.create_execution(task_id, {"seed": SEED}))
        return f"execution {made[0].execution_id}"

    if not await checks.run("create", create):
        checks.skip("execution", "screenshot", "action", "bad action", "evaluate", "terminate",
                    why="no execution was made")
        return
    eid = made[0].execution_id
    try:
        async def execution() -> str:
            body = await gym.get_execution(eid)
            if not isinstance(body, dict):
                raise CheckFailed(f"GET executions/{eid} answered no object: {str(body)[:120]}")
            screen = body.get("screen")
            if screen is not None and not (isinstance(screen, dict) and all(
                    isinstance(screen.get(k), int) and screen[k] > 0 for k in ("width", "height"))):
                raise CheckFailed(f"screen must be {{\"width\": int, \"height\": int}}, got {str(screen)[:80]}")
            return f"screen {screen['width']}x{screen['height']}" if screen else "no screen size (optional)"

        async def screenshot() -> str:
            image = await gym.screenshot(eid)
            if not image.startswith(PNG_MAGIC):
                raise CheckFailed(f"not a PNG ({len(image)} bytes starting {image[:8]!r})")
            return f"PNG, {len(image)} bytes"

        async def action() -> str:
            reply = await gym.act(eid, {"type": "move", "x": 0.5, "y": 0.5})
            if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
                raise CheckFailed(f"an action's reply must be {{\"ok\": bool, ...}}, got {str(reply)[:120]}")
            if not reply["ok"]:
                raise CheckFailed(f"a pointer move answered ok: false ({str(reply)[:120]})")
            return "a pointer move played"

        async def bad_action() -> str:
            return await _refused("an action of an unknown type", lambda: gym.act(eid, {"type": "cua-check-fly"}))

        async def evaluate() -> str:
            evaluation = await gym.evaluate(eid, answer_text="", execution_data={"task_completed": False})
            if evaluation.source == "none":
                raise CheckFailed(f"the reply has no score, validators or success flag: {str(evaluation.raw)[:160]}")
            return f"reward {evaluation.reward:g} from its {evaluation.source}"

        await checks.run("execution", execution)
        await checks.run("screenshot", screenshot)
        await checks.run("action", action)
        await checks.run("bad action", bad_action)
        await checks.run("evaluate", evaluate)
    finally:
        async def terminate() -> str:
            await gym.terminate(eid)
            return f"execution {eid} ended"

        await checks.run("terminate", terminate)
