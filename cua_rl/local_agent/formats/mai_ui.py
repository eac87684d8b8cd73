"""``mai-ui``: MAI-UI's tool-call format (docs/protocols.md §2.5).

The model writes ``<thinking>...</thinking><tool_call>{"name": "mobile_use", "arguments": {...}}</tool_call>``
with coordinates on a 0..999 grid. MAI-UI is a phone agent, so its actions are mobile gestures; in the
``mobile`` action space they become the genv mobile aliases, in ``pc`` they map onto the desktop schema:
swipe -> wheel scroll (a finger swiping up reveals content below, i.e. scrolls down), long_press -> right
click (the desktop gesture for a context menu), system_button back/home/menu -> Escape/Super/Menu keys.
A phone has no key chords, but a desktop cannot save a file without one, so the ``pc`` action space adds
``{"action": "hotkey", "keys": [...]}``; MAI-UI's own actions are unchanged.
"""

from __future__ import annotations

from typing import Any

from .. import actions as A
from ..actions import AgentAction, InvalidAction
from .base import PromptContext, PromptFormat, register_format

_ACTION_SPACE = """{"action": "click", "coordinate": [x, y]}
{"action": "double_click", "coordinate": [x, y]}
{"action": "long_press", "coordinate": [x, y]}
{"action": "type", "text": ""}
{"action": "swipe", "direction": "up or down or left or right", "coordinate": [x, y]} # "coordinate" is optional; give it to swipe a specific element.
{"action": "drag", "start_coordinate": [x1, y1], "end_coordinate": [x2, y2]}
{"action": "system_button", "button": "button_name"} # one of: back, home, menu, enter
{"action": "wait"}
{"action": "terminate", "status": "success or fail"}
{"action": "answer", "text": "xxx"} # escape quotes and newlines in the text as in JSON strings."""
_PC_EXTRA = '\n{"action": "hotkey", "keys": ["ctrl", "s"]} # press a key combination (desktop only)'

_DEVICE = {"mobile": "a phone", "pc": "a desktop computer (a long_press opens the context menu, "
                                      "a swipe scrolls the content under the pointer)"}

_PC_BUTTONS = {"back": ["escape"], "home": ["super"], "menu": ["menu"], "enter": ["enter"]}
_UNSUPPORTED = {"open", "awake", "info", "ask_user"}


@register_format
class MaiUIFormat(PromptFormat):
    name = "mai-ui"
    grid = 999
    function_names = ("mobile_use",)
    # The MAI-UI reference agent decodes greedily with these limits.
    default_sampling = {"temperature": 0.0, "top_p": 1.0, "max_tokens": 2048}

    def system_prompt(self, ctx: PromptContext) -> str:
        return (
            "You are a GUI agent operating " + _DEVICE.get(ctx.space, _DEVICE["pc"]) + ". You are given a task "
            "and your action history, with screenshots. Decide the single next action that moves the task "
            "forward.\n\n"
            "## Output Format\nReturn your reasoning in <thinking></thinking> tags, then one JSON object with "
            "the function name and arguments in <tool_call></tool_call> tags:\n```\n<thinking>\n...\n"
            '</thinking>\n<tool_call>\n{"name": "mobile_use", "arguments": <args-json-object>}\n</tool_call>\n'
            "```\n\n## Action Space\n\n" + _ACTION_SPACE + (_PC_EXTRA if ctx.space == "pc" else "") + "\n\n"
            "## Note\n- Coordinates are on a 0..999 grid of the screenshot: [0, 0] is the top-left corner and "
            "[999, 999] the bottom-right.\n- In <thinking>, plan briefly and end with the next action and its "
            "target element in one sentence.\n- Follow the action space strictly.")

    def to_action(self, arguments: dict[str, Any], ctx: PromptContext,
                  pointer: tuple[float, float] | None) -> AgentAction:
        name = arguments["action"]
        space = ctx.space
        make = lambda gym, point=None: AgentAction(  # noqa: E731
            name=name, args=arguments, gym_action=A.for_space(gym, space), pointer=point)
        if name in ("click", "double_click"):
            point = A.grid_point(arguments.get("coordinate"), self.grid)
            return make(A.click(point, count=2 if name == "double_click" else 1), point)
        if name == "long_press":
            point = A.grid_point(arguments.get("coordinate"), self.grid)
            return AgentAction(name=name, args=arguments, gym_action=A.long_press(point, space), pointer=point)
        if name == "type":
            return make(A.type_text(arguments.get("text")))
        if name == "swipe":
            direction = arguments.get("direction")
            if direction not in ("up", "down", "left", "right"):
                raise InvalidAction(f"swipe needs direction up, down, left or right, got {direction!r}")
            coordinate = arguments.get("coordinate")
            start = A.grid_point(coordinate, self.grid) if coordinate is not None else (0.5, 0.5)
            if space == "mobile":
                return make(A.drag(start, A.swipe_end(start, direction)), start)
            n = A.SWIPE_SCROLL_NOTCHES
            dx, dy = {"up": (0, n), "down": (0, -n), "left": (n, 0), "right": (-n, 0)}[direction]
            return make(A.scroll(start, dx, dy), start)
        if name == "drag":
            start = A.grid_point(arguments.get("start_coordinate"), self.grid, "start_coordinate")
            end = A.grid_point(arguments.get("end_coordinate"), self.grid, "end_coordinate")
            return make(A.drag(start, end), end)
        if name == "system_button":
            button = arguments.get("button")
            if button not in _PC_BUTTONS:
                raise InvalidAction(f"system_button needs button back, home, menu or enter, got {button!r}")
            keys = [button] if space == "mobile" and button in ("back", "home") else _PC_BUTTONS[button]
            return make(A.key(keys))
        if name == "hotkey":
            if space != "pc":
                raise InvalidAction("hotkey is only available on a desktop; use system_button")
            return make(A.key(arguments.get("keys")))
        if name == "wait":
            return make(A.wait(arguments.get("time", 1.0)))
        if name == "terminate":
            status = arguments.get("status")
            if status not in ("success", "fail", "failure"):
                raise InvalidAction(f"terminate needs status 'success' or 'fail', got {status!r}")
            return AgentAction(name=name, args=arguments, terminal=True,
                               status="success" if status == "success" else "failure")
        if name == "answer":
            text = arguments.get("text")
            if not isinstance(text, str):
                raise InvalidAction(f"answer needs a 'text' string, got {text!r}")
            return AgentAction(name=name, args=arguments, terminal=True, answer=text, status="success")
        if name.lower() in _UNSUPPORTED:
            raise InvalidAction(f"action {name!r} is not available in this environment; use the screen instead")
        raise InvalidAction(f"unknown action {name!r}; follow the action space")
