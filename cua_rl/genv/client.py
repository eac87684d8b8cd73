"""Async client of the genv gym server: the endpoints of docs/protocols.md §1.1, the execution-control ones
(state, screenshot, actions) included.

Why these retry rules: list/get/status/screenshot are reads and are retried on transport errors and
5xx with exponential backoff; create, evaluate and act change server state (a retried create can leak a
second desktop, a retried act clicks twice) and are sent exactly once, except a create that a gym at capacity
refused (429/503) or that never reached the gym (down or restarting): nothing was created, so it waits and asks
again when the caller allows (``busy_wait_s``). Terminate is retried too: ending an execution twice is
harmless, and a lost terminate leaks a desktop. Every failure is a ``GenvError`` carrying the server's
``detail``.

Why bounded: a gym on the network is not ours to trust (the trainer and the agent service both read it through
this client). A reply is read up to ``MAX_REPLY_BYTES`` (a full-HD screenshot is a few MiB), asked for
uncompressed and refused undecoded when it comes compressed all the same (``http.retry._bounded``: 589 bytes
of stacked gzip decode to 596 MB at once).
Every request carries the gym's bearer token when there is one (``token``, else ``CUA_GYM_TOKEN`` or the file
``CUA_GYM_TOKEN_FILE`` names: cua_rl/http/auth.py), and every POST says ``Content-Type: application/json``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable
from urllib.parse import quote

import httpx

from ..http.auth import GYM_TOKEN, bearer, token_from_env
from ..http.client import async_client
from ..http.input import MiB
from ..http.retry import AnswerRefused, RetryPolicy, ask_until_done, error_detail, never_sent, send_with_retry
from .errors import GenvError
from .models import Execution, Fork, Task
from .reward import Evaluation

logger = logging.getLogger(__name__)

MAX_REPLY_BYTES = 64 * MiB   # the most of one gym reply read (a 4K PNG screenshot of noise is ~25 MiB)


@dataclass(frozen=True)
class GenvTimeouts:
    """Seconds per kind of call. Creating a desktop/device and evaluating can be slow on real gyms."""

    connect: float = 10.0
    read: float = 60.0          # list / get / status / screenshot / terminate
    create: float = 600.0
    evaluate: float = 600.0
    act: float = 120.0


class GenvClient:
    """``async with GenvClient(base_url, gym_id) as gym: tasks = await gym.list_tasks()``. ``token``: the gym's
    bearer token (None: ``CUA_GYM_TOKEN`` / ``CUA_GYM_TOKEN_FILE``; "": none)."""

    def __init__(self, base_url: str, gym_id: str, *, timeouts: GenvTimeouts | None = None,
                 retry: RetryPolicy | None = None, transport: httpx.AsyncBaseTransport | None = None,
                 max_reply_bytes: int = MAX_REPLY_BYTES, token: str | None = None) -> None:
        if not base_url:
            raise ValueError("GenvClient needs a gym base URL")
        if not gym_id:
            raise ValueError("GenvClient needs a gym id")
        self.base_url = base_url.rstrip("/")
        self.gym_id = gym_id
        self.timeouts = timeouts or GenvTimeouts()
        self.retry = retry or RetryPolicy()
        self.max_reply_bytes = max_reply_bytes
        t = self.timeouts
        self._http = async_client(
            timeout=httpx.Timeout(t.read, connect=t.connect), transport=transport,
            headers=bearer(token_from_env(GYM_TOKEN) if token is None else token))

    async def __aenter__(self) -> "GenvClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- plumbing -----------------------------------------------------------------------------------
    def _url(self, *parts: str) -> str:
        return "/".join([self.base_url, "api/v1", quote(self.gym_id, safe="")] + [quote(p, safe="") for p in parts])

    async def _request(self, method: str, url: str, *, idempotent: bool, timeout: float | None = None,
                       **kwargs) -> httpx.Response:
        if timeout is not None:
            kwargs["timeout"] = httpx.Timeout(timeout, connect=self.timeouts.connect)
        what = f"genv {method} {url}"
        try:
            response = await send_with_retry(self._http, method, url, policy=self.retry if idempotent else None,
                                             what=what, max_bytes=self.max_reply_bytes, **kwargs)
        except AnswerRefused as exc:
            raise GenvError(f"reply refused: {exc}", url=url) from None
        except httpx.TimeoutException as exc:
            raise GenvError(f"timed out ({type(exc).__name__})", url=url) from exc
        except httpx.TransportError as exc:
            raise GenvError(f"cannot reach gym: {type(exc).__name__}: {exc}", url=url) from exc
        if response.status_code >= 400:
            raise GenvError(error_detail(response), response.status_code, url=url)
        return response

    async def _json(self, method: str, url: str, *, idempotent: bool, **kwargs) -> Any:
        response = await self._request(method, url, idempotent=idempotent, **kwargs)
        if not response.content:
            return {}
        try:
            return response.json()
        except ValueError as exc:
            raise GenvError(f"reply is not JSON: {response.text[:200]!r}", response.status_code, url=url) from exc

    # -- tasks --------------------------------------------------------------------------------------
    async def list_tasks(self) -> list[Task]:
        """All tasks of the gym; accepts ``{"tasks": [...]}`` or a bare list."""
        body = await self._json("GET", self._url("tasks"), idempotent=True)
        items = body.get("tasks") if isinstance(body, dict) else body
        if not isinstance(items, list):
            raise GenvError(f"task list reply has no list of tasks: {str(body)[:200]}", url=self._url("tasks"))
        return [Task.from_raw(item) for item in items]

    async def get_task(self, task_id: str) -> Task:
        """One full task (``{"task": {...}}`` is unwrapped)."""
        body = await self._json("GET", self._url("tasks", task_id), idempotent=True)
        if isinstance(body, dict) and isinstance(body.get("task"), dict):
            body = body["task"]
        return Task.from_raw(body)

    # -- executions ---------------------------------------------------------------------------------
    async def create_execution(self, task_id: str, options: dict | None = None, *,
                               busy_wait_s: float = 0.0, on_busy: Callable[[GenvError], None] | None = None
                               ) -> Execution:
        """Start an execution (a fresh desktop/device). Not retried on transport errors or 5xx: a retry could
        leak a second one. The exceptions create nothing: a gym at capacity (429/503) and a gym that could not
        be reached at all (down or restarting); those are asked again, waiting 2 s doubling to 30 s, for at
        most ``busy_wait_s`` seconds in all (0: raise at once). ``max_concurrent_rollouts`` x group size
        executions may well exceed a gym's capacity. ``on_busy(error)`` hears of each 429 (a fleet then places the
        next groups elsewhere: cua_rl/genv/fleet.py)."""
        payload = {"options": options} if options else {}
        body = await ask_until_done(
            lambda: self._json("POST", self._url("tasks", task_id), idempotent=False, json=payload,
                               timeout=self.timeouts.create),
            nothing_done=lambda exc: isinstance(exc, GenvError)
            and (exc.status_code in (429, 503) or never_sent(exc)),
            budget_s=busy_wait_s, what=f"creating an execution of task {task_id}",
            on_wait=None if on_busy is None else
            lambda exc: on_busy(exc) if getattr(exc, "status_code", None) == 429 else None)
        execution = Execution.from_raw(body)
        logger.info("created execution %s of task %s (device %s)", execution.execution_id, task_id,
                    execution.device_id)
        return execution

    async def get_execution(self, execution_id: str) -> dict:
        """``{execution_id, status, task_id, screen: {width, height}}``."""
        return await self._json("GET", self._url("executions", execution_id), idempotent=True)

    async def screenshot(self, execution_id: str, format: str = "png") -> bytes:
        """Image bytes; a JSON ``{"data_uri": "data:image/...;base64,..."}`` reply is decoded too."""
        url = self._url("executions", execution_id, "screenshot")
        response = await self._request("GET", url, idempotent=True, params={"format": format})
        if "application/json" not in response.headers.get("content-type", ""):
            return response.content
        data_uri = str(response.json().get("data_uri", ""))
        if ";base64," not in data_uri:
            raise GenvError("screenshot reply is JSON without a base64 data_uri", response.status_code, url=url)
        return base64.b64decode(data_uri.split(";base64,", 1)[1])

    async def act(self, execution_id: str, action: dict) -> dict:
        """Perform one action (schema: docs/protocols.md §1.6). Sent once; a bad action is a 4xx ``GenvError``."""
        return await self._json("POST", self._url("executions", execution_id, "actions"), idempotent=False,
                                json={"action": action}, timeout=self.timeouts.act)

    async def evaluate(self, execution_id: str, answer_text: str | None = None,
                       execution_data: dict | None = None) -> Evaluation:
        """Score the execution; the agent's answer travels as ``answer_text`` (the original never sent it)."""
        payload: dict[str, Any] = {}
        if answer_text is not None:
            payload["answer_text"] = answer_text
        if execution_data is not None:
            payload["execution_data"] = execution_data
        body = await self._json("POST", self._url("executions", execution_id, "evaluate"), idempotent=False,
                                json=payload, timeout=self.timeouts.evaluate)
        evaluation = Evaluation.from_raw(body)
        logger.info("evaluated execution %s: reward=%.3f (%s) success=%s", execution_id, evaluation.reward,
                    evaluation.source, evaluation.success)
        return evaluation

    async def fork(self, execution_id: str, count: int = 1, *, busy_wait_s: float = 0.0) -> Fork:
        """``count`` new executions in the state ``execution_id`` is in now (our gym's extension,
        docs/protocols.md §1.9); the parent goes on untouched. Sent once, as create is (it makes executions),
        except when the gym answered 429 or 503 or was not reached (nothing was made): asked again within
        ``busy_wait_s``. A 409 (the task is not forkable, or a child did not reach the parent's state) raises
        at once. The caller terminates every child (``Fork.executions``) as it would an execution it created."""
        body = await ask_until_done(
            lambda: self._json("POST", self._url("executions", execution_id, "fork"), idempotent=False,
                               json={"count": count}, timeout=self.timeouts.create),
            nothing_done=lambda exc: isinstance(exc, GenvError)
            and (exc.status_code in (429, 503) or never_sent(exc)),
            budget_s=busy_wait_s, what=f"forking execution {execution_id}")
        fork = Fork.from_raw(body)
        logger.info("forked execution %s into %s", execution_id, ", ".join(c.execution_id for c in fork.executions))
        return fork

    async def terminate(self, execution_id: str) -> dict:
        """Release the execution; retried like a read (see the module docstring). The gym's TTL reaper is
        the last backstop. A 404 (already gone, e.g. after a retry whose first try did land) raises."""
        body = await self._json("POST", self._url("executions", execution_id, "terminate"), idempotent=True, json={})
        logger.info("terminated execution %s", execution_id)
        return body if isinstance(body, dict) else {"value": body}

    @contextlib.asynccontextmanager
    async def execution(self, task_id: str, options: dict | None = None, *, busy_wait_s: float = 0.0,
                        on_busy: Callable[[GenvError], None] | None = None) -> AsyncIterator[Execution]:
        """Create an execution (``create_execution``) and always terminate it, even on error or cancellation.

        A failing terminate is logged, not raised, so it never hides the error of the body.
        """
        execution = await self.create_execution(task_id, options, busy_wait_s=busy_wait_s, on_busy=on_busy)
        try:
            yield execution
        finally:
            try:
                await asyncio.shield(self.terminate(execution.execution_id))
            except (GenvError, asyncio.CancelledError) as exc:
                logger.error("could not terminate execution %s: %s", execution.execution_id, exc)
