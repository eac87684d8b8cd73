"""``cua-agent check URL --gym URL --gym-id ID``: does an agent service speak what docs/protocols.md §2.8 says an
agent must implement?

Why: an agent author (or a user pointing the trainer at a gbox-mini-agent) first learned whether their service
works from a training run, minutes in, after the model load. This check plays one short run on one execution of a
real gym against a scripted model it serves itself (an OpenAI-compatible ``chat/completions`` on a free port:
``model_host`` is the address the agent reaches it at, for an agent on another host), through our real client
(``MiniAgentClient``, with the token of ``CUA_AGENT_TOKEN``), and a second run that it cancels. One line per check:

- ``start``: ``POST /runs`` answers a ``runId``;
- ``model``: the agent called the model at ``model.baseUrl`` with ``model.apiKey`` as its bearer token;
- ``events``: ``GET /runs/{id}/events`` gives events with ``type`` and ``ts`` in order, an ``action_executed``
  whose gym result is ``ok``, and ``run_end`` last;
- ``result``: the run ended ``ok`` with the scripted answer (``run_end.answer`` or the status's), ``GET
  /runs/{id}`` says ``completed``, and ``GET /runs/{id}/steps`` answers a list;
- ``execution kept``: the agent left the execution to the trainer (it still answers after the run);
- ``cancel``: ``POST /runs/{id}/cancel`` on a run waiting on the model ends it (``cancelled``, or ``run_end``
  with ``ok: false``) within ``CANCEL_S``.

The gym's executions are created and ended here, as the trainer does (with ``CUA_GYM_TOKEN``).
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from typing import Any

from fastapi import FastAPI, Header, Request

from ..genv.client import GenvClient
from ..genv.conformance import Check, CheckFailed, Checks
from ..genv.errors import GenvError
from ..http.serve import serve_app_in_thread
from ..wire.agent import GenvEnv, ModelEndpoint, RunRequest
from .client import MiniAgentClient, MiniAgentError
from .states import RunState

MODEL = "cua-check-model"
ANSWER = "cua-check-answer"
CANCEL_S = 20.0          # a cancelled run must have ended within this
SLOW_REPLY_S = 60.0      # the cancelled run's model call (the check cancels it long before)


class ScriptedModel:
    """The check's model: for the key of the first run a pointer move, then the answer; for the key of the cancel
    run a reply that takes ``SLOW_REPLY_S``. Records each call's key."""

    def __init__(self) -> None:
        self.run_key, self.cancel_key = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
        self.calls: dict[str, int] = {}
        self.stray: list[str] = []    # calls without one of the keys (no bearer, or another one)
        self.lock = threading.Lock()
        self.closed = threading.Event()   # the check ended: a slow reply stops waiting

    def reply(self, key: str) -> tuple[str, float]:
        with self.lock:
            if key not in (self.run_key, self.cancel_key):
                self.stray.append(key[:6])
                return "", 0.0
            n = self.calls.get(key, 0)
            self.calls[key] = n + 1
        if key == self.cancel_key:
            return _qwen("wait", time=1), SLOW_REPLY_S
        if n == 0:
            return _qwen("mouse_move", coordinate=[500, 500]), 0.0
        return _qwen("answer", text=ANSWER), 0.0


def _qwen(action: str, **arguments: Any) -> str:
    import json

    return "<tool_call>\n" + json.dumps({"name": "computer_use", "arguments": {"action": action, **arguments}}) \
        + "\n</tool_call>"


def model_app(model: ScriptedModel) -> FastAPI:
    app = FastAPI(title="cua-agent check: scripted model")

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": MODEL, "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request, authorization: str = Header("")) -> Any:
        content, delay = model.reply(authorization.removeprefix("Bearer ").strip())
        if not content:
            from fastapi.responses import JSONResponse

            return JSONResponse({"error": {"message": "unknown key", "type": "invalid_request_error"}}, 401)
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline and not model.closed.is_set():
            await asyncio.sleep(0.1)
        return {"id": f"chatcmpl-{time.monotonic_ns()}", "object": "chat.completion", "model": MODEL,
                "created": int(time.time()),
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}

    return app


def _agent_words(exc: MiniAgentError) -> str:
    if exc.status_code == 401:
        return f"HTTP 401: needs a token (CUA_AGENT_TOKEN): {exc.detail}"
    detail = " ".join(str(exc.detail).split())
    if detail.lower().startswith(("<!doctype", "<html")):
        detail = "an HTML page: not an agent service"
    return f"HTTP {exc.status_code}: {detail[:200]}" if exc.status_code else detail[:300]


class AgentChecks(Checks):
    """``Checks`` that also turn the agent service's errors (``MiniAgentError``) into the check's failure."""

    async def run(self, name, step) -> bool:
        try:
            return await super().run(name, step)
        except MiniAgentError as exc:
            return self.add(name, False, _agent_words(exc))


