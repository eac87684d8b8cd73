"""The embedded stack's gym and agent service serve only this run (issue 80): ``launch._start_embedded`` gives each a
fresh random token, hands both to the trainer's clients through the environment it starts the trainer with (never an
override: overrides land in argv and in the saved config.yaml), and gives the agent service the gym's token, so its
runs drive the gym while a stranger on the same address gets 401 from both."""

from __future__ import annotations

import asyncio
import contextlib
import time
from types import SimpleNamespace

import httpx
import pytest

from cua_rl.genv import GenvClient
from cua_rl.mini_agent import GenvEnv, MiniAgentClient, ModelEndpoint, RunRequest
from cua_rl.run import launch

pytestmark = pytest.mark.desktop


def embedded_config() -> SimpleNamespace:
    """What ``_start_embedded`` reads of a loaded config: the desktop gym, no desktop kept ready."""
    embedded = SimpleNamespace(host="127.0.0.1", gym_port=0, agent_port=0, tasks_dir="", num_desktops=0,
                               reuse_browsers=None, restart_in_page=None, fault_rate=0.0)
    return SimpleNamespace(embedded=embedded, embedded_gym_id="desktop", custom_tasks=lambda: [])


async def test_the_embedded_gym_and_agent_serve_only_the_runs_own_clients():
    env: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        overrides = launch._start_embedded(embedded_config(), stack, env)
        urls = dict(o.split("=", 1) for o in overrides)
        gym_url, agent_url = urls["gym_base_url"], urls["gbox_mini_agent_base_url"]
        gym_token, agent_token = env["CUA_GYM_TOKEN"], env["CUA_AGENT_TOKEN"]
        assert len(gym_token) >= 40 and len(agent_token) >= 40 and gym_token != agent_token
        assert not any(t in " ".join(overrides) for t in (gym_token, agent_token))   # no token in argv
        async with httpx.AsyncClient(timeout=30) as stranger:
            assert (await stranger.get(f"{gym_url}/api/v1/desktop/tasks")).status_code == 401
            assert (await stranger.post(f"{gym_url}/api/v1/desktop/tasks/001", json={})).status_code == 401
            assert (await stranger.get(f"{agent_url}/runs")).status_code == 401
            assert (await stranger.get(f"{gym_url}/health")).status_code == 200
        async with GenvClient(gym_url, "desktop", token=gym_token) as gym:
            assert len(await gym.list_tasks()) >= 40
        # the agent service drives the gym with its token: a run on an execution the gym does not have fails with
        # the gym's 404, not its 401
        request = RunRequest(task="t", model=ModelEndpoint(base_url="http://127.0.0.1:9/v1", name="m", api_key="k"),
                             env=GenvEnv(gym_base_url=gym_url, gym_id="desktop", execution_id="no-such-execution"), agent="qwen3-vl", max_steps=2,
                             standard_action_space="pc")
        async with MiniAgentClient(agent_url, token=agent_token) as agent:
            run_id = await agent.start_run(request)
            deadline = time.monotonic() + 30
            while (status := await agent.status(run_id)).status == "running":
                assert time.monotonic() < deadline, "the run did not end"
                await asyncio.sleep(0.05)
        assert status.status == "failed" and "404" in status.reason and "401" not in status.reason, status.reason
