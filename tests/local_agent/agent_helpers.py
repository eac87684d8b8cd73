"""Helpers of the agent-service tests (a module of its own: test files must not import ``conftest``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, AsyncIterator

import httpx

from cua_rl.genv import GenvClient
from cua_rl.http.retry import RetryPolicy
from cua_rl.local_agent import AgentSettings
from cua_rl.mini_agent import GenvEnv, ModelEndpoint, RunRequest


def fast_settings(**overrides: Any) -> AgentSettings:
    """Service defaults with short backoffs so retry paths take milliseconds, not seconds."""
    base = dict(model_retry=RetryPolicy(attempts=3, backoff_s=0.05), gym_retry=RetryPolicy(attempts=3, backoff_s=0.05))
    base.update(overrides)
    return AgentSettings(**base)


@contextlib.asynccontextmanager
async def gym_execution(gym: Any, task_id: str) -> AsyncIterator[tuple[GenvClient, str]]:
    """A fresh execution of ``task_id``, always terminated."""
    async with GenvClient(gym.url, gym.gym_id) as client:
        async with client.execution(task_id) as execution:
            yield client, execution.execution_id


def run_request(gym: Any, execution_id: str, base_url: str, key: str, *, agent: str = "qwen3-vl",
                space: str = "pc", max_steps: int = 10, task: str = "do the task", **kw: Any) -> RunRequest:
    return RunRequest(task=task, model=ModelEndpoint(base_url=base_url, name="", api_key=key),
                      env=GenvEnv(gym_base_url=gym.url, gym_id=gym.gym_id, execution_id=execution_id), agent=agent, max_steps=max_steps,
                      standard_action_space=space, **kw)


async def wait_finished(http: httpx.AsyncClient, run_id: str, timeout_s: float = 30) -> dict:
    """``GET /runs/{run_id}`` (on ``http``'s base URL) once the run is no longer running."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = (await http.get(f"/runs/{run_id}")).json()
        if status["status"] != "running":
            return status
        await asyncio.sleep(0.05)
    raise AssertionError(f"run {run_id} still running after {timeout_s}s")
