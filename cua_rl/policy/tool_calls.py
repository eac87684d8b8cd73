"""Tool calls in the endpoint's answers, as vLLM's OpenAI server gives them with ``--enable-auto-tool-choice
--tool-call-parser hermes``.

Why: Qwen-family and Hermes models write a call as text, ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.
An OpenAI client that sent ``tools`` reads the call from ``message.tool_calls`` (and ``finish_reason``
``tool_calls``), not from ``content``; before this it got none. Only the reply changes: the turn recorded
for training keeps the exact sampled token ids, whatever the reply makes of them.

The rules are vLLM 0.19.1's (``vllm/tool_parsers/hermes_tool_parser.py`` and the chat serving code), so an
agent sees the same answer from us as from ``vllm serve``:
- parsing happens when the request has ``tools`` and ``tool_choice`` is absent or ``"auto"``; the text is then
  decoded with special tokens kept (some models mark ``<tool_call>`` special);
- each ``<tool_call>...</tool_call>`` (or an unterminated last one) holds JSON with ``name`` and ``arguments``;
  ``arguments`` is returned as a JSON string; ``content`` is the text before the first ``<tool_call>`` (null
  when empty); a call that is not such JSON leaves the whole text as ``content`` and no calls;
- ``parallel_tool_calls: false`` keeps the first call only;
- (ours) a call nested deeper than ``http.input.MAX_JSON_DEPTH`` levels is no call: the text stays the content
  (``json.loads`` raises RecursionError on one thousands of levels deep, which was a 500 and a lost turn).
``tool_choice`` ``"required"`` or a named function make vLLM constrain decoding; the endpoint samples from the
trainer's policy unconstrained, so such requests are refused with a 400 that says so.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from ..http.input import parse_json
from .prompt import BadRequest

logger = logging.getLogger(__name__)

START = "<tool_call>"
_CALLS = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


@dataclass(frozen=True)
class ToolRequest:
    """What a request asks of tool calls: parse them out of the answer or not, and how many to keep."""

    parse: bool = False
    parallel: bool = True

    @classmethod
    def of(cls, body: dict[str, Any]) -> "ToolRequest":
        tools, choice = body.get("tools"), body.get("tool_choice")
        if choice not in (None, "auto", "none"):
            raise BadRequest(f"tool_choice {choice!r} is not supported: vLLM forces such calls by constrained "
                             f"decoding, and the policy endpoint samples from the trainer's policy as it is "
                             f"(use \"auto\", the default, or \"none\")")
        return cls(parse=bool(tools) and choice != "none", parallel=body.get("parallel_tool_calls") is not False)


@dataclass(frozen=True)
class Reply:
    """An answer's message: its ``content`` and its ``tool_calls`` (OpenAI's shapes)."""

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


def parse_reply(text: str, request: ToolRequest) -> Reply:
    """The message an OpenAI client gets for the model's ``text``."""
    if not request.parse or START not in text:
        return Reply(text)
    try:   # depth-limited (http.input.parse_json): the model's text is untrusted; a deep "call" is text
        calls = [_call(parse_json(whole or unterminated)) for whole, unterminated in _CALLS.findall(text)]
    except (ValueError, TypeError, KeyError) as exc:
        logger.info("the answer's tool call is not valid JSON with a name and arguments (%s): returned as text", exc)
        return Reply(text)
    if not request.parallel:
        calls = calls[:1]
    return Reply(text[:text.find(START)] or None, calls)


def _call(raw: Any) -> dict[str, Any]:
    name = raw["name"]
    if not isinstance(name, str):
        raise TypeError(f"the tool call's name is {type(name).__name__}, not a string")
    return {"id": f"chatcmpl-tool-{uuid.uuid4().hex}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(raw["arguments"], ensure_ascii=False)}}

