"""Helpers for the gym tests: which processes a desktop (or a whole server) consists of; a scripted solution
written and parsed as the keyboard agent format's replies; a folder chain too deep for recursive code; a bare
Xvfb of a test's own and paint on it (test modules import these from here, not from conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time

from cua_rl.genv import GenvClient


def names(pids) -> dict[int, str]:
    """Each of ``pids`` that still exists, with its command name (/proc/PID/comm: at most 15 characters)."""
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm") as f:
                out[pid] = f.read().strip()
        except OSError:
            continue
    return out


def nest_folders(top, depth: int, name: str = "d") -> None:
    """``depth`` folders ``name`` each in the last under ``top`` (os.makedirs recurses, and a path per level would
    cost depth squared lookups: each is made from a descriptor of the one above)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=fd)
            nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
    finally:
        os.close(fd)


def remove_nested(top, name: str = "d") -> int:
    """Remove a chain ``nest_folders`` made (shutil.rmtree recurses): the folder below the first moved up in its
    place, one level at a time. Returns how many levels were removed."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    levels = 0
    try:
        while os.path.lexists(os.path.join(top, name)):
            below = os.path.join(name, name)
            if os.path.lexists(os.path.join(top, below)):
                os.rename(below, f"{name}.up", src_dir_fd=fd, dst_dir_fd=fd)
                os.rmdir(name, dir_fd=fd)
                os.rename(f"{name}.up", name, src_dir_fd=fd, dst_dir_fd=fd)
            else:
                os.rmdir(name, dir_fd=fd)
            levels += 1
    finally:
        os.close(fd)
    return levels


async def evaluation_within(client: GenvClient, eid: str, timeout_s: float, answer_text: str | None = None):
    """The execution's evaluation once its reward reaches 1.0, or as it is after ``timeout_s``: an application
    finishes what the last action started a moment later (a file manager moves a dropped file; GTK's Save As
    looks the name and its folder up on a worker thread before it answers the Enter, and on a loaded machine
    the editor wrote the file 0.5-0.8 s after the Enter, past a solution's last wait)."""
    deadline = time.monotonic() + timeout_s
    while (result := await client.evaluate(eid, answer_text=answer_text)).reward < 1.0 \
            and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return result


async def _play(client: GenvClient, task, actions: list[dict], shots_dir) -> tuple[float, float, list]:
    async with client.execution(task.task_id) as ex:
        before = await client.evaluate(ex.execution_id)
        for action in actions:
            reply = await client.act(ex.execution_id, action)
            assert reply["ok"], (task.task_id, action, reply)
        after = await evaluation_within(client, ex.execution_id, 5.0, answer_text=task.answer)
        if after.reward != 1.0:  # keep the evidence: what the desktop looked like at the end
            (shots_dir / f"{task.task_id}.png").write_bytes(await client.screenshot(ex.execution_id))
        return before.reward, after.reward, after.raw["result"]["validators"]


async def solve_all(gym, tasks, shots_dir, actions_of=lambda task: task.solution) -> list[str]:
    """Play every task's solution (``actions_of(task)``) on ``gym``, a few at a time (CUA_GYM_TEST_CONCURRENCY,
    default 4): what went wrong, one line per task (untouched at 1, solved below 1, an error)."""
    sem = asyncio.Semaphore(int(os.environ.get("CUA_GYM_TEST_CONCURRENCY", "4")))
    async with GenvClient(gym.url, gym.gym_id) as client:
        async def one(task):
            async with sem:
                return task.task_id, await _play(client, task, actions_of(task), shots_dir)
        results = await asyncio.gather(*(one(t) for t in tasks), return_exceptions=True)
    failures = [f"{t.task_id}: {type(r).__name__}: {r}" for t, r in zip(tasks, results) if isinstance(r, BaseException)]
    for task_id, (before, after, validators) in [r for r in results if not isinstance(r, BaseException)]:
        if before >= 1.0:
            failures.append(f"{task_id}: untouched task already scores {before}")
        if after != 1.0:
            failed = [v for v in validators if not v["pass"]]
            failures.append(f"{task_id}: reference solution scores {after}: {failed} (screen: {shots_dir}/{task_id}.png)")
    return failures


# The gym's key names that the keyboard agent format spells the QEMU way (formats/keyboard.py QEMU_KEYS).
_QEMU_NAMES = {"escape": "esc", "enter": "ret", "super": "meta_l"}


def keyboard_replies(solution: list[dict]) -> list[str]:
    """A scripted solution (gym type, key and wait actions) written as the keyboard agent format's replies,
    one ``<action>`` tag each: what a keyboard-only policy would answer to play it."""
    replies = []
    for action in solution:
        if action["type"] == "type":
            text = action["text"]
            line = text[:-1] if text.endswith("\n") else None
            if "\n" in (line if line is not None else text):
                raise ValueError(f"one line per type action: {text!r}")
            tag = f"typeline {line}" if line is not None else f"type {text}"
        elif action["type"] == "key":
            tag = "sendkey " + "-".join(_QEMU_NAMES.get(k, k) for k in action["keys"])
        elif action["type"] == "wait":
            tag = f"wait {action['ms'] / 1000:g}"
        else:
            raise ValueError(f"no keyboard-format tag for a {action['type']} action")
        replies.append(f"<action>{tag}</action>")
    return replies


def keyboard_actions(solution: list[dict]) -> list[dict]:
    """The gym actions the keyboard agent format parses out of ``keyboard_replies(solution)``."""
    from cua_rl.local_agent.formats import PromptContext, get_format

    fmt, ctx = get_format("keyboard"), PromptContext(instruction="the task", screen=(1280, 800))
    return [a.gym_action for reply in keyboard_replies(solution)
            for a in fmt.parse({"role": "assistant", "content": reply}, ctx).actions]


@contextlib.contextmanager
def bare_x(width: int = 320, height: int = 200):
    """A bare Xvfb of its own (no window manager): its display name."""
    r, w = os.pipe()
    proc = subprocess.Popen(["Xvfb", "-displayfd", str(w), "-screen", "0", f"{width}x{height}x24", "-nolisten", "tcp"],
                            pass_fds=(w,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(w)
    try:
        with os.fdopen(r) as f:
            yield ":" + f.readline().strip()
    finally:
        proc.kill()
        proc.wait()


def paint(name: str, colour: int, x: int = 10, y: int = 10, width: int = 50, height: int = 40) -> None:
    """A filled rectangle on the root window of display ``name``, from a connection of its own (as an app)."""
    from Xlib import display as xdisplay

    d = xdisplay.Display(name)
    root = d.screen().root
    root.fill_rectangle(root.create_gc(foreground=colour), x, y, width, height)
    d.sync()
    d.close()
