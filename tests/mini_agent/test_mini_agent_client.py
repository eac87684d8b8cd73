"""MiniAgentClient against the gbox-mini-agent test double over real loopback HTTP (tests/doubles/agent_double.py)."""

import asyncio
import logging

import pytest

from cua_rl.http.retry import RetryPolicy
from cua_rl.mini_agent import MiniAgentClient, MiniAgentError
from mini_agent_requests import SECRET, make_request
from tests.doubles.agent_double import scripted_events
from tests.doubles.bombs import CODINGS, MAX_GROWTH, MiB, compression_bomb, peak_rss_growth

FAST = RetryPolicy(attempts=3, backoff_s=0.01, max_backoff_s=0.02)
POLL = 0.01


def client_for(server, **kwargs) -> MiniAgentClient:
    return MiniAgentClient(server.url, retry=FAST, **kwargs)


async def test_full_run_new_schema(agent_server, agent_state, caplog):
    caplog.set_level(logging.DEBUG)
    agent_state.script = scripted_events(3, answer="51.54MB")
    agent_state.empty_polls = 2  # 404 "no events yet" before the first event
    async with client_for(agent_server) as agent:
        result = await agent.run(make_request(), timeout_s=20, poll_interval_s=POLL)
    assert result.ok is True and result.reason == "finished" and result.status == "completed"
    assert result.answer == "51.54MB"
    assert result.num_steps == 3
    assert [m.step for m in result.model_outputs] == [1, 2, 3]
    assert len(result.events) == len(agent_state.script)  # every event once, despite inclusive re-polls
    assert result.steps == agent_state.steps
    assert not result.timed_out and agent_state.cancelled == []
    assert result.as_execution_data()["answer"] == "51.54MB"
    # later polls asked for events from the last timestamp seen
    froms = [q.get("from") for m, p, q in agent_state.requests if p.endswith("/events")]
    assert froms[0] is None and any(f is not None for f in froms)
    # the key reached the service but no log line
    assert agent_state.payloads[0]["model"]["apiKey"] == SECRET
    assert "run-1" in caplog.text and SECRET not in caplog.text


async def test_old_schema_bare_list_zero_based(agent_server, agent_state):
    agent_state.script = scripted_events(2, zero_based=True, old_names=True, answer=None, ok=False)
    agent_state.wrap_events = False
    agent_state.final_status = "failed"
    async with client_for(agent_server) as agent:
        result = await agent.run(make_request(), timeout_s=20, poll_interval_s=POLL)
    assert result.ok is False and result.reason == "gave up"
    assert result.answer is None
    assert sorted({e.step for e in result.events if e.step}) == [1, 2]
    assert {e.type for e in result.events} >= {"step_start", "step_end", "run_end"}


async def test_terminal_status_without_run_end(agent_server, agent_state):
    agent_state.script = [e for e in scripted_events(1) if e["type"] != "run_end"]
    agent_state.final_status, agent_state.final_reason = "failed", "model endpoint unreachable"
    agent_state.steps = None  # 404 on steps means no steps
    async with client_for(agent_server) as agent:
        result = await agent.run(make_request(), timeout_s=20, poll_interval_s=POLL)
    assert result.ok is False and result.status == "failed"
    assert result.reason == "model endpoint unreachable"
    assert result.steps == [] and result.num_steps == 1 and result.answer == "done"


async def test_timeout_cancels_run_and_keeps_events(agent_server, agent_state):
    agent_state.endless = True
    agent_state.script = scripted_events(1)[:2]
    agent_state.runs["run-1"] = {"revealed": 2, "cancelled": False, "polls": 0}
    async with client_for(agent_server) as agent:
        result = await agent.wait("run-1", timeout_s=0.3, poll_interval_s=POLL)
    assert result.timed_out and result.ok is False and result.reason.startswith("timeout") and not result.service_failed
    assert agent_state.cancelled == ["run-1"]
    assert [e.type for e in result.events] == ["step_start", "model_call"]


async def test_status_5xx_is_retried(agent_server, agent_state):
    agent_state.fail_next[("GET", "/runs/run-1")] = [503]
    agent_state.reveal_per_poll = 100
    agent_state.script = [e for e in scripted_events(1) if e["type"] != "run_end"]
    async with client_for(agent_server) as agent:
        result = await agent.run(make_request(), timeout_s=20, poll_interval_s=POLL)
    assert result.ok is True and result.status == "completed"
    assert agent_state.fail_next[("GET", "/runs/run-1")] == []


async def test_start_run_not_retried_and_detail_propagates(agent_server, agent_state):
    agent_state.fail_next[("POST", "/runs")] = [500]
    async with client_for(agent_server) as agent:
        with pytest.raises(MiniAgentError) as info:
            await agent.start_run(make_request())
    assert info.value.status_code == 500 and info.value.detail == "injected failure 500"
    assert sum(1 for m, p, _ in agent_state.requests if m == "POST") == 1
    assert agent_state.runs == {}


