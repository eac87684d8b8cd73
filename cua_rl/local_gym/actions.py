"""The desktop action schema (docs/protocols.md §1.6): validation, mobile aliases, and playing it on a desktop.

Validation happens before anything touches the desktop, so a bad action changes nothing: unknown or
malformed actions are 422, coordinates outside 0..1 are 422, text over ``MAX_TEXT`` characters is 413.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import time
from dataclasses import dataclass, field

from .xinput import FOCUS_WAIT_S, PING_WAIT_S, XInput, keysym_for_name

logger = logging.getLogger(__name__)

MAX_TEXT = 4000
MAX_WAIT_MS = 10_000
MAX_SCROLL = 50
BUTTONS = {"left": 1, "middle": 2, "right": 3}
# Pressing Enter right after typing races GTK's file chooser (its autocompletion, and a new document's Save
# turning sensitive by a 150 ms timer after the name's last edit; docs/local_gym.md, API): keep a gap, timed
# from when the client took the keys (``enter_gap``).
TYPE_TO_ENTER_GAP_S = 0.35
# How long, in all, such an Enter waits for a busy client (a loaded machine, a stopped process) to take the keys
# and run its timers; a client that has not answered by then gets the Enter anyway, as a person's would.
ENTER_WAIT_S = 10.0
MOBILE_KEYS = {"back": ["Escape"], "home": ["super"], "menu": ["Menu"], "enter": ["Return"]}


class ActionError(ValueError):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


@dataclass
class Action:
    type: str
    x: float = 0.0
    y: float = 0.0
    x2: float = 0.0
    y2: float = 0.0
    button: int = 1
    count: int = 1
    dx: int = 0
    dy: int = 0
    text: str = ""
    keysyms: list[int] = field(default_factory=list)
    ms: int = 0


def _num(raw: dict, *names: str, required: bool = True) -> float | None:
    for n in names:
        if n in raw and raw[n] is not None:
            v = raw[n]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ActionError(422, f"{n} must be a number, got {v!r}")
            return float(v)
    if required:
        raise ActionError(422, f"missing {names[0]}")
    return None


def _coord(raw: dict, *names: str) -> float:
    v = _num(raw, *names)
    if not 0.0 <= v <= 1.0:
        raise ActionError(422, f"{names[0]}={v} is outside the screen: coordinates are fractions in 0..1")
    return v


def _int(raw: dict, name: str, default: int, lo: int, hi: int) -> int:
    v = _num(raw, name, required=False)
    if v is None:
        return default
    if v != int(v) or not lo <= v <= hi:
        raise ActionError(422, f"{name} must be an integer in {lo}..{hi}, got {v}")
    return int(v)


def parse_action(raw: object) -> Action:
    """Validate one wire action (including the genv mobile aliases) into an ``Action``."""
    if not isinstance(raw, dict):
        raise ActionError(422, "action must be a JSON object with a 'type'")
    kind = raw.get("type")
    if kind in ("tap", "long_press"):
        ms = _int(raw, "duration_ms", 800, 0, MAX_WAIT_MS) if kind == "long_press" else 0
        return Action("press" if kind == "long_press" else "click", x=_coord(raw, "x", "x_norm"),
                      y=_coord(raw, "y", "y_norm"), ms=ms)
    if kind == "swipe":
        return Action("drag", x=_coord(raw, "x", "x_norm"), y=_coord(raw, "y", "y_norm"),
                      x2=_coord(raw, "x2", "x2_norm"), y2=_coord(raw, "y2", "y2_norm"))
    if kind == "click":
        button = raw.get("button", "left")
        if button not in BUTTONS:
            raise ActionError(422, f"button must be one of {sorted(BUTTONS)}, got {button!r}")
        return Action("click", x=_coord(raw, "x"), y=_coord(raw, "y"), button=BUTTONS[button],
                      count=_int(raw, "count", 1, 1, 3))
    if kind == "double_click":
        return Action("click", x=_coord(raw, "x"), y=_coord(raw, "y"), count=2)
    if kind == "move":
        return Action("move", x=_coord(raw, "x"), y=_coord(raw, "y"))
    if kind == "drag":
        return Action("drag", x=_coord(raw, "x"), y=_coord(raw, "y"), x2=_coord(raw, "x2"), y2=_coord(raw, "y2"))
    if kind == "scroll":
        return Action("scroll", x=_coord(raw, "x"), y=_coord(raw, "y"), dx=_int(raw, "dx", 0, -MAX_SCROLL, MAX_SCROLL),
                      dy=_int(raw, "dy", 0, -MAX_SCROLL, MAX_SCROLL))
    if kind == "type":
        text = raw.get("text")
        if not isinstance(text, str):
            raise ActionError(422, "type needs a string 'text'")
        if len(text) > MAX_TEXT:
            raise ActionError(413, f"text is {len(text)} characters; at most {MAX_TEXT} per action")
        if any(ord(c) < 0x20 and c not in "\n\t" for c in text):
            raise ActionError(422, "text has control characters; use a key action for those")
        return Action("type", text=text)
    if kind == "key":
        keys = raw.get("keys")
        if keys is None and isinstance(raw.get("key"), str):
            key = raw["key"]
            keys = MOBILE_KEYS.get(key.lower()) or key.replace("+", " ").split()
        if isinstance(keys, str):
            keys = keys.replace("+", " ").split()
        if isinstance(keys, list) and all(isinstance(k, str) for k in keys):  # ["ctrl+s"] == ["ctrl", "s"]
            keys = [part for k in keys for part in (k.split("+") if len(k) > 1 and "+" in k.strip("+") else [k])]
        if not isinstance(keys, list) or not keys or len(keys) > 6 or not all(isinstance(k, str) for k in keys):
            raise ActionError(422, "key needs 'keys': a list of 1-6 key names, e.g. [\"ctrl\", \"s\"]")
        syms = []
        for k in keys:
            sym = keysym_for_name(k)
            if sym is None:
                raise ActionError(422, f"unknown key name {k!r}")
            syms.append(sym)
        return Action("key", keysyms=syms)
    if kind == "wait":
        return Action("wait", ms=_int(raw, "ms", _int(raw, "duration_ms", 500, 0, MAX_WAIT_MS), 0, MAX_WAIT_MS))
    raise ActionError(422, f"unknown action type {kind!r}; expected click, move, drag, scroll, type, key, wait "
                           "(or tap, long_press, swipe)")


RETURN_KEYSYMS = {0xFF0D, 0xFF8D}


async def keyboard_target(xin: XInput, timeout_s: float = FOCUS_WAIT_S) -> bool:
    """Wait until keys would reach a live window (``XInput.keyboard_ready``: a window holds the focus and
    its client answers); False after ``timeout_s``, and the keys then go out anyway, as a person's would."""
    if xin.focus_unmoved():      # the usual case, typing on in the same window: one round trip, inline
        return True
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(xin.keyboard_ready):
        if time.monotonic() > deadline:
            logger.info("no window took the keyboard focus within %.1f s; typing anyway", timeout_s)
            return False
        await asyncio.sleep(0.01)
    return True


