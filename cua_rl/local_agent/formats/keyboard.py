"""``keyboard``: the keyboard-only action format of the Windows computer-use example (Slime on Modal).

The model answers with tags, not tool calls: ``<action>sendkey ctrl-s</action>`` (a key chord in QEMU's
``sendkey`` names, joined by ``-``), ``<action>type hello</action>``, ``<action>typeline dir</action>`` (the text,
then Enter), ``<action>wait 2</action>`` (seconds), and ``<done/>`` when the task is finished. No pointer: the
example drives Notepad and PowerShell from the Run dialog (``sendkey meta_l-r``), which is what a keyboard-only
policy can learn on any desktop. Several actions in one reply run in order (at most ``MAX_ACTIONS_PER_TURN``);
``<done/>`` after them ends the episode.
"""

from __future__ import annotations

import re
from typing import Any

from .. import actions as A
from ..actions import AgentAction, InvalidAction, ParsedTurn
from .base import MAX_ACTIONS_PER_TURN, PromptContext, PromptFormat, register_format, reply_text

_TAG = re.compile(r"<action>(.*?)</action>|<done\s*/>", re.S)
# QEMU's sendkey names that differ from the gym's key names (the rest: letters, digits, f1..f12, tab, ...)
QEMU_KEYS = {"meta_l": "super", "meta_r": "super", "ret": "enter", "kp_enter": "enter", "spc": "space",
             "esc": "escape", "ctrl_r": "ctrl", "alt_r": "alt", "shift_r": "shift", "pgup": "pageup",
             "pgdn": "pagedown", "bracket_left": "bracketleft", "bracket_right": "bracketright", "dot": "period",
             "grave_accent": "grave"}
VERBS = ("sendkey", "type", "typeline", "wait")

_SYSTEM = """You operate a computer with the keyboard only, looking at a screenshot of it after every step.
Screen: {width}x{height} pixels ({space}).

Reply with one or more actions, each in its own tag, optionally after a short thought:
  <action>sendkey KEYS</action>     press a key chord; keys joined by "-", e.g. ctrl-s, meta_l-r, alt-f4, ret, esc, tab
  <action>type TEXT</action>        type TEXT into the focused window
  <action>typeline TEXT</action>    type TEXT, then press Enter
  <action>wait SECONDS</action>     wait for the screen to settle
When the task is finished, end your reply with <done/>.

Example:
<action>sendkey meta_l-r</action>
<action>typeline notepad</action>"""


@register_format
class KeyboardFormat(PromptFormat):
    name = "keyboard"
    grid = 0
    function_names = VERBS

    def system_prompt(self, ctx: PromptContext) -> str:
        width, height = ctx.screen
        return _SYSTEM.format(width=width, height=height, space=ctx.space)

    def feedback_text(self, reason: str) -> str:
        return (f"Your previous reply could not be executed: {reason}\n"
                f"Reply with <action>...</action> tags as described in the instructions, or <done/>.")

    def parse(self, message: dict[str, Any], ctx: PromptContext) -> ParsedTurn:
        text, thinking = reply_text(message)
        tags = list(_TAG.finditer(text))
        if not tags:
            raise InvalidAction("no <action>...</action> tag and no <done/> in the reply")
        actions: list[AgentAction] = []
        for tag in tags:
            if tag.group(1) is None:          # <done/>
                actions.append(AgentAction(name="done", args={}, terminal=True, status="success"))
                break
            if len(actions) == MAX_ACTIONS_PER_TURN:
                raise InvalidAction(f"more than {MAX_ACTIONS_PER_TURN} actions in one reply")
            verb, _, rest = tag.group(1).strip().partition(" ")
            action = self.to_action({"verb": verb, "argument": rest}, ctx, ctx.pointer)
            action.call_id = f"call_{len(actions)}"
            actions.append(action)
        return ParsedTurn(thinking=thinking, text=text, actions=actions)

    def to_action(self, arguments: dict[str, Any], ctx: PromptContext,
                  pointer: tuple[float, float] | None) -> AgentAction:
        verb, argument = arguments["verb"], arguments["argument"]
        make = lambda gym: AgentAction(name=verb, args=arguments, gym_action=A.for_space(gym, ctx.space))  # noqa: E731
        if verb == "sendkey":
            keys = [k for k in argument.strip().split("-") if k]
            if not keys or " " in argument.strip():
                raise InvalidAction(f"sendkey needs keys joined by '-', e.g. ctrl-s; got {argument!r}")
            return make(A.key([QEMU_KEYS.get(k.lower(), k.lower()) for k in keys]))
        if verb == "type":
            return make(A.type_text(argument))
        if verb == "typeline":
            return make(A.type_text(argument + "\n"))
        if verb == "wait":
            try:
                seconds = float(argument.strip() or 1.0)
            except ValueError:
                raise InvalidAction(f"wait needs a number of seconds, got {argument!r}") from None
            return make(A.wait(seconds))
        raise InvalidAction(f"unknown action {verb!r}; use one of {', '.join(VERBS)}")
