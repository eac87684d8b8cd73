"""Async client of the gbox-mini-agent run API (docs/protocols.md §2.1).

Why polling: the service does not stream; the original polled ``events?from=<last ts>`` every 3 s and
de-duplicated. Reads (status, events, steps) and cancel are retried with backoff; starting a run is
sent once (a retry could start two agents on one execution). ``wait`` never raises for run failures:
it returns a ``RunResult`` with the reason, keeping every event seen, and cancels the run on timeout.
A reply is read up to ``MAX_REPLY_BYTES``, asked for uncompressed and refused undecoded when it comes
compressed all the same (``http.retry._bounded``: a few hundred bytes of stacked gzip decode to gigabytes).
Every request carries the service's bearer token when there is one (``token``, else ``CUA_AGENT_TOKEN`` or the file
``CUA_AGENT_TOKEN_FILE`` names: cua_rl/http/auth.py), and every POST says ``Content-Type: application/json``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable
from urllib.parse import quote

import httpx

from ..http.auth import AGENT_TOKEN, bearer, token_from_env
from ..http.client import async_client
from ..http.input import MiB
from ..http.retry import AnswerRefused, RetryPolicy, ask_until_done, error_detail, never_sent, send_with_retry
from ..wire.agent import RunRequest
from .events import EventLog, answer_of_action
from .models import TERMINAL_STATUSES, RunResult, RunStatus
from .states import RunState

logger = logging.getLogger(__name__)

# The most of one reply read: a poll of events may carry several model answers (the agent keeps each up to
# 8 MiB, AgentSettings.max_answer_bytes), a real one is well under 1 MiB.
MAX_REPLY_BYTES = 256 * MiB


class MiniAgentError(Exception):
    """An agent-service call failed; ``detail`` is the server's message, ``status_code`` None if no reply."""

    def __init__(self, detail: str, status_code: int | None = None) -> None:
        self.detail, self.status_code = detail, status_code
        super().__init__(f"HTTP {status_code}: {detail}" if status_code is not None else detail)


def _unwrap_list(body: Any, key: str) -> list:
    items = body.get(key) if isinstance(body, dict) else body
    if not isinstance(items, list):
        raise MiniAgentError(f"expected a list or {{{key!r}: [...]}}, got {str(body)[:200]}")
    return items


