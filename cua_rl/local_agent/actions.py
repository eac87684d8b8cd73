"""Actions as the agent sends them to the gym, and what the prompt formats parse model output into.

Why a module of its own: every prompt format (qwen3-vl, mai-ui, keyboard) ends in the same desktop action schema
(docs/protocols.md §1.6, coordinates are fractions 0..1), and the `mobile` action space rewrites a few of them into
the genv mobile aliases (tap, long_press, swipe, key home/back). Keeping the wire shapes here means a
format only decides *what* the model asked for, never how the gym spells it.

Convention: scroll ``dy > 0`` scrolls the content down (like a mouse wheel turned towards the user,
X button 5); ``dx > 0`` scrolls right.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

ActionSpace = Literal["pc", "mobile"]
ACTION_SPACES: tuple[str, ...] = ("pc", "mobile")

# How far a mobile swipe travels when the model gives only a direction (fraction of the screen side).
SWIPE_DISTANCE = 0.3
# Notches a pc "swipe" (MAI-UI) scrolls; a finger swipe moves roughly this much content.
SWIPE_SCROLL_NOTCHES = 5
# The qwen3-vl `scroll` takes pixels; a wheel notch moves about this many.
PIXELS_PER_NOTCH = 100


class InvalidAction(ValueError):
    """Model output that cannot become an action. The message is fed back to the model verbatim."""


@dataclass
class AgentAction:
    """One action the model asked for.

    ``name``/``args`` are the model's own (kept for events and steps); ``gym_action`` is the wire action
    (None for actions that end the run without touching the gym); ``pointer`` is where the mouse ends up.
    """

    name: str
    args: dict[str, Any]
    gym_action: dict[str, Any] | None = None
    terminal: bool = False
    answer: str | None = None
    status: str | None = None
    pointer: tuple[float, float] | None = None
    call_id: str = ""


@dataclass
class ParsedTurn:
    """What one model reply amounts to: free-text thinking plus one or more actions, in order."""

    thinking: str | None
    text: str
    actions: list[AgentAction] = field(default_factory=list)


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InvalidAction(f"{what} must be a number, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise InvalidAction(f"{what} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise InvalidAction(f"{what} must be finite, got {value!r}")
    return number


def grid_point(value: Any, grid: int, what: str = "coordinate") -> tuple[float, float]:
    """``[x, y]`` on a 0..grid scale -> fractions 0..1. Out-of-range points are invalid, not clamped,
    so the model learns the grid instead of silently clicking the screen edge."""
    if isinstance(value, str):  # "[500, 300]" or "500,300" from sloppy JSON
        value = [part for part in value.strip("[]() ").replace(",", " ").split() if part]
    if isinstance(value, dict) and "x" in value and "y" in value:
        value = [value["x"], value["y"]]
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise InvalidAction(f"{what} must be [x, y] on the 0..{grid} grid, got {value!r}")
    x, y = (_number(v, what) for v in value)
    if not (0 <= x <= grid and 0 <= y <= grid):
        raise InvalidAction(f"{what} {list(value)} is outside the 0..{grid} grid")
    return x / grid, y / grid


# --- desktop schema builders (docs/protocols.md §1.6) --------------------------------------------

def click(point: tuple[float, float], button: str = "left", count: int = 1) -> dict[str, Any]:
    return {"type": "click", "x": point[0], "y": point[1], "button": button, "count": count}


def move(point: tuple[float, float]) -> dict[str, Any]:
    return {"type": "move", "x": point[0], "y": point[1]}


def drag(start: tuple[float, float], end: tuple[float, float]) -> dict[str, Any]:
    return {"type": "drag", "x": start[0], "y": start[1], "x2": end[0], "y2": end[1]}


def scroll(point: tuple[float, float], dx: int, dy: int) -> dict[str, Any]:
    return {"type": "scroll", "x": point[0], "y": point[1], "dx": dx, "dy": dy}


def type_text(text: Any) -> dict[str, Any]:
    if not isinstance(text, str) or text == "":
        raise InvalidAction(f"type needs a non-empty 'text' string, got {text!r}")
    return {"type": "type", "text": text}


def key(keys: Any) -> dict[str, Any]:
    """``["ctrl", "s"]`` or ``"ctrl+s"`` -> a key chord; names are lower-cased, the gym validates them."""
    if isinstance(keys, str):
        keys = [k for k in keys.replace(" ", "").split("+") if k] if "+" in keys else [keys.strip()]
    if not isinstance(keys, (list, tuple)) or not keys or not all(isinstance(k, str) and k.strip() for k in keys):
        raise InvalidAction(f"key needs 'keys' as a non-empty list of key names, got {keys!r}")
    return {"type": "key", "keys": [k.strip().lower() for k in keys]}


def wait(seconds: Any = 1.0) -> dict[str, Any]:
    secs = _number(seconds, "time")
    if not 0 <= secs <= 60:
        raise InvalidAction(f"wait time must be within 0..60 seconds, got {seconds!r}")
    return {"type": "wait", "ms": int(round(secs * 1000))}


def notches_from_pixels(pixels: Any) -> int:
    """qwen3-vl scroll amount (pixels, positive = up) -> wheel notches (positive = down)."""
    amount = _number(pixels, "pixels")
    if amount == 0:
        raise InvalidAction("scroll 'pixels' must be non-zero (positive scrolls up, negative down)")
    notches = max(1, min(50, round(abs(amount) / PIXELS_PER_NOTCH)))
    return -notches if amount > 0 else notches


def swipe_end(start: tuple[float, float], direction: str) -> tuple[float, float]:
    """End point of a finger swipe of ``SWIPE_DISTANCE`` from ``start`` in ``direction``."""
    dx, dy = {"up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0)}[direction]
    clamp = lambda v: min(1.0, max(0.0, v))  # noqa: E731
    return clamp(start[0] + dx * SWIPE_DISTANCE), clamp(start[1] + dy * SWIPE_DISTANCE)


# --- action spaces ----------------------------------------------------------------------------------

def for_space(action: dict[str, Any], space: str) -> dict[str, Any]:
    """The desktop action as ``space`` spells it: ``pc`` keeps the desktop schema; ``mobile`` uses the
    genv aliases where one exists (left single click -> tap, drag -> swipe, lone home/back key -> key)."""
    if space == "pc":
        return action
    kind = action["type"]
    if kind == "click" and action.get("button", "left") == "left" and action.get("count", 1) == 1:
        return {"type": "tap", "x": action["x"], "y": action["y"]}
    if kind == "drag":
        return {"type": "swipe", "x": action["x"], "y": action["y"], "x2": action["x2"], "y2": action["y2"]}
    if kind == "key" and action["keys"] in (["home"], ["back"]):
        return {"type": "key", "key": action["keys"][0]}
    return action


def long_press(point: tuple[float, float], space: str) -> dict[str, Any]:
    """Mobile long press; on a pc the same gesture opens a context menu, i.e. a right click."""
    if space == "mobile":
        return {"type": "long_press", "x": point[0], "y": point[1]}
    return click(point, button="right")
