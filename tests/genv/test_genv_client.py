"""GenvClient against the genv test double over real loopback HTTP (see tests/doubles/genv_double.py)."""

import json

import pytest

from cua_rl.genv import GenvClient, GenvError, GenvTimeouts
from cua_rl.http.retry import RetryPolicy
from tests.doubles.bombs import CODINGS, MAX_GROWTH, MiB, compression_bomb, peak_rss_growth
from tests.doubles.genv_double import PNG_1x1

FAST_RETRY = RetryPolicy(attempts=3, backoff_s=0.01, max_backoff_s=0.02)


def client_for(server, **kwargs) -> GenvClient:
    return GenvClient(server.url, "my gym", retry=FAST_RETRY, **kwargs)


async def test_list_and_get_tasks(gym_server, gym_state):
    async with client_for(gym_server) as gym:
        tasks = await gym.list_tasks()
        assert [t.id for t in tasks] == ["task-001", "6f1c2d3e-0000-4000-8000-00000000abcd"]
        assert [t.number for t in tasks] == [1, 12]
        assert [t.difficulty for t in tasks] == ["easy", "hard"]
        full = await gym.get_task("task-001")
        assert full.env == {"app": "settings"}
    # the gym id is URL-quoted as one path segment
    assert gym_state.requests[0][1] == "/api/v1/my gym/tasks"


async def test_bare_list_of_tasks(gym_server, gym_state):
    gym_state.tasks = [{"task_id": "a"}, {"task_id": "b", "tags": ["normal"]}]
    async with client_for(gym_server) as gym:
        tasks = await gym.list_tasks()
    assert [(t.id, t.difficulty) for t in tasks] == [("a", None), ("b", "normal")]


async def test_execution_lifecycle_and_answer_text(gym_server, gym_state):
    gym_state.evaluation_reply = {"success": True, "result": {"score": 0.0, "validators": []}}
    async with client_for(gym_server) as gym:
        ex = await gym.create_execution("task-001", options={"seed": 3})
        assert ex.execution_id == "exec-1" and ex.device_id == "emulator-5554"
        info = await gym.get_execution(ex.execution_id)
        assert info["screen"] == {"width": 1280, "height": 800}
        assert await gym.screenshot(ex.execution_id, format="png") == PNG_1x1
        assert (await gym.act(ex.execution_id, {"type": "click", "x": 0.5, "y": 0.5}))["ok"] is True
        ev = await gym.evaluate(ex.execution_id, answer_text="42", execution_data={"answer": "42"})
        assert ev.reward == 0.0 and ev.success is True  # a real 0 is not turned into 1.0
        assert await gym.terminate(ex.execution_id) == {"ok": True}
    bodies = {(m, p): b for m, p, _, b in gym_state.requests}
    assert json.loads(bodies[("POST", "/api/v1/my gym/tasks/task-001")]) == {"options": {"seed": 3}}
    sent = json.loads(bodies[("POST", "/api/v1/my gym/executions/exec-1/evaluate")])
    assert sent == {"answer_text": "42", "execution_data": {"answer": "42"}}
    assert gym_state.terminated == ["exec-1"]


async def test_get_retries_5xx_then_succeeds(gym_server, gym_state, caplog):
    gym_state.fail_next[("GET", "/tasks")] = [503, 500]
    async with client_for(gym_server) as gym:
        tasks = await gym.list_tasks()
    assert len(tasks) == 2
    assert sum(1 for m, p, *_ in gym_state.requests if p.endswith("/tasks")) == 3
    assert "retry 1/2" in caplog.text and "retry 2/2" in caplog.text


async def test_get_gives_up_after_bounded_retries(gym_server, gym_state):
    gym_state.fail_next[("GET", "/tasks")] = [502, 502, 502, 502]
    async with client_for(gym_server) as gym:
        with pytest.raises(GenvError) as info:
            await gym.list_tasks()
    assert info.value.status_code == 502
    assert info.value.detail == "injected failure 502"
    assert gym_state.fail_next[("GET", "/tasks")] == [502]  # exactly 3 attempts used


async def test_create_is_never_retried(gym_server, gym_state):
    gym_state.fail_next[("POST", "/tasks/task-001")] = [503]
    async with client_for(gym_server) as gym:
        with pytest.raises(GenvError) as info:
            await gym.create_execution("task-001")
    assert info.value.status_code == 503
    assert sum(1 for m, p, *_ in gym_state.requests if m == "POST") == 1
    assert gym_state.executions == {}


async def test_a_gym_at_capacity_is_asked_again_within_busy_wait_only(gym_server, gym_state, monkeypatch):
    """429/503 created nothing: asked again with back-off while busy_wait_s allows; a 500 is never retried."""
    from types import SimpleNamespace

    import cua_rl.http.retry as retry_module

    slept = []

    async def no_sleep(seconds):
        slept.append(seconds)
    # only the back-off of our retry module: patching asyncio.sleep itself also turned the gym double's
    # server thread into a busy loop holding the GIL, and the test hung now and then
    monkeypatch.setattr(retry_module, "asyncio", SimpleNamespace(sleep=no_sleep))
    gym_state.fail_next[("POST", "/tasks/task-001")] = [429, 503]
    async with client_for(gym_server) as gym:
        execution = await gym.create_execution("task-001", busy_wait_s=60)
        assert execution.execution_id in gym_state.executions and slept == [2.0, 4.0]
        gym_state.fail_next[("POST", "/tasks/task-001")] = [500]
        with pytest.raises(GenvError) as info:
            await gym.create_execution("task-001", busy_wait_s=60)
        assert info.value.status_code == 500 and slept == [2.0, 4.0]
    assert sum(1 for m, p, *_ in gym_state.requests if m == "POST") == 4


