"""What differs between the gym's task suites, behind one small interface the server calls.

A suite has ``tasks`` (``.tasks``, ``.get(key)``, ``len``), ``begin(execution, seed)`` (run once on a fresh
execution before create-execution answers; returns extra reply fields) and ``evaluate(execution, body)``
(the genv evaluate reply), and what a fork needs (``fork.py``): ``fork_refusal(task)`` (why a task cannot be
forked, or None), ``fork_state(execution)`` (the task state a child must share with its parent) and
``volatile(task, width, height)`` (the screen regions the task declares volatile, in pixels). Two suites exist:

- ``desktop``: the YAML tasks on X11 app desktops, or on VMs for tasks whose setup names one (``tasks.py``,
  ``vm/backend.py``), scored by validators on the HOME or the guest's files. Fixed
  tasks accept and echo a seed that changes nothing; the curriculum's family tasks (``curriculum.py``)
  draw the seeded instance on their board window and reply with its instruction.
- ``miniwob``: MiniWoB++ pages on browser desktops (``miniwob.py``); the seed picks the instance.

``create_options`` checks the create-execution body (docs/protocols.md §1.3: ``{}`` or
``{"options": {...}}``) before anything is created, so a bad body is a 422 that leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

from . import curriculum, validators
from .fork import home_state, mask_pixels
from .tasks import TASKS_DIR, load_tasks

MAX_SEED = 2 ** 53 - 1   # JSON numbers are exact up to here (and so are JavaScript's)
HOME_READERS = 2         # threads that read HOMEs for forks' state checks (hashing: CPU-bound, GIL released)


async def on_own_thread(fn, *args):
    """``fn(*args)`` on a daemon thread of its own, awaited. Why not ``asyncio.to_thread``: validators read files
    a hostile desktop controls. They open nothing that can block (home_paths.py), but should anything ever hang
    here it holds this thread alone, never a worker of the shared default executor (actions, spawns), and a
    daemon thread is never joined: it cannot hold up the gym's exit either."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def settle(result, error) -> None:
        if not done.done():
            if error is None:
                done.set_result(result)
            else:
                done.set_exception(error)

    def run() -> None:
        try:
            outcome = (fn(*args), None)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            outcome = (None, exc)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:   # the loop closed meanwhile: nobody waits for this any more
            pass

    threading.Thread(target=run, name="gym-evaluate", daemon=True).start()
    return await done


class OptionsError(ValueError):
    """A malformed create-execution body; the message says what is wrong."""


def create_options(body: object) -> int | None:
    """The seed of a create-execution body (None when absent); raises ``OptionsError`` on bad input."""
    if body is None or body == {}:
        return None
    if not isinstance(body, dict):
        raise OptionsError("the body must be a JSON object: {} or {\"options\": {\"seed\": 7}}")
    options = body.get("options")
    if options is None:
        return None
    if not isinstance(options, dict):
        raise OptionsError(f"options must be an object, got {type(options).__name__}")
    seed = options.get("seed")
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise OptionsError(f"options.seed must be an integer in 0..{MAX_SEED}, got {seed!r}")
    if not 0 <= seed <= MAX_SEED:
        raise OptionsError(f"options.seed must be within 0..{MAX_SEED}, got {seed}")
    return seed


class DesktopSuite:
    """The built-in X11 desktop tasks: fixed setups, validators over the execution's HOME."""

    kind = "desktop"

    def __init__(self, tasks_dir: str | None = None, tasks=None, extra_tasks: list | None = None) -> None:
        self.tasks = tasks if tasks is not None else load_tasks(tasks_dir or TASKS_DIR, extra_tasks)
        # Forks' HOME reads (``fork_state``) have threads of their own, a bounded number: a hostile HOME costs its
        # fork time on them (each read is bounded: fork.MAX_HOME_*), never the shared executor's workers.
        self._home_readers = ThreadPoolExecutor(max_workers=HOME_READERS, thread_name_prefix="gym-home-state")

    def close(self) -> None:
        """End the HOME readers (reads under way finish: each is bounded)."""
        self._home_readers.shutdown(wait=False, cancel_futures=True)

    async def begin(self, ex, seed: int | None) -> dict:
        setup = ex.task.setup
        if setup.vm is not None:   # a VM's task files and commands go in when the execution starts
            await asyncio.to_thread(ex.desktop.provision, setup.files, setup.dirs, setup.commands)
        if ex.task.family is None:
            ex.state["seed"] = seed
            return {"seed": seed}
        instance = curriculum.make_instance(ex.task.family, curriculum.random_seed() if seed is None else seed)
        await asyncio.to_thread(curriculum.show, ex.desktop, instance)
        ex.state["seed"], ex.state["instance"] = instance.seed, instance
        return {"seed": instance.seed, "instruction": instance.instruction, "instance": instance.to_wire()}

    def fork_refusal(self, task) -> str | None:
        """Why ``task`` cannot be forked (None: it can). A VM task always can (a snapshot holds its whole state);
        an X11 task unless it is marked ``forkable: false`` (its apps do not replay to one state)."""
        if task.setup.vm is None and not task.forkable:
            return f"task {task.task_id} is not forkable: {task.fork_note}"
        return None

    async def fork_state(self, ex) -> dict:
        """The task state a child must share: the desktop's files, every one whole (``fork.home_state``; a HOME
        it cannot compare whole is a ``fork.HomeRefused``). A VM's files are its disk, which its snapshot carries."""
        if ex.task.setup.vm is not None:
            return {}
        return await asyncio.get_running_loop().run_in_executor(self._home_readers, home_state, ex.desktop.home)

    def volatile(self, task, width: int, height: int) -> list[list[int]]:
        return mask_pixels(task.volatile, width, height)

    async def evaluate(self, ex, body: dict) -> dict:
        answer = validators.answer_from(body)
        instance = ex.state.get("instance")
        specs = list(instance.validators) if instance is not None else ex.task.validators
        return await on_own_thread(validators.evaluate, ex.desktop.files, specs, answer)


def make_suite(options, tasks=None):
    """The suite named by ``options.suite`` (``GymOptions``); ``tasks`` replaces the desktop task set."""
    if options.suite == "miniwob":
        from .miniwob import MiniwobSuite

        if options.extra_tasks:
            raise ValueError("tasks written inline are desktop tasks: the miniwob gym serves the package's pages only")
        return MiniwobSuite(tasks, time_limit_s=options.miniwob_time_limit_s)
    return DesktopSuite(options.tasks_dir, tasks, options.extra_tasks)