async def check_agent(agent_url: str, gym_url: str, gym_id: str, task_id: str | None = None, *,
                      model_host: str | None = None, agent: str = "qwen3-vl", out=print,
                      timeout_s: float = 120.0) -> list[Check]:
    """Every check of the module docstring; each line is also given to ``out``."""
    checks = AgentChecks(out)
    model = ScriptedModel()
    served = serve_app_in_thread(model_app(model), "0.0.0.0" if model_host else "127.0.0.1", 0)
    base = f"http://{model_host or '127.0.0.1'}:{served.port}/v1"
    try:
        async with GenvClient(gym_url, gym_id) as gym, MiniAgentClient(agent_url) as client:
            try:
                tasks = await gym.list_tasks()
                task = next((t for t in tasks if t.id == task_id), None) if task_id else (tasks[0] if tasks else None)
                if task is None:
                    raise GenvError(f"the gym lists no task {task_id or ''}".strip())
            except GenvError as exc:
                checks.add("gym", False, f"the gym at {gym_url} cannot serve the check: {exc}")
                return checks.done

            def request(eid: str, key: str, steps: int) -> RunRequest:
                return RunRequest(task=task.instruction, agent=agent, max_steps=steps, max_run_time_s=timeout_s,
                                  max_step_time_s=timeout_s,
                                  model=ModelEndpoint(base_url=base, name=MODEL, api_key=key),
                                  env=GenvEnv(gym_base_url=gym_url, gym_id=gym_id, execution_id=eid))

            async with gym.execution(task.id) as execution:
                await _one_run(client, gym, model, checks, request(execution.execution_id, model.run_key, 4),
                               timeout_s)
            async with gym.execution(task.id) as execution:
                await _cancel_run(client, model, checks, request(execution.execution_id, model.cancel_key, 2))
    finally:
        model.closed.set()
        served.stop()
    return checks.done


async def _one_run(client: MiniAgentClient, gym: GenvClient, model: ScriptedModel, checks: AgentChecks,
                   request: RunRequest, timeout_s: float) -> None:
    run: list[str] = []

    async def start() -> str:
        run.append(await client.start_run(request))
        return f"run {run[0]}"

    if not await checks.run("start", start):
        checks.skip("model", "events", "result", "execution kept", why="no run started")
        return
    result = await client.wait(run[0], timeout_s, poll_interval_s=0.5)

    async def model_called() -> str:
        calls = model.calls.get(model.run_key, 0)
        if not calls:
            stray = f"; {len(model.stray)} call(s) came without the run's model.apiKey as bearer" if model.stray else ""
            raise CheckFailed(f"the agent never called the model at model.baseUrl{stray}")
        return f"{calls} chat completions with the run's key"

    async def events() -> str:
        if not result.events:
            raise CheckFailed("GET /runs/{id}/events gave no events")
        untimed = [e.raw_type for e in result.events if e.ts is None or not e.raw_type]
        if untimed:
            raise CheckFailed(f"events without type or ts: {untimed[:3]}")
        if result.events[-1].type != "run_end":
            raise CheckFailed(f"the last event is {result.events[-1].type!r}, not run_end")
        acted = [e for e in result.events if e.type == "action_executed"]
        played = [e for e in acted if ((e.data.get("action") or {}).get("rawResult") or {}).get("ok") is True]
        if not played:
            raise CheckFailed(f"no action_executed event whose gym result is ok ({len(acted)} action events)")
        return f"{len(result.events)} events, run_end last"

    async def outcome() -> str:
        if not result.ok:
            raise CheckFailed(f"the run did not end ok: {result.reason} (status {result.status})")
        if result.answer != ANSWER:
            raise CheckFailed(f"the run's answer is {result.answer!r}, the model answered {ANSWER!r}")
        status = await client.status(run[0])
        if status.status != RunState.COMPLETED:
            raise CheckFailed(f"GET /runs/{{id}} says {status.status!r} after run_end ok, not 'completed'")
        steps = await client.steps(run[0])
        return f"completed, answer {ANSWER!r}, {len(steps)} steps"

    async def kept() -> str:
        try:
            await gym.get_execution(request.env.execution_id)
        except GenvError as exc:
            raise CheckFailed(f"the execution is gone after the run ({exc}): the trainer evaluates it after the "
                              "run, so an agent must not end it") from None
        return "the execution still answers"

    await checks.run("model", model_called)
    await checks.run("events", events)
    await checks.run("result", outcome)
    await checks.run("execution kept", kept)


async def _cancel_run(client: MiniAgentClient, model: ScriptedModel, checks: AgentChecks, request: RunRequest) -> None:
    async def cancel() -> str:
        run_id = await client.start_run(request)
        deadline = time.monotonic() + CANCEL_S
        while not model.calls.get(model.cancel_key) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if not model.calls.get(model.cancel_key):
            raise CheckFailed(f"the run never called the model within {CANCEL_S:g} s; nothing to cancel")
        started = time.monotonic()
        await client.cancel(run_id)
        result = await client.wait(run_id, CANCEL_S, poll_interval_s=0.3, cancel_on_timeout=False)
        if result.timed_out:
            raise CheckFailed(f"the run still runs {CANCEL_S:g} s after POST /runs/{{id}}/cancel")
        if result.ok:
            raise CheckFailed(f"a cancelled run ended ok ({result.reason})")
        return f"ended in {time.monotonic() - started:.1f} s ({result.reason})"

    await checks.run("cancel", cancel)
