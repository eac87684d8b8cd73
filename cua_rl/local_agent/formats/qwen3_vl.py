"""``qwen3-vl``: the Qwen ``computer_use`` function, called as ``<tool_call>{json}</tool_call>``.

Coordinates are on a 0..1000 grid of the screenshot (x_px = x / 1000 * width), whatever the real
resolution, which is how Qwen3-VL is trained for GUI grounding. The function is declared in the
Hermes-style ``<tools>`` block that Qwen chat templates use for function calling.
"""

from __future__ import annotations

import json
from typing import Any

from .. import actions as A
from ..actions import AgentAction, InvalidAction
from .base import PromptContext, PromptFormat, register_format

_ACTIONS = ("key", "type", "mouse_move", "left_click", "left_click_drag", "right_click", "middle_click",
            "double_click", "triple_click", "scroll", "wait", "terminate", "answer")

_DESCRIPTION = """Use a mouse and keyboard to operate the computer shown in the screenshot.
* The screen is addressed on a 1000x1000 grid: [0, 0] is the top-left corner and [1000, 1000] the bottom-right, whatever the real resolution ({width}x{height} pixels).
* Click on the centre of an element, not its edge. If a click had no effect, move or adjust the point and try again.
* Some applications take a moment to react; use `wait` when the screen is still changing.
* When the task is done, call `terminate` with status "success"; if it cannot be done, status "failure". If the task asks a question, give the reply with `answer`.
* Actions:
  key: press a key chord, e.g. keys=["ctrl", "s"] or ["enter"].
  type: type a string into the focused element.
  mouse_move: move the pointer to coordinate.
  left_click / right_click / middle_click / double_click / triple_click: click at coordinate.
  left_click_drag: drag from the current pointer position (or start_coordinate) to coordinate.
  scroll: scroll at coordinate (default: screen centre) by pixels; positive scrolls up, negative down.
  wait: wait `time` seconds.
  terminate: end the task with status "success" or "failure".
  answer: end the task and give the answer `text`."""

_PARAMETERS = {
    "type": "object",
    "properties": {
        "action": {"type": "string", "enum": list(_ACTIONS), "description": "The action to perform."},
        "keys": {"type": "array", "items": {"type": "string"}, "description": "Keys for action=key."},
        "text": {"type": "string", "description": "Text for action=type and action=answer."},
        "coordinate": {"type": "array", "items": {"type": "number"},
                       "description": "[x, y] on the 0..1000 grid, for mouse actions and scroll."},
        "start_coordinate": {"type": "array", "items": {"type": "number"},
                             "description": "Optional drag start for action=left_click_drag."},
        "pixels": {"type": "number", "description": "Scroll amount for action=scroll; positive = up."},
        "time": {"type": "number", "description": "Seconds for action=wait."},
        "status": {"type": "string", "enum": ["success", "failure"], "description": "For action=terminate."},
    },
    "required": ["action"],
}

_CLICKS = {"left_click": ("left", 1), "right_click": ("right", 1), "middle_click": ("middle", 1),
           "double_click": ("left", 2), "triple_click": ("left", 3)}


@register_format
class Qwen3VLFormat(PromptFormat):
    name = "qwen3-vl"
    grid = 1000
    function_names = ("computer_use",)

    def system_prompt(self, ctx: PromptContext) -> str:
        width, height = ctx.screen
        function = {"type": "function", "function": {
            "name": "computer_use",
            "description": _DESCRIPTION.format(width=width or "?", height=height or "?"),
            "parameters": _PARAMETERS}}
        return (
            "You are a computer-use agent. Complete the user's task on the computer, one action at a time, "
            "judging progress from the latest screenshot.\n\n"
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            f"{json.dumps(function, ensure_ascii=False)}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')

    def to_action(self, arguments: dict[str, Any], ctx: PromptContext,
                  pointer: tuple[float, float] | None) -> AgentAction:
        name = arguments["action"]
        make = lambda gym, point=None: AgentAction(  # noqa: E731
            name=name, args=arguments, gym_action=A.for_space(gym, ctx.space), pointer=point)
        if name in _CLICKS:
            point = A.grid_point(arguments.get("coordinate"), self.grid)
            button, count = _CLICKS[name]
            return make(A.click(point, button, count), point)
        if name == "mouse_move":
            point = A.grid_point(arguments.get("coordinate"), self.grid)
            return make(A.move(point), point)
        if name == "left_click_drag":
            end = A.grid_point(arguments.get("coordinate"), self.grid)
            if arguments.get("start_coordinate") is not None:
                start = A.grid_point(arguments["start_coordinate"], self.grid, "start_coordinate")
            elif pointer is not None:
                start = pointer
            else:
                raise InvalidAction("left_click_drag starts at the pointer, which has not been placed yet; "
                                    "give start_coordinate or use mouse_move first")
            return make(A.drag(start, end), end)
        if name == "scroll":
            coordinate = arguments.get("coordinate")
            point = A.grid_point(coordinate, self.grid) if coordinate is not None else (pointer or (0.5, 0.5))
            return make(A.scroll(point, 0, A.notches_from_pixels(arguments.get("pixels"))), point)
        if name == "type":
            return make(A.type_text(arguments.get("text")))
        if name == "key":
            return make(A.key(arguments.get("keys", arguments.get("key"))))
        if name == "wait":
            return make(A.wait(arguments.get("time", 1.0)))
        if name == "terminate":
            status = arguments.get("status")
            if status not in ("success", "failure"):
                raise InvalidAction(f"terminate needs status 'success' or 'failure', got {status!r}")
            return AgentAction(name=name, args=arguments, terminal=True, status=status)
        if name == "answer":
            text = arguments.get("text")
            if not isinstance(text, str):
                raise InvalidAction(f"answer needs a 'text' string, got {text!r}")
            return AgentAction(name=name, args=arguments, terminal=True, answer=text, status="success")
        raise InvalidAction(f"unknown action {name!r}; choose one of: {', '.join(_ACTIONS)}")