async def typed(xin: XInput, state: dict) -> None:
    """Note when the keys just typed were taken: the time the focused client answered a ping after them
    (``XInput.keys_processed``); False when it has not answered yet (busy: an Enter waits for it,
    ``enter_gap``); for a client that takes no pings, the time they were sent."""
    answer = await asyncio.to_thread(xin.keys_processed)
    state["last_type"] = time.monotonic() if answer is None else answer


async def enter_gap(xin: XInput, state: dict) -> None:
    """Before an Enter that follows typing: wait until the client has taken the typed keys (its answer to a
    ping sent after them), until ``TYPE_TO_ENTER_GAP_S`` have passed since, then until it answers a ping sent
    after that, so its event loop has run its due timers (GTK's Save turning sensitive) before the Enter
    arrives. A client busy for longer (a loaded machine; tests/local_gym/test_api.py stops the editor) would
    otherwise read the text and the Enter in one batch and drop the Enter: a correct answer scored 0. The
    waits end after ``ENTER_WAIT_S`` in all."""
    last = state.pop("last_type", None)
    if last is None:
        return
    deadline = time.monotonic() + ENTER_WAIT_S
    if last is False:
        last = await asyncio.to_thread(xin.keys_processed, ENTER_WAIT_S)
        if last is False:
            logger.info("the focused client has not taken the typed keys (busy %.0f s, or gone); Enter anyway",
                        ENTER_WAIT_S)
            return
        last = last or time.monotonic()      # None: its window no longer takes pings
    if (gap := TYPE_TO_ENTER_GAP_S - (time.monotonic() - last)) > 0:
        await asyncio.sleep(gap)
    left = max(deadline - time.monotonic(), PING_WAIT_S)
    if await asyncio.to_thread(xin.keys_processed, left) is False:
        logger.info("the focused client did not answer within %.1f s after typing; pressing Enter anyway", left)


