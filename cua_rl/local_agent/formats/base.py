"""The prompt-format base class: message building with bounded history, and tool-call extraction.

Why a base class: every agent format (qwen3-vl, mai-ui, ...) shares the conversation shape (system prompt;
user turns that carry a screenshot; assistant turns that carry the model's own reply) and the
``<tool_call>{json}</tool_call>`` envelope. A format only supplies its system prompt, its grid and how
one tool call becomes an :class:`~cua_rl.local_agent.actions.AgentAction`.

History is bounded: the last ``history_images`` screenshots (the current one included) are sent as images
with the replies that followed them; older steps collapse to one text line each, so a prompt never
grows by more than a line per step.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from ...http.input import BadJSON, parse_json, too_deep
from ..actions import AgentAction, InvalidAction, ParsedTurn

MAX_ACTIONS_PER_TURN = 8
MAX_CALL_DEPTH = 16   # a tool call nests 3 levels ({"arguments": {"coordinate": [x, y]}}); deeper is no call
_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)
_THINKING = re.compile(r"<(think|thinking)>(.*?)</\1>", re.S)
_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")


@dataclass
class PromptContext:
    """What a format needs to know about the run. ``pointer`` is the last mouse position (fractions),
    used by actions that start "from the current position" (qwen3-vl ``left_click_drag``)."""

    instruction: str
    space: str = "pc"
    screen: tuple[int, int] = (0, 0)
    history_images: int = 3
    pointer: tuple[float, float] | None = None


@dataclass
class HistoryStep:
    """One finished step as the prompt replays it.

    ``feedback`` is the text shown with this step's screenshot (about the step before); ``reply`` the
    assistant text as the model wrote it; ``summary`` the one-liner used once the screenshot ages out.
    """

    step: int
    screenshot: str
    feedback: str | None
    reply: str
    summary: str


def image_part(data_url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_url}}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def reply_text(message: dict[str, Any]) -> tuple[str, str | None]:
    """A reply's text and its thinking (a ``<think>``/``<thinking>`` block, else ``reasoning_content``)."""
    content = message.get("content")
    text = content if isinstance(content, str) else ""
    match = _THINKING.search(text)
    return text, match.group(2).strip() if match else (message.get("reasoning_content") or None)