async def test_error_detail_propagates(gym_server):
    async with client_for(gym_server) as gym:
        with pytest.raises(GenvError) as info:
            await gym.get_task("missing")
        assert info.value.status_code == 404 and info.value.detail == "task missing not found"
        with pytest.raises(GenvError) as info:
            await gym.act("exec-x", {"type": "teleport"})
        assert info.value.status_code == 422 and "teleport" in info.value.detail


async def test_malformed_create_reply_is_a_clear_error(gym_server, gym_state):
    gym_state.create_reply = {"execution_id": 17}
    async with client_for(gym_server) as gym:
        with pytest.raises(GenvError, match="execution_id"):
            await gym.create_execution("task-001")


async def test_timeout_is_a_genv_error(gym_server, gym_state):
    gym_state.delay_s[("POST", "/evaluate")] = 1.5
    async with client_for(gym_server, timeouts=GenvTimeouts(evaluate=0.3)) as gym:
        with pytest.raises(GenvError, match="timed out") as info:
            await gym.evaluate("exec-1")
    assert info.value.status_code is None
    assert sum(1 for m, p, *_ in gym_state.requests if p.endswith("/evaluate")) == 1


async def test_connection_refused_is_retried_then_raised():
    gym = GenvClient("http://127.0.0.1:9", "g", retry=FAST_RETRY)
    async with gym:
        with pytest.raises(GenvError, match="cannot reach gym"):
            await gym.list_tasks()


async def test_execution_context_always_terminates(gym_server, gym_state):
    async with client_for(gym_server) as gym:
        with pytest.raises(RuntimeError):
            async with gym.execution("task-001") as ex:
                raise RuntimeError(f"agent crashed on {ex.execution_id}")
    assert gym_state.terminated == ["exec-1"]


async def test_terminate_is_retried_because_leaks_are_worse(gym_server, gym_state):
    gym_state.fail_next[("POST", "/terminate")] = [502]
    async with client_for(gym_server) as gym:
        async with gym.execution("task-001"):
            pass
    assert gym_state.terminated == ["exec-1"]
    assert sum(1 for m, p, *_ in gym_state.requests if p.endswith("/terminate")) == 2


async def test_failed_terminate_is_logged_not_raised(gym_server, gym_state, caplog):
    gym_state.fail_next[("POST", "/terminate")] = [500, 500, 500]
    async with client_for(gym_server) as gym:
        async with gym.execution("task-001") as ex:
            pass
    assert gym_state.terminated == []
    assert f"could not terminate execution {ex.execution_id}" in caplog.text


async def test_screenshot_data_uri_reply_is_decoded(gym_server, gym_state):
    gym_state.screenshot_as_data_uri = True
    async with client_for(gym_server) as gym:
        assert await gym.screenshot("exec-1") == PNG_1x1


async def test_a_create_that_never_reached_the_gym_waits_for_it_to_come_back(gym_state, monkeypatch):
    """A gym that is down or restarting received nothing, so the create is asked again (within busy_wait_s)
    and lands once the gym listens; with no gym at all it gives up when the budget is spent."""
    from types import SimpleNamespace

    import cua_rl.http.retry as retry_module
    from cua_rl.http.retry import never_sent
    from cua_rl.http.serve import free_port, serve_app_in_thread
    from tests.doubles.genv_double import build_gym_double

    port, served, slept = free_port(), [], []

    async def gym_returns_while_we_sleep(seconds):
        slept.append(seconds)
        if not served:
            served.append(serve_app_in_thread(build_gym_double(gym_state), port=port))
    monkeypatch.setattr(retry_module, "asyncio", SimpleNamespace(sleep=gym_returns_while_we_sleep))
    try:
        async with GenvClient(f"http://127.0.0.1:{port}", "my gym", retry=FAST_RETRY) as gym:
            execution = await gym.create_execution("task-001", busy_wait_s=60)
        assert slept == [2.0] and list(gym_state.executions) == [execution.execution_id]
        assert sum(1 for m, *_ in gym_state.requests if m == "POST") == 1
    finally:
        for s in served:
            s.stop()
    slept.clear()
    served.append("no gym this time")   # nobody starts one now
    async with GenvClient(f"http://127.0.0.1:{free_port()}", "my gym", retry=FAST_RETRY) as gym:
        with pytest.raises(GenvError) as info:
            await gym.create_execution("task-001", busy_wait_s=5)
        assert never_sent(info.value) and slept == [2.0, 4.0]
        with pytest.raises(GenvError):
            await gym.create_execution("task-001")   # no budget: at once
        assert slept == [2.0, 4.0]


@pytest.mark.parametrize("coding", CODINGS)
async def test_a_compressed_bomb_from_the_gym_is_never_decoded(gym_server, gym_state, coding):
    """Issue 80: a gym on the network may answer anything. A reply that comes compressed is refused undecoded:
    a few kB of stacked gzip or zstd decode to hundreds of MB at once (the agent service and the trainer both
    read the gym through this client)."""
    gym_state.encoded_next[("GET", "/executions/exec-1")] = [(compression_bomb(coding), coding)] * 3   # retries
    async with client_for(gym_server) as gym:
        with peak_rss_growth() as grown, pytest.raises(GenvError) as failed:
            await gym.get_execution("exec-1")
    print(f"{coding}: peak RSS +{grown['bytes'] / MiB:.1f} MiB; {failed.value}")
    assert grown["bytes"] < MAX_GROWTH, f"peak RSS rose {grown['bytes'] / MiB:.0f} MiB: the bomb was decoded"
    assert f"Content-Encoding: {coding}" in str(failed.value), failed.value
