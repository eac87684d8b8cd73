"""TEST DOUBLE: a scripted OpenAI-compatible model server standing in for the policy endpoint.

Why a double: the agent service's job is the loop around the model; with a real VLM the tests would
measure the model (a tiny random one never solves a task). This server replies from a script instead:
each run authenticates with its own bearer key and gets the next reply of the script registered under
that key (the last entry repeats when the script runs out). It speaks the subset the agent uses:
``GET /v1/models`` and ``POST /v1/chat/completions``, and, like vLLM, it adds ``token_ids`` and
``logprobs`` only when the request asks for them (the ids are the reply's UTF-8 bytes, not a real
tokenizer's). Every request body is recorded for assertions.

Script entries: a string (the assistant ``content``), or a dict with ``status`` (reply with that HTTP
error), ``delay`` (seconds to sleep first), ``pad_bytes`` (an extra ``padding`` field of that many bytes: a
server that answers far too much) and/or ``content``; or ``encoded``: ``(body, coding)`` answered verbatim with
``Content-Encoding: coding`` (a hostile model server's compression bomb: ``gzip, gzip``, ``zstd``).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Header, HTTPException, Request
from fastapi.responses import JSONResponse, Response

MODEL_ID = "scripted-policy"


def tool_call(name: str, **arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def qwen_call(**arguments: Any) -> str:
    return tool_call("computer_use", **arguments)


def mai_call(thinking: str = "next", **arguments: Any) -> str:
    return f"<thinking>\n{thinking}\n</thinking>\n" + tool_call("mobile_use", **arguments)


@dataclass
class ScriptedModel:
    scripts: dict[str, list[Any]] = field(default_factory=dict)
    requests: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    reject_token_hints: bool = False
    _cursor: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def script(self, key: str, replies: list[Any]) -> str:
        """Register replies for bearer ``key``; returns the key (the run's ``model.apiKey``)."""
        with self._lock:
            self.scripts[key] = list(replies)
        return key

    def next_reply(self, key: str, body: dict[str, Any]) -> Any:
        with self._lock:
            if key not in self.scripts:
                raise HTTPException(401, f"no script for key {key!r}")
            self.requests.setdefault(key, []).append(body)
            i = self._cursor.get(key, 0)
            self._cursor[key] = i + 1
            replies = self.scripts[key]
            return replies[min(i, len(replies) - 1)]


def build_model_app(model: ScriptedModel) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": MODEL_ID, "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request, authorization: str = Header("")) -> Any:
        body = await request.json()
        if model.reject_token_hints and "return_token_ids" in body:
            return JSONResponse({"error": {"message": "Unrecognized request argument: return_token_ids"}}, 400)
        if body.get("model") != MODEL_ID:
            return JSONResponse({"error": {"message": f"invalid model ID {body.get('model')!r}"}}, 404)
        reply = model.next_reply(authorization.removeprefix("Bearer "), body)
        padding = None
        if isinstance(reply, dict):
            await asyncio.sleep(reply.get("delay", 0))
            if "status" in reply:
                return JSONResponse({"error": {"message": "scripted failure"}}, reply["status"])
            if "encoded" in reply:
                body, coding = reply["encoded"]
                return Response(body, media_type="application/json", headers={"Content-Encoding": coding})
            padding = "x" * reply["pad_bytes"] if "pad_bytes" in reply else None
            reply = reply.get("content", "")
        choice: dict[str, Any] = {"index": 0, "finish_reason": "stop",
                                  "message": {"role": "assistant", "content": reply}}
        ids = list(reply.encode("utf-8"))
        if body.get("return_token_ids"):
            choice["token_ids"] = ids
        if body.get("logprobs"):
            choice["logprobs"] = {"content": [{"token": str(i), "logprob": -0.5} for i in ids]}
        response = {"id": f"chatcmpl-{time.monotonic_ns()}", "object": "chat.completion", "model": MODEL_ID,
                    "created": int(time.time()), "choices": [choice],
                    "usage": {"prompt_tokens": 1, "completion_tokens": len(ids), "total_tokens": 1 + len(ids)}}
        if body.get("return_token_ids"):
            response["prompt_token_ids"] = [1, 2, 3]
        if padding is not None:
            response["padding"] = padding
        return response

    return app


# --- reference solutions (desktop actions, fractions 0..1) -> scripted replies ----------------------

def _grid(action: dict[str, Any], grid: int, x: str = "x", y: str = "y") -> list[int]:
    return [round(action[x] * grid), round(action[y] * grid)]


def qwen_script(solution: list[dict[str, Any]]) -> list[str]:
    """A task's reference solution as qwen3-vl ``computer_use`` replies, ending with terminate."""
    clicks = {("left", 1): "left_click", ("left", 2): "double_click", ("left", 3): "triple_click",
              ("right", 1): "right_click", ("middle", 1): "middle_click"}
    replies = []
    for a in solution:
        kind = a["type"]
        if kind == "click":
            name = clicks[(a.get("button", "left"), a.get("count", 1))]
            replies.append(qwen_call(action=name, coordinate=_grid(a, 1000)))
        elif kind == "move":
            replies.append(qwen_call(action="mouse_move", coordinate=_grid(a, 1000)))
        elif kind == "drag":
            replies.append(qwen_call(action="left_click_drag", start_coordinate=_grid(a, 1000),
                                     coordinate=_grid(a, 1000, "x2", "y2")))
        elif kind == "scroll":
            replies.append(qwen_call(action="scroll", coordinate=_grid(a, 1000), pixels=-100 * a.get("dy", 0)))
        elif kind == "type":
            replies.append(qwen_call(action="type", text=a["text"]))
        elif kind == "key":
            replies.append(qwen_call(action="key", keys=a["keys"]))
        elif kind == "wait":
            replies.append(qwen_call(action="wait", time=a.get("ms", 500) / 1000))
        else:
            raise ValueError(f"no qwen3-vl equivalent for {a}")
    return replies + [qwen_call(action="terminate", status="success")]


def mai_script(solution: list[dict[str, Any]]) -> list[str]:
    """A reference solution as MAI-UI replies (pc action space: key chords become ``hotkey``)."""
    buttons = {("enter",): "enter", ("return",): "enter", ("escape",): "back", ("esc",): "back"}
    replies = []
    for a in solution:
        kind = a["type"]
        if kind == "click" and a.get("button", "left") == "left" and a.get("count", 1) in (1, 2):
            name = "click" if a.get("count", 1) == 1 else "double_click"
            replies.append(mai_call(action=name, coordinate=_grid(a, 999)))
        elif kind == "click" and a.get("button") == "right":
            replies.append(mai_call(action="long_press", coordinate=_grid(a, 999)))
        elif kind == "drag":
            replies.append(mai_call(action="drag", start_coordinate=_grid(a, 999),
                                    end_coordinate=_grid(a, 999, "x2", "y2")))
        elif kind == "type":
            replies.append(mai_call(action="type", text=a["text"]))
        elif kind == "key" and tuple(k.lower() for k in a["keys"]) in buttons:
            replies.append(mai_call(action="system_button", button=buttons[tuple(k.lower() for k in a["keys"])]))
        elif kind == "key":
            replies.append(mai_call(action="hotkey", keys=a["keys"]))
        elif kind == "wait":
            replies.append(mai_call(action="wait"))
        else:
            raise ValueError(f"no MAI-UI equivalent for {a}")
    return replies + [mai_call(action="terminate", status="success")]
