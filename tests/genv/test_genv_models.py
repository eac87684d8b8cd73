"""Task and create-execution parsing over every shape of docs/protocols.md §1.2/§1.3."""

import pytest

from cua_rl.genv import Execution, GenvError, Task, difficulty_from_tags


def test_flat_task_with_task_number_and_tags():
    task = Task.from_raw({"task_id": "t-7", "id": "ignored", "task_number": "011", "name": "Open settings",
                          "description": "Open the settings app", "instruction": "Tap the gear",
                          "tags": ["gym", "Normal"], "env_config": {"a": 1}, "evaluation": {"b": 2},
                          "seed_id": 5})
    assert task.id == "t-7"
    assert task.number == 11
    assert task.name == "Open settings"
    assert task.description == "Open the settings app"
    assert task.instruction == "Tap the gear"
    assert task.tags == ("gym", "Normal")
    assert task.difficulty == "normal"
    assert task.env == {"a": 1} and task.evaluation == {"b": 2}
    assert task.seed_id == "5"
    assert task.is_complete


def test_uuid_task_with_meta_number_and_display_name():
    raw = {"id": "6f1c2d3e-0000-4000-8000-00000000abcd",
           "meta": {"number": "032", "displayName": "Write note", "name": "write-note", "description": "D"},
           "tags": "hard, notes", "env": {"x": 1}}
    task = Task.from_raw(raw)
    assert task.id == raw["id"]
    assert task.number == 32
    assert task.name == "Write note"
    assert task.description == "D"
    assert task.instruction == "D"  # instruction falls back to description
    assert task.tags == ("hard", "notes")
    assert task.difficulty == "hard"
    assert task.env == {"x": 1} and task.evaluation is None
    assert not task.is_complete
    assert task.raw is raw


def test_legacy_umetrip_meta_shape():
    raw = {"meta": {"id": "task-001", "name": "Book a flight", "timeoutSec": 300},
           "instruction": "Book the cheapest flight", "env": {"app": "umetrip"},
           "evaluation": {"graphql": {"endpoint": "http://x"}, "checks": [], "successCriteria": "all"}}
    task = Task.from_raw(raw)
    assert task.id == "task-001"
    assert task.number == 1  # trailing digits of the id
    assert task.name == "Book a flight"
    assert task.description == "Book a flight"  # description falls back to the name
    assert task.instruction == "Book the cheapest flight"
    assert task.timeout_s == 300.0
    assert task.difficulty is None and task.tags == ()


@pytest.mark.parametrize("raw, number", [
    ({"id": "u", "task_name": "017_open_calendar"}, 17),
    ({"id": "u", "display_name": "3 Open app"}, 3),
    ({"id": "abc123def"}, None),  # digits buried in a word are not a number
    ({"id": "6f1c2d3e-0000-4000-8000-000000000001", "name": "no number"}, None),
    ({"id": "5"}, 5),
])
def test_number_derivation(raw, number):
    assert Task.from_raw(raw).number == number


def test_name_chain_order():
    assert Task.from_raw({"id": "a", "display_name": "D", "task_name": "slug"}).name == "D"
    assert Task.from_raw({"id": "a", "task_name": "slug", "meta": {"displayName": "M"}}).name == "slug"
    assert Task.from_raw({"id": "a", "meta": {"name": "n"}}).name == "n"
    assert Task.from_raw({"id": "a"}).name == "a"


def test_difficulty_never_invented():
    assert Task.from_raw({"id": "a", "tags": ["gym"]}).difficulty is None
    assert Task.from_raw({"id": "a", "tags": ["EASY"]}).difficulty == "easy"
    assert Task.from_raw({"id": "a", "difficulty": "medium"}).difficulty == "normal"
    assert difficulty_from_tags(["x", "hard"]) == "hard"


@pytest.mark.parametrize("raw", [{"name": "no id"}, {"id": {"nested": 1}}, "just a string", {"id": ""}])
def test_task_without_id_is_a_clear_error(raw):
    with pytest.raises(GenvError, match="id|not an object"):
        Task.from_raw(raw)


def test_execution_reply():
    ex = Execution.from_raw({"execution_id": "e1", "task_id": 7, "gbox_id": "box-9"})
    assert (ex.execution_id, ex.task_id, ex.device_id) == ("e1", "7", "box-9")
    assert Execution.from_raw({"execution_id": "e2", "device": {"device_serial": "s"}}).device_id == "s"


@pytest.mark.parametrize("raw", [{}, {"execution_id": 12}, {"execution_id": " "}, ["e1"], None])
def test_execution_id_must_be_a_string(raw):
    with pytest.raises(GenvError, match="execution_id|not an object"):
        Execution.from_raw(raw)
