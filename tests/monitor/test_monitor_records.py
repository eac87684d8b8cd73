"""Record builders: client_id conventions, JSON-string columns, no None overwrites."""

import json
from datetime import datetime, timezone

import pytest

from cua_rl.monitor import (
    Record,
    rollout_record,
    rollout_result,
    step_record,
    task_record,
    training_start,
    turn_record,
    validation_record,
)


def test_training_start_run_name():
    t = training_start("cua", "run0", started_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc))
    assert t == {"run_name": "cua_run0_20260102-030405", "status": "running", "current_phase": "rollout",
                 "experiment_name": "cua", "trial_name": "run0"}


def test_client_id_conventions():
    assert step_record(7, 3, 1).client_id == "step-7-3-1"
    assert rollout_record("abc123").client_id == "abc123"
    assert turn_record("abc123", 2, rollout_id=9).client_id == "abc123:turn:2"
    assert validation_record("abc123", rollout_id=9, reward=1, success=True, num_validators=2).client_id \
        == "abc123:validation"
    assert task_record("task-001", "Open").client_id == "task-001"


def test_none_fields_are_dropped_so_updates_do_not_blank_columns():
    payload = rollout_record("r1", status="running", current_phase="task_execution").to_payload()
    assert payload == {"client_id": "r1", "rollout_id": "r1", "source_type": "step", "status": "running",
                       "current_phase": "task_execution"}


def test_rollout_result_summary_is_a_json_string():
    payload = rollout_result("r1", reward=0.0, task_success=False, num_turns=4, summary={"reward": 0.0},
                             step_id=12, task_id="t").to_payload()
    assert payload["status"] == "completed" and payload["reward"] == 0.0 and payload["step_id"] == 12
    assert json.loads(payload["summary_json"]) == {"reward": 0.0}
    assert payload["validation_passed"] is False and "end_time" in payload


def test_turn_json_columns():
    payload = turn_record("r1", 1, rollout_id=5, end_time="t1", thinking="hm", text="click",
                          action={"type": "click", "x": 0.1}, metrics={"stage_timings": {"action_exec": 0.2}},
                          model_input={"messages": []}).to_payload()
    assert json.loads(payload["model_response"]) == {"thinking": "hm", "text": "click",
                                                     "action": {"type": "click", "x": 0.1}}
    assert json.loads(payload["action_json"])["type"] == "click"
    assert json.loads(payload["metrics_json"])["stage_timings"]["action_exec"] == 0.2
    assert json.loads(payload["model_specific_input_json"]) == {"messages": []}


def test_validation_actual_result():
    payload = validation_record("r1", rollout_id=5, reward=0.5, success=False, num_validators=2,
                                details={"reward": 0.5}).to_payload()
    assert payload["actual_result"] == "reward=0.5000, validators=2"
    assert payload["details_json"] == {"reward": 0.5}


def test_bad_records_are_clear_errors():
    with pytest.raises(ValueError, match="source_type"):
        rollout_record("r", source_type="training")
    with pytest.raises(ValueError, match="kind"):
        Record("widgets", "x")
    with pytest.raises(ValueError, match="client_id"):
        Record("turns", "")