async def drag(action: Action, xin: XInput, px, py, run) -> None:
    """Press, move in steps (toolkits need intermediate motion events to start a drag), release. A drag drops
    only once its target has answered (XDND: the source sends a position, the target its status), and a client
    busy while the events arrived would read the release before that and cancel the drop (a policy's right drag
    scored 0; tests/local_gym/test_api.py stops the file manager to show it). So the source has taken the press
    before the pointer moves, and before the release the source, the target and the source again answer a ping
    (each answer: every event before it handled). Clients that take no pings get the fixed pauses only."""
    await run(xin.move, px(action.x), py(action.y))
    await run(xin.button, 1, True)
    source = await asyncio.to_thread(xin.pointer_client)
    await asyncio.to_thread(xin.processed, source)
    for i in range(1, 9):
        f = i / 8
        await asyncio.sleep(0.02)
        await run(xin.move, px(action.x + (action.x2 - action.x) * f), py(action.y + (action.y2 - action.y) * f))
    target = await asyncio.to_thread(xin.pointer_client)
    for window in (source, target, source):
        await asyncio.to_thread(xin.processed, window)
    await asyncio.sleep(0.05)
    await run(xin.button, 1, False)


async def perform(action: Action, xin: XInput, width: int, height: int, state: dict) -> None:
    """Play ``action``; ``state`` carries per-execution timing (last typing time) across actions."""
    px = lambda f: min(int(f * width), width - 1)    # noqa: E731
    py = lambda f: min(int(f * height), height - 1)  # noqa: E731
    async def run(fn, *args):  # XTEST calls are sub-millisecond: run inline, no thread hop
        if inspect.isawaitable(done := fn(*args)):   # a backend that paces its input (the VM's typing)
            await done
    if action.type == "click":
        await run(xin.click, px(action.x), py(action.y), action.button, action.count)
    elif action.type == "press":
        await run(xin.move, px(action.x), py(action.y))
        await run(xin.button, 1, True)
        await asyncio.sleep(action.ms / 1000)
        await run(xin.button, 1, False)
    elif action.type == "move":
        await run(xin.move, px(action.x), py(action.y))
    elif action.type == "drag":
        await drag(action, xin, px, py, run)
    elif action.type == "scroll":
        await run(xin.scroll, px(action.x), py(action.y), action.dx, action.dy)
    elif action.type == "type":
        await keyboard_target(xin)
        text = action.text
        if text.endswith("\n"):    # the text's own Enter keeps the gap as a separate Enter would
            if text[:-1]:
                await run(xin.type_text, text[:-1])
                await typed(xin, state)
            await enter_gap(xin, state)
            await run(xin.type_text, "\n")
        else:
            await run(xin.type_text, text)
            await typed(xin, state)
    elif action.type == "key":
        await keyboard_target(xin)
        if RETURN_KEYSYMS & set(action.keysyms):
            await enter_gap(xin, state)
        await run(xin.key_combo, action.keysyms)
    elif action.type == "wait":
        await asyncio.sleep(action.ms / 1000)
