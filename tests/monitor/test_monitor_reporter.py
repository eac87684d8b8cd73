"""EpisodeReporter and training_run against the Training Monitor test double (tests/doubles/monitor_double.py) on
loopback: ids link up, sends never block or raise, failures are logged once, no settings = no HTTP."""

import asyncio
import logging

import pytest

from cua_rl.http.retry import RetryPolicy
from cua_rl.monitor import EpisodeReporter, training_run

FAST = RetryPolicy(attempts=1, backoff_s=0.0, max_backoff_s=0.0, retry_5xx=False)
IDENTITY = dict(source_type="step", is_eval=False, env_index=0, max_turns=5, model_path="/m")


def reporter(server, state, training_id=7, **kw) -> EpisodeReporter:
    return EpisodeReporter(server.url + state.prefix, "p1", training_id, token=state.token, retry=FAST, **kw)


async def test_rollouts_link_to_task_step_and_validation(monitor_server, monitor_state, caplog):
    caplog.set_level(logging.DEBUG)
    rep = reporter(monitor_server, monitor_state)
    first = rep.rollout("aa11", task_id="t1", task_name="Task one", step=3, **IDENTITY)
    second = rep.rollout("bb22", task_id="t1", task_name="Task one", step=3, **IDENTITY)
    first.finished(reward=0.5, task_success=False, num_turns=2, num_validators=1, evaluation={"score": 0.5},
                   summary={"task_id": "t1", "execution_id": "ex1"})
    second.failed("agent unreachable")
    second.failed("reported twice")  # a rollout ends once
    await rep.aclose()
    rows = monitor_state.rows
    assert set(rows["tasks"]) == {"t1"} and set(rows["steps"]) == {"step-7-3-0"}
    task_row, step_row = rows["tasks"]["t1"], rows["steps"]["step-7-3-0"]
    done, failed = rows["rollouts"]["aa11"], rows["rollouts"]["bb22"]
    assert done["status"] == "completed" and done["reward"] == 0.5 and done["num_turns"] == 2
    assert done["task_id"] == task_row["id"] and done["step_id"] == step_row["id"] and done["is_eval"] is False
    assert "start_time" in done and "end_time" in done and '"execution_id": "ex1"' in done["summary_json"]
    assert failed["status"] == "failed" and "reported twice" not in failed["summary_json"]
    validation = rows["validations"]["aa11:validation"]
    assert validation["rollout_id"] == done["id"] and validation["success"] is False
    # task once, step once, 2 starts, 2 ends (the second failed() sent nothing)
    assert len(monitor_state.requests) == 6
    assert {h["authorization"] for h in monitor_state.requests} == {f"Bearer {monitor_state.token}"}
    assert monitor_state.token not in caplog.text


async def test_failures_never_raise_and_are_logged_once(monitor_server, monitor_state, caplog):
    caplog.set_level(logging.DEBUG)
    monitor_state.fail_next = [500] * 20
    rep = reporter(monitor_server, monitor_state)
    for i in range(3):
        rep.rollout(f"r{i}", task_id="t1", step=0, **IDENTITY).finished(
            reward=1.0, task_success=True, num_turns=1, summary={})
    await rep.aclose()
    assert rep.failures >= 3
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("cua_rl.monitor")]
    assert len(warnings) == 1 and "HTTP 500" in warnings[0].getMessage()
    assert monitor_state.token not in caplog.text


async def test_a_stalled_monitor_is_given_up_on(monitor_server, monitor_state):
    """The first request hangs for 30 s; the send times out at 0.5 s and later sends still go through."""
    monitor_state.delay_first_s = 30.0
    rep = reporter(monitor_server, monitor_state, training_id=None, timeout_s=0.5)
    report = rep.rollout("cc33", task_id="t9", **IDENTITY)   # returns at once: nothing is awaited here
    report.finished(reward=0.0, task_success=False, num_turns=0, summary={})
    await asyncio.wait_for(rep.flush(), 10)
    assert rep.failures == 1
    assert monitor_state.rows["rollouts"]["cc33"]["status"] == "completed"
    await rep.aclose()


async def test_no_token_or_no_url_sends_nothing(monitor_server, monitor_state, monkeypatch):
    monkeypatch.delenv("PROJECT_TOKEN", raising=False)
    monkeypatch.delenv("MONITOR_PROJECT_TOKEN", raising=False)
    for rep in (EpisodeReporter(monitor_server.url + monitor_state.prefix, "p1", 1),   # token from env: none
                EpisodeReporter("", "p1", 1, token=monitor_state.token)):
        assert not rep.enabled
        rep.rollout("dd44", task_id="t1", step=0).finished(reward=1.0, task_success=True, num_turns=1, summary={})
        assert not rep._pending
        await rep.aclose()
    assert monitor_state.requests == []


def test_training_run_marks_completed_or_failed(monitor_server, monitor_state, caplog):
    caplog.set_level(logging.DEBUG)
    base = monitor_server.url + monitor_state.prefix
    with training_run(base, "p1", "cua", "run0", token=monitor_state.token) as training_id:
        assert monitor_state.trainings[training_id]["status"] == "running"
    assert monitor_state.trainings[training_id]["status"] == "completed"
    with pytest.raises(RuntimeError):
        with training_run(base, "p1", "cua", "run1", token=monitor_state.token) as failed_id:
            raise RuntimeError("trainer crashed")
    assert failed_id != training_id and monitor_state.trainings[failed_id]["status"] == "failed"
    assert monitor_state.token not in caplog.text
    sent = len(monitor_state.requests)
    for kwargs in (dict(token=""), dict(token=monitor_state.token, enabled=False)):  # no token / not rank 0
        with training_run(base, "p1", "cua", "run2", **kwargs) as none_id:
            assert none_id is None
    with training_run("", "p1", "cua", "run3", token=monitor_state.token) as none_id:
        assert none_id is None
    assert len(monitor_state.requests) == sent


def test_unreachable_monitor_does_not_stop_training():
    with training_run("http://127.0.0.1:9", "p1", "cua", "run0", token="t", timeout_s=1.0) as training_id:
        assert training_id is None


def test_workflow_kwargs_carry_the_monitor_settings_but_never_the_token(tmp_path, monkeypatch):
    """What train.py ships to rollout workers (AReaL logs and saves these kwargs). A config that names no run
    gets no counts directory, and nothing is created in the working directory (AReaL's directory-making
    getter once left ``???/logs/<user>/???/???`` there)."""
    import pickle

    monkeypatch.chdir(tmp_path)

    from cua_rl.config import CUAConfig
    from cua_rl.workflow import CUAAgentWorkflow, workflow_kwargs

    config = CUAConfig(monitor_base_url="http://monitor.example/178", project_id="p1", project_token="tok-KW-secret")
    kwargs = workflow_kwargs(config, config.eval_gconfig, 2, is_eval=True, monitor_training_id=5)
    assert "tok-KW-secret" not in repr(kwargs) and "tok-KW-secret" not in str(pickle.dumps(kwargs))
    wf = CUAAgentWorkflow(**pickle.loads(pickle.dumps(kwargs)))
    assert (wf.monitor.base_url, wf.monitor.project_id, wf.monitor.training_id, wf.is_eval) == (
        "http://monitor.example/178", "p1", 5, True)
    assert kwargs["stats_dir"] == "" and list(tmp_path.iterdir()) == []