class PromptFormat(ABC):
    """One agent's prompt and output format. Subclasses set ``name``, ``grid``, ``function_names``."""

    name: ClassVar[str]
    grid: ClassVar[int]
    function_names: ClassVar[tuple[str, ...]]
    # Sampling used when the run payload gives none (the payload's ``sampling`` overrides key by key).
    default_sampling: ClassVar[dict[str, Any]] = {"max_tokens": 2048}

    # -- prompt ------------------------------------------------------------------------------------

    @abstractmethod
    def system_prompt(self, ctx: PromptContext) -> str:
        """The system message text."""

    def task_text(self, ctx: PromptContext, older: list[HistoryStep]) -> str:
        text = f"Task: {ctx.instruction}"
        if older:
            lines = "\n".join(f"Step {h.step}: {h.summary}" for h in older)
            text += f"\n\nPrevious steps (their screenshots are no longer shown):\n{lines}"
        return text

    def feedback_text(self, reason: str) -> str:
        """What the model reads after a reply that could not be executed."""
        return (f"Your previous reply could not be executed: {reason}\n"
                f"Reply with exactly one <tool_call>...</tool_call> block as described in the instructions.")

    def build_messages(self, ctx: PromptContext, history: list[HistoryStep], screenshot: str,
                       feedback: str | None) -> list[dict[str, Any]]:
        """system, then alternating user(screenshot)/assistant(reply) turns, ending with the current
        screenshot. The task text (plus summaries of aged-out steps) opens the first user turn."""
        keep = max(0, ctx.history_images - 1)
        recent = history[-keep:] if keep else []
        older = history[: len(history) - len(recent)]
        messages: list[dict[str, Any]] = [{"role": "system", "content": self.system_prompt(ctx)}]
        turns = [(h.screenshot, h.feedback, h.reply) for h in recent] + [(screenshot, feedback, None)]
        for i, (shot, note, reply) in enumerate(turns):
            parts = [text_part(self.task_text(ctx, older))] if i == 0 else []
            if note:
                parts.append(text_part(note))
            parts.append(image_part(shot))
            messages.append({"role": "user", "content": parts})
            if reply is not None:
                messages.append({"role": "assistant", "content": reply})
        return messages

    # -- parsing -----------------------------------------------------------------------------------

    @abstractmethod
    def to_action(self, arguments: dict[str, Any], ctx: PromptContext,
                  pointer: tuple[float, float] | None) -> AgentAction:
        """One tool call's ``arguments`` -> an action; raises :class:`InvalidAction` with a reason."""

    def parse(self, message: dict[str, Any], ctx: PromptContext) -> ParsedTurn:
        """A chat-completion ``message`` -> thinking + actions. Raises ``InvalidAction`` when the reply
        holds no usable tool call; then nothing of the turn is executed (all or nothing)."""
        text, thinking = reply_text(message)
        calls = self._tool_calls(text, message.get("tool_calls"))
        if not calls:
            raise InvalidAction("no <tool_call> block found in the reply")
        if len(calls) > MAX_ACTIONS_PER_TURN:
            raise InvalidAction(f"{len(calls)} tool calls in one reply; at most {MAX_ACTIONS_PER_TURN} allowed")
        actions: list[AgentAction] = []
        pointer = ctx.pointer
        for index, call in enumerate(calls):
            name, arguments = self._unpack(call)
            action = self.to_action(arguments, ctx, pointer)
            action.call_id = f"call_{index}"
            pointer = action.pointer or pointer
            actions.append(action)
            if action.terminal:
                break  # nothing after a terminate/answer can run
        return ParsedTurn(thinking=thinking, text=text, actions=actions)

    def _tool_calls(self, text: str, structured: Any) -> list[Any]:
        calls: list[Any] = []
        for raw in _TOOL_CALL.findall(text):
            raw = _FENCE.sub("", raw.strip())
            try:   # depth-limited: the model's text is untrusted, and nesting is no tool call
                calls.append(parse_json(raw, MAX_CALL_DEPTH))
            except BadJSON as exc:
                raise InvalidAction(f"the <tool_call> body is not usable JSON ({exc})") from None
        if not calls and isinstance(structured, list) and not too_deep(structured, MAX_CALL_DEPTH):
            # servers with a tool parser return these instead
            for call in structured:
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict):
                    calls.append({"name": function.get("name"), "arguments": function.get("arguments")})
        return calls

    def _unpack(self, call: Any) -> tuple[str, dict[str, Any]]:
        if not isinstance(call, dict):
            raise InvalidAction("a tool call must be a JSON object with 'name' and 'arguments'")
        name = call.get("name")
        if name not in self.function_names:
            raise InvalidAction(f"unknown function {name!r}; use {' or '.join(self.function_names)}")
        arguments = call.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = parse_json(arguments, MAX_CALL_DEPTH)
            except BadJSON:
                raise InvalidAction("'arguments' is a string that is not usable JSON") from None
        if not isinstance(arguments, dict) or not isinstance(arguments.get("action"), str):
            raise InvalidAction("'arguments' must be an object with an 'action' string")
        return name, arguments

    @staticmethod
    def summarize(turn: ParsedTurn) -> str:
        """One line per step for aged-out history."""
        return "; ".join(json.dumps(a.args, ensure_ascii=False, separators=(",", ":")) for a in turn.actions)


_REGISTRY: dict[str, type[PromptFormat]] = {}


def register_format(cls: type[PromptFormat]) -> type[PromptFormat]:
    """Class decorator: make a format selectable by its ``name`` in the run payload's ``agent``."""
    _REGISTRY[cls.name] = cls
    return cls


def get_format(name: str) -> PromptFormat:
    try:
        return _REGISTRY[name]()
    except KeyError:
        raise ValueError(f"unknown agent {name!r}; known: {', '.join(sorted(_REGISTRY))}") from None


def format_names() -> list[str]:
    return sorted(_REGISTRY)
