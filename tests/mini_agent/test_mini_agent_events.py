"""Unit tests: the start-run payload, event de-duplication and normalisation, answer extraction."""

import pytest

from cua_rl.mini_agent import EventLog, ModelEndpoint, event_key
from mini_agent_requests import SECRET, make_request
from tests.doubles.agent_double import scripted_events


def test_payload_matches_documented_shape():
    payload = make_request(max_run_time_s=600).to_payload()
    assert payload == {
        "task": "Open the settings app", "agent": "qwen3-vl", "maxSteps": 7, "maxRunTimeSec": 600,
        "model": {"baseUrl": "http://127.0.0.1:8000/v1", "name": "policy", "provider": "openai", "apiKey": SECRET},
        "env": {"type": "genv", "gymBaseUrl": "http://127.0.0.1:5010", "gymId": "desktop", "executionId": "exec-1"},
        "standardActionSpace": "pc", "sampling": {"temperature": 1.0, "top_p": 0.9, "max_tokens": 256}}


def test_payload_without_key_or_sampling():
    payload = make_request(model=ModelEndpoint(base_url="http://u", name="m"), sampling=None).to_payload()
    assert "apiKey" not in payload["model"] and "sampling" not in payload


def test_extra_service_fields_pass_through_but_cannot_override():
    assert make_request(extra={"historyImages": 2}).to_payload()["historyImages"] == 2
    with pytest.raises(ValueError, match="model"):
        make_request(extra={"model": {}})


def test_secret_never_in_repr_or_redacted_payload():
    request = make_request()
    assert SECRET not in repr(request)
    assert SECRET not in str(request.redacted())
    assert request.redacted()["model"]["apiKey"] == "***"


@pytest.mark.parametrize("overrides, message", [
    ({"standard_action_space": "tablet"}, "standard_action_space"),
    ({"task": "  "}, "task"),
    ({"max_steps": 0}, "max_steps"),
    ({"env": {"gymBaseUrl": "http://u", "gymId": "g", "executionId": ""}}, "executionId"),
])
def test_bad_request_is_a_clear_error(overrides, message):
    with pytest.raises(ValueError, match=message):
        make_request(**overrides)


def test_dedup_on_type_ts_step_action_index():
    log = EventLog()
    events = scripted_events(2)
    assert log.add(events[:6]) == 6
    assert log.add(events[:8]) == 2  # an inclusive re-poll repeats the first six
    assert log.add([{"type": "error", "ts": "x", "step": 1, "actionIndex": 0},
                    {"type": "error", "ts": "x", "step": 1, "actionIndex": 1}, "garbage"]) == 2
    assert len(log) == 10
    assert event_key(events[3]) == f"action_executed:{events[3]['ts']}:1:0"


def test_new_schema_one_based_steps_unchanged():
    log = EventLog()
    log.add(scripted_events(3, answer="42"))
    events = log.events()
    assert not log.zero_based
    assert sorted({e.step for e in events if e.step is not None}) == [1, 2, 3]
    assert log.num_steps() == 3
    assert log.answer() == "42"
    assert [m.step for m in log.model_outputs()] == [1, 2, 3]
    assert log.model_outputs()[0].output["choices"][0]["message"]["content"] == "s1"
    assert log.run_end().data["ok"] is True


def test_old_schema_zero_based_turn_events_normalised():
    log = EventLog()
    log.add(scripted_events(3, zero_based=True, old_names=True))
    events = log.events()
    assert log.zero_based
    assert [e.step for e in events if e.type == "step_start"] == [1, 2, 3]
    assert {e.raw_type for e in events if e.type == "step_end"} == {"turn_end"}
    assert log.num_steps() == 3
    assert [m.step for m in log.model_outputs()] == [1, 2, 3]


def test_turn_field_counts_as_step():
    log = EventLog()
    log.add([{"type": "turn_start", "ts": "a", "turn": 0}, {"type": "turn_start", "ts": "b", "turn": 1}])
    assert [e.step for e in log.events()] == [1, 2]


@pytest.mark.parametrize("action, answer", [
    ({"name": "finished", "args": {"content": "51.54MB"}}, "51.54MB"),
    ({"name": "answer", "args": {"text": "yes"}}, "yes"),
    ({"name": "finished", "text": "via text"}, "via text"),
    ({"name": "click", "args": {"content": "not an answer"}}, None),
    ({"name": "finished", "args": {}}, None),
])
def test_answer_from_answer_actions(action, answer):
    log = EventLog()
    log.add([{"type": "action_executed", "ts": "t", "step": 1, "action": action}])
    assert log.answer() == answer


def test_answer_from_run_end_field():
    log = EventLog()
    log.add([{"type": "run_end", "ts": "t", "ok": True, "answer": "final"}])
    assert log.answer() == "final"
