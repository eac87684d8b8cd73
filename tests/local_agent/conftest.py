"""Fixtures of the agent-service tests: the real agent service and the real embedded gym on loopback,
plus the scripted model server (a documented test double for the policy, see ``model_double.py``)."""

from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator

import pytest

from cua_rl.asgi_thread import serve_app_in_thread
from cua_rl.genv import GenvClient
from cua_rl.http_retry import RetryPolicy
from cua_rl.local_agent import AgentSettings, start_agent_server
from cua_rl.mini_agent.models import GenvEnv, ModelEndpoint, RunRequest
from model_double import ScriptedModel, build_model_app


def fast_settings(**overrides: Any) -> AgentSettings:
    """Service defaults with short backoffs so retry paths take milliseconds, not seconds."""
    base = dict(model_retry=RetryPolicy(attempts=3, backoff_s=0.05), gym_retry=RetryPolicy(attempts=3, backoff_s=0.05))
    base.update(overrides)
    return AgentSettings(**base)


@pytest.fixture
def model() -> Any:
    """(ScriptedModel, base URL ending in /v1) on a real loopback port."""
    scripted = ScriptedModel()
    served = serve_app_in_thread(build_model_app(scripted))
    yield scripted, served.url + "/v1"
    served.stop()


@pytest.fixture
def agent() -> Any:
    handle = start_agent_server(settings=fast_settings())
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def gym() -> Any:
    """The real embedded gym (Xvfb desktops); one per test module to amortise start-up."""
    from cua_rl.local_gym import start_gym_server

    # Own display range: other gyms on a shared host (launcher runs, other suites) hold the default :300+.
    with start_gym_server(port=0, max_executions=6, display_base=700) as server:
        yield server


@contextlib.asynccontextmanager
async def gym_execution(gym: Any, task_id: str) -> AsyncIterator[tuple[GenvClient, str]]:
    """A fresh execution of ``task_id``, always terminated."""
    async with GenvClient(gym.url, gym.gym_id) as client:
        async with client.execution(task_id) as execution:
            yield client, execution.execution_id


def run_request(gym: Any, execution_id: str, base_url: str, key: str, *, agent: str = "qwen3-vl",
                space: str = "pc", max_steps: int = 10, task: str = "do the task", **kw: Any) -> RunRequest:
    return RunRequest(task=task, model=ModelEndpoint(base_url=base_url, name="", api_key=key),
                      env=GenvEnv(gym.url, gym.gym_id, execution_id), agent=agent, max_steps=max_steps,
                      standard_action_space=space, **kw)