class MiniAgentClient:
    """``async with MiniAgentClient(url) as agent: result = await agent.run(request, timeout_s=600)``. ``token``:
    the service's bearer token (None: ``CUA_AGENT_TOKEN`` / ``CUA_AGENT_TOKEN_FILE``; "": none)."""

    def __init__(self, base_url: str, *, timeout_s: float = 30.0, retry: RetryPolicy | None = None,
                 transport: httpx.AsyncBaseTransport | None = None, token: str | None = None) -> None:
        if not base_url:
            raise ValueError("MiniAgentClient needs a base URL")
        self.base_url = base_url.rstrip("/")
        self.retry = retry or RetryPolicy(attempts=5, backoff_s=0.5, max_backoff_s=4.0)
        self._http = async_client(timeout=timeout_s, transport=transport,
                                  headers=bearer(token_from_env(AGENT_TOKEN) if token is None else token))

    async def __aenter__(self) -> "MiniAgentClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, *, idempotent: bool, none_on_404: bool = False,
                    **kwargs) -> Any:
        url = f"{self.base_url}{path}"
        try:
            response = await send_with_retry(self._http, method, url, policy=self.retry if idempotent else None,
                                             what=f"mini-agent {method} {path}", max_bytes=MAX_REPLY_BYTES, **kwargs)
        except AnswerRefused as exc:
            raise MiniAgentError(f"reply to {method} {path} refused: {exc}") from None
        except httpx.TransportError as exc:
            raise MiniAgentError(f"cannot reach agent service at {url}: {type(exc).__name__}: {exc}") from exc
        if response.status_code == 404 and none_on_404:
            return None
        if response.status_code >= 400:
            raise MiniAgentError(error_detail(response), response.status_code)
        try:
            return response.json() if response.content else {}
        except ValueError as exc:
            raise MiniAgentError(f"reply to {method} {path} is not JSON: {response.text[:200]!r}") from exc

    @staticmethod
    def _run_path(run_id: str, *rest: str) -> str:
        return "/runs/" + "/".join([quote(run_id, safe="")] + list(rest))

    async def start_run(self, request: RunRequest, unreachable_wait_s: float = 0.0) -> str:
        """``POST /runs``; returns the ``runId``. Sent once, except when it never reached the service (down or
        restarting: nothing started), which is asked again for at most ``unreachable_wait_s`` seconds."""
        logger.debug("starting agent run: %s", request.redacted())
        try:
            body = await ask_until_done(
                lambda: self._call("POST", "/runs", idempotent=False, json=request.to_payload()),
                nothing_done=never_sent, budget_s=unreachable_wait_s,
                what=f"starting an agent run on execution {request.env.execution_id}")
        except MiniAgentError as exc:  # a 422 may echo the body back, api keys included
            secrets = (request.model.api_key, request.start_from and request.start_from.api_key)
            keys = [k.get_secret_value() for k in secrets if k and k.get_secret_value()]
            if any(k in exc.detail for k in keys):
                detail = exc.detail
                for key in keys:
                    detail = detail.replace(key, "***")
                raise MiniAgentError(detail, exc.status_code) from None
            raise
        run_id = body.get("runId") if isinstance(body, dict) else None
        if not isinstance(run_id, str) or not run_id:
            raise MiniAgentError(f"start-run reply has no runId: {str(body)[:200]}")
        logger.info("agent run %s started (agent=%s, execution=%s)", run_id, request.agent,
                    request.env.execution_id)
        return run_id

    async def features(self) -> list[str]:
        """What the service does beyond gbox-mini-agent's protocol (``GET /health``'s ``features``; our agent
        service lists ``startFrom``); empty when it says nothing (a stock gbox-mini-agent)."""
        body = await self._call("GET", "/health", idempotent=True, none_on_404=True)
        found = body.get("features") if isinstance(body, dict) else None
        return [str(f) for f in found] if isinstance(found, list) else []

    async def status(self, run_id: str) -> RunStatus:
        body = await self._call("GET", self._run_path(run_id), idempotent=True)
        if not isinstance(body, dict) or not isinstance(body.get("status"), str):
            raise MiniAgentError(f"run status reply has no status: {str(body)[:200]}")
        reason = body.get("reason")
        return RunStatus(status=body["status"].lower(), reason=None if reason is None else str(reason), raw=body)

    async def events(self, run_id: str, from_ts: str | None = None) -> list[dict]:
        """Raw events (``from`` is inclusive); a 404 means none yet. Normalise them with ``EventLog``."""
        params = {"from": from_ts} if from_ts is not None else None
        body = await self._call("GET", self._run_path(run_id, "events"), idempotent=True, none_on_404=True,
                                params=params)
        return [] if body is None else _unwrap_list(body, "events")

    async def steps(self, run_id: str) -> list[dict]:
        """Step objects (``messages``, ``actions``, ``thinking``, ``text``); a 404 means none."""
        body = await self._call("GET", self._run_path(run_id, "steps"), idempotent=True, none_on_404=True)
        return [] if body is None else _unwrap_list(body, "steps")

    async def cancel(self, run_id: str) -> None:
        """``POST /runs/{id}/cancel``; cancelling twice is harmless, so it is retried. 404 = already gone."""
        body = await self._call("POST", self._run_path(run_id, "cancel"), idempotent=True, none_on_404=True,
                                json={})
        logger.info("agent run %s cancel requested (%s)", run_id, "unknown run" if body is None else "ok")

    async def _safe_cancel(self, run_id: str, errors: list[str]) -> None:
        try:
            await asyncio.shield(self.cancel(run_id))
        except (MiniAgentError, asyncio.CancelledError) as exc:
            errors.append(f"cancel failed: {exc}")
            logger.error("could not cancel agent run %s: %s", run_id, exc)

    async def wait(self, run_id: str, timeout_s: float, poll_interval_s: float = 3.0, *,
                   cancel_on_timeout: bool = True) -> RunResult:
        """Poll until ``run_end`` or a terminal status, at most ``timeout_s``; then fetch the steps."""
        log, errors = EventLog(), []
        final: dict[str, Any] = {"status": None, "reason": None, "ok": False, "timed_out": False, "answer": None,
                                 "service_failed": False, "failure": None}

        async def poll() -> None:
            while True:
                log.add(await self.events(run_id, from_ts=log.last_ts))
                if log.run_end() is not None:
                    return
                status = await self.status(run_id)
                final["status"], final["reason"] = status.status, status.reason
                if isinstance(status.raw.get("answer"), str) and status.raw["answer"].strip():
                    final["answer"] = status.raw["answer"]
                if status.terminal:
                    log.add(await self.events(run_id, from_ts=log.last_ts))
                    return
                await asyncio.sleep(poll_interval_s)

        try:
            await asyncio.wait_for(poll(), timeout_s)
        except asyncio.TimeoutError:
            final["timed_out"], final["reason"] = True, f"timeout after {timeout_s:g}s"
            logger.warning("agent run %s timed out after %gs", run_id, timeout_s)
            if cancel_on_timeout:
                await self._safe_cancel(run_id, errors)
        except MiniAgentError as exc:
            final["reason"], final["service_failed"] = f"agent service error: {exc}", True
            logger.error("polling agent run %s failed: %s", run_id, exc)
            await self._safe_cancel(run_id, errors)
        else:
            end = log.run_end()
            if end is not None:
                final["ok"] = bool(end.data.get("ok"))
                final["reason"] = end.data.get("reason", final["reason"])
                if isinstance(end.data.get("failure"), str):
                    final["failure"] = end.data["failure"]
                if final["status"] not in TERMINAL_STATUSES:  # run_end can arrive before status flips
                    final["status"] = RunState.COMPLETED if final["ok"] else RunState.FAILED
            else:
                final["ok"] = final["status"] == RunState.COMPLETED
        try:
            steps = await self.steps(run_id)
        except MiniAgentError as exc:
            steps = []
            errors.append(f"steps unavailable: {exc}")
        answer = log.answer() or final["answer"]
        if answer is None:  # older servers: the answer only shows in the step objects
            for step in (s for s in steps if isinstance(s, dict)):
                for action in step.get("actions") or []:
                    answer = answer_of_action(action) or answer
        result = RunResult(ok=final["ok"], reason=None if final["reason"] is None else str(final["reason"]),
                           answer=answer, steps=steps, events=log.events(), model_outputs=log.model_outputs(),
                           num_steps=max(log.num_steps(), len(steps)), run_id=run_id, status=final["status"],
                           timed_out=final["timed_out"], errors=log.errors() + errors,
                           service_failed=final["service_failed"], failure=final["failure"])
        logger.info("agent run %s ended: ok=%s reason=%s steps=%d", run_id, result.ok, result.reason,
                    result.num_steps)
        return result

    async def run(self, request: RunRequest, timeout_s: float, poll_interval_s: float = 3.0,
                  unreachable_wait_s: float = 0.0, on_started: Callable[[str], None] | None = None) -> RunResult:
        """Start (see ``start_run``), wait, cancel on timeout. If the caller is cancelled, the remote run is
        cancelled too. ``on_started(run_id)``: told the run's id once it runs (a tree group's continuations
        start from it)."""
        run_id = await self.start_run(request, unreachable_wait_s)
        if on_started is not None:
            on_started(run_id)
        try:
            return await self.wait(run_id, timeout_s, poll_interval_s)
        except asyncio.CancelledError:
            await self._safe_cancel(run_id, [])
            raise
