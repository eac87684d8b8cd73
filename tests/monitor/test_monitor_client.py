"""MonitorClient against the Training Monitor test double over real loopback HTTP (tests/doubles/monitor_double.py)."""

import logging

import pytest

from cua_rl.http.retry import RetryPolicy
from cua_rl.monitor import (
    MonitorClient,
    MonitorError,
    rollout_record,
    rollout_result,
    step_record,
    training_start,
    turn_record,
)

FAST = RetryPolicy(attempts=3, backoff_s=0.01, max_backoff_s=0.02, retry_5xx=False)


def client_for(server, state, **kwargs) -> MonitorClient:
    return MonitorClient.from_settings(server.url + state.prefix, state.token, project_id="p1", retry=FAST,
                                       **kwargs)


async def test_training_steps_rollouts_and_upserts(monitor_server, monitor_state, caplog):
    caplog.set_level(logging.DEBUG)
    async with client_for(monitor_server, monitor_state) as monitor:
        assert monitor.enabled and monitor_state.token not in repr(monitor)
        training_id = await monitor.start_training(training_start("cua", "run0"))
        assert training_id == 1
        assert monitor.ui_url(training_id) == f"{monitor_server.url}/178/1?project_id=p1"
        step = await monitor.upsert(step_record(training_id, 0))
        step_id = step.id_of("steps", "step-1-0-0")
        assert isinstance(step_id, int)
        first = await monitor.upsert(rollout_record("r1", step_id=step_id, task_id="t1", current_phase="env_creation"),
                                     turn_record("r1", 1, rollout_id="r1", start_time="t0"))
        second = await monitor.upsert(rollout_result("r1", reward=0.0, task_success=False, num_turns=1,
                                                     step_id=step_id, task_id="t1"))
        assert first.id_of("rollouts", "r1") == second.id_of("rollouts", "r1")
        await monitor.finish_training(training_id)
    row = monitor_state.rows["rollouts"]["r1"]
    assert row["status"] == "completed" and row["reward"] == 0.0 and row["current_phase"] == "env_creation"
    assert len(monitor_state.rows["rollouts"]) == 1
    assert monitor_state.trainings[1]["status"] == "completed"
    assert {h["authorization"] for h in monitor_state.requests} == {f"Bearer {monitor_state.token}"}
    assert monitor_state.token not in caplog.text


async def test_disabled_without_settings_sends_nothing(monitor_server, monitor_state):
    for monitor in (MonitorClient.from_settings("", ""), MonitorClient.from_settings(None, None),
                    MonitorClient.from_settings(monitor_server.url + "/178", "")):
        async with monitor:
            assert not monitor.enabled
            assert await monitor.start_training(training_start("e", "t")) is None
            result = await monitor.upsert(step_record(1, 0))
            assert result.sent is False and result.error is None
    assert monitor_state.requests == []


async def test_from_env(monkeypatch):
    monkeypatch.setenv("MONITOR_BASE_URL", "http://monitor.example/9")
    monkeypatch.setenv("MONITOR_PROJECT_TOKEN", "t")
    monkeypatch.delenv("PROJECT_ID", raising=False)
    async with MonitorClient.from_env() as monitor:
        assert monitor.enabled and monitor.base_url == "http://monitor.example/9"
    monkeypatch.delenv("MONITOR_BASE_URL")
    async with MonitorClient.from_env() as monitor:
        assert not monitor.enabled


async def test_http_errors_are_not_retried_and_do_not_raise(monitor_server, monitor_state, caplog):
    monitor_state.fail_next = [503]
    async with client_for(monitor_server, monitor_state) as monitor:
        result = await monitor.upsert(step_record(1, 0))
    assert result.sent is False and "HTTP 503" in result.error and "injected failure" in result.error
    assert len(monitor_state.requests) == 1
    assert "monitor ingest" in caplog.text


async def test_bad_token_error_never_shows_the_token(monitor_server, monitor_state, caplog):
    wrong = "wrong-SECRET-token"
    monitor = MonitorClient.from_settings(monitor_server.url + "/178", wrong, retry=FAST)
    async with monitor:
        result = await monitor.upsert(step_record(1, 0))
        assert result.sent is False and "HTTP 401" in result.error and wrong not in result.error
        monitor.raise_errors = True
        with pytest.raises(MonitorError) as info:
            await monitor.upsert(step_record(1, 0))
    assert wrong not in str(info.value) and "***" in str(info.value)
    assert wrong not in caplog.text


async def test_transport_timeout_is_retried(monitor_server, monitor_state, caplog):
    monitor_state.delay_first_s = 1.5
    async with client_for(monitor_server, monitor_state, timeout_s=0.3) as monitor:
        result = await monitor.upsert(step_record(1, 0))
    assert result.sent is True and "step-1-0-0" in monitor_state.rows["steps"]
    assert len(monitor_state.requests) == 2
    assert "retry 1/2" in caplog.text


async def test_unreachable_monitor_raises_only_when_asked():
    monitor = MonitorClient("http://127.0.0.1:9", "tok", retry=FAST, raise_errors=True)
    async with monitor:
        with pytest.raises(MonitorError, match="ConnectError"):
            await monitor.upsert(step_record(1, 0))