async def test_persistent_poll_failure_ends_run_cleanly(agent_server, agent_state):
    agent_state.runs["run-1"] = {"revealed": 0, "cancelled": False, "polls": 0}
    agent_state.fail_next[("GET", "/events")] = [500, 500, 500]
    async with client_for(agent_server) as agent:
        result = await agent.wait("run-1", timeout_s=20, poll_interval_s=POLL)
    assert result.ok is False and result.service_failed and "agent service error" in result.reason and "injected failure" in result.reason
    assert agent_state.cancelled == ["run-1"]


async def test_unknown_run_status_is_an_error(agent_server):
    async with client_for(agent_server) as agent:
        with pytest.raises(MiniAgentError) as info:
            await agent.status("nope")
    assert info.value.status_code == 404 and "nope" in info.value.detail


async def test_caller_cancellation_cancels_remote_run(agent_server, agent_state):
    agent_state.endless = True
    async with client_for(agent_server) as agent:
        task = asyncio.create_task(agent.run(make_request(), timeout_s=60, poll_interval_s=POLL))
        while not agent_state.runs:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.2)  # the shielded cancel request completes in the background
    assert agent_state.cancelled == ["run-1"]


async def test_timeout_on_request_is_an_error(agent_server, agent_state):
    agent = MiniAgentClient("http://127.0.0.1:9", retry=FAST, timeout_s=0.5)
    async with agent:
        with pytest.raises(MiniAgentError, match="cannot reach"):
            await agent.status("run-1")


async def test_echoed_api_key_is_scrubbed_from_errors(agent_server, caplog):
    caplog.set_level(logging.DEBUG)
    async with client_for(agent_server) as agent:
        with pytest.raises(MiniAgentError) as info:
            await agent.start_run(make_request(task="echo"))
    assert info.value.status_code == 422 and "***" in info.value.detail
    assert SECRET not in str(info.value) and SECRET not in caplog.text


async def test_answer_from_status_when_events_have_none(agent_server, agent_state):
    agent_state.script = [e for e in scripted_events(1, answer=None) if e["type"] != "run_end"]
    async with client_for(agent_server) as agent:
        first = await agent.run(make_request(), timeout_s=20, poll_interval_s=POLL)
        agent_state.status_answer = "from status"
        second = await agent.run(make_request(), timeout_s=20, poll_interval_s=POLL)
    assert first.ok and first.answer is None  # nothing invented
    assert second.ok and second.answer == "from status"


async def test_a_start_that_never_reached_the_service_waits_for_it_to_come_back(agent_state, monkeypatch):
    """An agent service that is down or restarting started nothing: the start is asked again within
    ``unreachable_wait_s`` and lands once the service listens; without that budget it fails at once."""
    from types import SimpleNamespace

    import cua_rl.http.retry as retry_module
    from cua_rl.http.serve import free_port, serve_app_in_thread
    from tests.doubles.agent_double import build_agent_double

    port, served, slept = free_port(), [], []

    async def service_returns_while_we_sleep(seconds):
        slept.append(seconds)
        if not served:
            served.append(serve_app_in_thread(build_agent_double(agent_state), port=port))
    async with MiniAgentClient(f"http://127.0.0.1:{port}", retry=FAST) as agent:
        with pytest.raises(MiniAgentError, match="cannot reach agent service"):
            await agent.start_run(make_request())
        monkeypatch.setattr(retry_module, "asyncio", SimpleNamespace(sleep=service_returns_while_we_sleep))
        try:
            run_id = await agent.start_run(make_request(), unreachable_wait_s=60)
        finally:
            for s in served:
                s.stop()
    assert slept == [2.0] and list(agent_state.runs) == [run_id]


@pytest.mark.parametrize("coding", CODINGS)
async def test_a_compressed_bomb_from_the_agent_service_is_never_decoded(agent_server, agent_state, coding):
    """Issue 80: a status (or any reply) that comes compressed is refused undecoded: a few kB of stacked gzip or
    zstd decode to hundreds of MB at once in the trainer."""
    agent_state.runs["run-1"] = {"revealed": 0, "cancelled": False, "polls": 0}
    agent_state.encoded_next[("GET", "/runs/run-1")] = [(compression_bomb(coding), coding)] * 5   # retries too
    async with client_for(agent_server) as agent:
        with peak_rss_growth() as grown, pytest.raises(MiniAgentError) as failed:
            await agent.status("run-1")
    print(f"{coding}: peak RSS +{grown['bytes'] / MiB:.1f} MiB; {failed.value}")
    assert grown["bytes"] < MAX_GROWTH, f"peak RSS rose {grown['bytes'] / MiB:.0f} MiB: the bomb was decoded"
    assert f"Content-Encoding: {coding}" in str(failed.value), failed.value
