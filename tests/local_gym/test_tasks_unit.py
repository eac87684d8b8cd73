"""Task files and validators, without desktops: the task set is well formed and validators score real files."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from cua_rl.local_gym.actions import ActionError, parse_action
from cua_rl.local_gym.tasks import CATEGORIES, TaskDef, load_tasks
from cua_rl.local_gym.validators import HomeFiles, evaluate


def test_at_least_40_tasks_in_5_categories_with_difficulties():
    tasks = load_tasks().tasks
    assert len(tasks) >= 40
    cats = Counter(t.category for t in tasks if t.family is None)
    assert set(cats) == set(CATEGORIES) - {"curriculum"} and min(cats.values()) >= 5, cats
    assert {t.category for t in tasks if t.family} == {"curriculum"}   # seeded families: test_curriculum.py
    assert {t.difficulty for t in tasks} == {"easy", "normal", "hard"}
    numbers = [t.number for t in tasks]
    assert numbers == [f"{i:03d}" for i in range(1, len(tasks) + 1)]


def test_every_solution_action_parses():
    for task in load_tasks().tasks:
        for action in task.solution:
            parse_action(action)


def test_wire_task_shape_and_lookup():
    ts = load_tasks()
    t = ts.get("1")
    assert t is ts.get("001") is ts.get(t.task_id) is ts.get(t.name)
    wire = t.to_wire()
    assert wire["task_id"] == t.task_id and wire["task_number"] == "001"
    assert "solution" not in wire and wire["instruction"]
    assert t.difficulty in wire["tags"]


def test_bad_task_file_is_rejected(tmp_path: Path):
    (tmp_path / "001-x.yaml").write_text("number: '001'\nname: x\ncategory: nope\n")
    with pytest.raises(ValueError, match="001-x.yaml"):
        load_tasks(tmp_path)


def _task(validators: list[dict]) -> TaskDef:
    return TaskDef.model_validate({
        "number": "001", "name": "t", "category": "terminal", "difficulty": "easy", "instruction": "i",
        "setup": {"apps": [{"app": "xterm"}]}, "validators": validators, "solution": [{"type": "wait", "ms": 1}]})


def test_validators_give_partial_credit(tmp_path: Path):
    (tmp_path / "a.txt").write_text("hello\nworld\n")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x").write_text("")
    (tmp_path / "s.ini").write_text("[org/x]\nflag=true\n")
    task = _task([
        {"id": "eq", "type": "file_equals", "path": "a.txt", "text": "hello\nworld", "weight": 2},
        {"id": "re", "type": "file_matches", "path": "a.txt", "pattern": "^world$"},
        {"id": "no", "type": "file_contains", "path": "a.txt", "text": "absent"},
        {"id": "dir", "type": "dir_entries", "path": "d", "names": ["x"], "exact": True},
        {"id": "ini", "type": "ini_value", "path": "s.ini", "section": "org/x", "key": "flag", "value": "true"},
        {"id": "gone", "type": "file_absent", "path": "missing.txt"},
    ])
    result = evaluate(HomeFiles(tmp_path), task.validators)
    passed = {v["id"]: v["pass"] for v in result["result"]["validators"]}
    assert passed == {"eq": True, "re": True, "no": False, "dir": True, "ini": True, "gone": True}
    assert result["success"] is False
    assert result["result"]["score"] == pytest.approx(6 / 7)


def test_non_empty_date_and_ordered_steps_validators(tmp_path: Path):
    """The checker types of the Windows example (non-empty, date format, step 1 before step 2), with the
    ordered steps giving partial credit for the leading steps done in order."""
    (tmp_path / "blank.txt").write_text(" \n\n")
    (tmp_path / "note.txt").write_text("x")
    (tmp_path / "dates.txt").write_text("2026-11-25\n\n2024-02-29\n")
    (tmp_path / "bad-dates.txt").write_text("2026-11-25\n2023-02-29\n")   # not a leap year
    (tmp_path / "log.txt").write_text("step1: mkdir\nstep3: copy\nstep2: write\n")
    task = _task([
        {"id": "blank", "type": "file_non_empty", "path": "blank.txt"},
        {"id": "note", "type": "file_non_empty", "path": "note.txt"},
        {"id": "dates", "type": "file_date", "path": "dates.txt", "date_format": "%Y-%m-%d"},
        {"id": "bad", "type": "file_date", "path": "bad-dates.txt", "date_format": "%Y-%m-%d"},
        {"id": "none", "type": "file_date", "path": "blank.txt", "date_format": "%Y-%m-%d"},
        {"id": "order", "type": "file_ordered", "path": "log.txt", "steps": ["step1", "step2", "step3"]},
        {"id": "ordered", "type": "file_ordered", "path": "log.txt", "steps": ["step1", "step3"], "weight": 2},
    ])
    got = {v["id"]: (v["pass"], v["score"]) for v in evaluate(HomeFiles(tmp_path), task.validators)["result"]["validators"]}
    assert got == {"blank": (False, 0.0), "note": (True, 1.0), "dates": (True, 1.0), "bad": (False, 0.0),
                   "none": (False, 0.0), "order": (False, pytest.approx(2 / 3)), "ordered": (True, 1.0)}
    assert evaluate(HomeFiles(tmp_path), task.validators)["score"] == pytest.approx((1 + 1 + 2 / 3 + 2) / 8)
    for bad in ({"steps": []}, {"steps": ["a", ""]}, {"date_format": "YYYY"}, {}):
        kind = "file_date" if "date_format" in bad else "file_ordered"
        with pytest.raises(ValueError):
            _task([{"id": "v", "type": kind, "path": "x", **bad}])


def test_validator_never_follows_symlink_out_of_home(tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    (home / "link.txt").symlink_to(secret)
    task = _task([{"id": "c", "type": "file_contains", "path": "link.txt", "text": "top secret"}])
    result = evaluate(HomeFiles(home), task.validators)
    v = result["result"]["validators"][0]
    assert v["pass"] is False and "link" in v["message"] and "top secret" not in v["message"]


def test_validators_follow_no_link_and_open_no_fifo_even_inside_home(tmp_path: Path):
    """Issue 66: what a validator reads is opened without following a link anywhere on its path (inside HOME
    too: the desktop can retarget a link between two looks) and without blocking (a FIFO is never read)."""
    import os
    import time

    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "a.txt").write_text("inside")
    (tmp_path / "to-a.txt").symlink_to(tmp_path / "real" / "a.txt")     # a link to a file inside HOME
    (tmp_path / "to-real").symlink_to(tmp_path / "real")                 # a folder on the way is a link
    os.mkfifo(tmp_path / "pipe")
    task = _task([{"id": "link", "type": "file_contains", "path": "to-a.txt", "text": "inside"},
                  {"id": "parent", "type": "file_contains", "path": "to-real/a.txt", "text": "inside"},
                  {"id": "fifo", "type": "file_non_empty", "path": "pipe"},
                  {"id": "listed", "type": "dir_entries", "path": "to-real", "names": ["a.txt"]},
                  {"id": "kind", "type": "file_exists", "path": "to-a.txt"},
                  {"id": "real", "type": "file_contains", "path": "./real//a.txt", "text": "inside"}])
    t0 = time.monotonic()
    got = {v["id"]: v for v in evaluate(HomeFiles(tmp_path), task.validators)["result"]["validators"]}
    assert time.monotonic() - t0 < 1.0
    assert [i for i, v in got.items() if v["pass"]] == ["real"], got
    assert "link" in got["link"]["message"] and "link" in got["parent"]["message"], got
    assert "regular file" in got["fifo"]["message"] and "link" in got["listed"]["message"], got


BAD_HOME_PATHS = ["../escape.txt", "/etc/cron.d/job", "a/../../b", "~/.ssh/authorized_keys", "x/\0y", ".", "a/.."]


@pytest.mark.parametrize("bad", BAD_HOME_PATHS)
def test_set_up_paths_outside_home_are_refused_when_the_task_loads(bad: str):
    """Issue 66: a custom task's ``files``/``dirs`` follow the validators' rule (home_paths.home_parts): one
    that would write outside HOME (as root) is refused when the task loads, naming the path and why; the
    validators refuse the same path."""
    from cua_rl.local_gym.tasks import inline_tasks

    base = {"number": "950", "name": "escape", "category": "terminal", "difficulty": "easy", "instruction": "i",
            "validators": [{"id": "v", "type": "file_exists", "path": "x"}], "solution": [{"type": "wait", "ms": 1}]}
    for setup in ({"files": {bad: "pwned"}}, {"dirs": [bad]}):
        with pytest.raises(ValueError, match="setup (files|dirs)") as err:
            inline_tasks([{**base, "setup": {"apps": [{"app": "xterm"}], **setup}}])
        assert repr(bad) in str(err.value) or bad in str(err.value), err.value
    if bad != ".":     # HOME itself is a folder validators may list, not one a set-up may make
        assert HomeFiles("/nonexistent").refuse(bad) is not None


@pytest.mark.parametrize("raw,status", [
    ({"type": "click", "x": 1.5, "y": 0.2}, 422),
    ({"type": "click", "x": -0.1, "y": 0.2}, 422),
    ({"type": "click", "x": "a", "y": 0.2}, 422),
    ({"type": "click", "x": 0.5}, 422),
    ({"type": "fly"}, 422),
    ({"type": "key", "keys": ["ctrl", "nosuchkey"]}, 422),
    ({"type": "key", "keys": []}, 422),
    ({"type": "type", "text": "x" * 5000}, 413),
    ({"type": "scroll", "x": 0.5, "y": 0.5, "dy": 1000}, 422),
    ("click", 422),
])
def test_bad_actions_are_rejected(raw, status):
    with pytest.raises(ActionError) as err:
        parse_action(raw)
    assert err.value.status == status and err.value.detail


def test_mobile_aliases_map_onto_desktop_actions():
    assert parse_action({"type": "tap", "x_norm": 0.1, "y_norm": 0.2}).type == "click"
    swipe = parse_action({"type": "swipe", "x_norm": 0.1, "y_norm": 0.2, "x2_norm": 0.3, "y2_norm": 0.4})
    assert swipe.type == "drag" and swipe.x2 == 0.3
    assert parse_action({"type": "long_press", "x": 0.5, "y": 0.5}).type == "press"
    assert parse_action({"type": "key", "key": "back"}).type == "key"
    assert parse_action({"type": "wait", "duration_ms": 20}).ms == 20


def test_key_combos_in_any_spelling():
    from cua_rl.local_gym.xinput import keysym_for_name
    ctrl_s = [keysym_for_name("ctrl"), keysym_for_name("s")]
    for raw in ({"keys": ["ctrl", "s"]}, {"keys": ["ctrl+s"]}, {"keys": "ctrl+s"}, {"key": "ctrl+s"}):
        assert parse_action({"type": "key", **raw}).keysyms == ctrl_s, raw
    assert parse_action({"type": "key", "keys": ["+"]}).keysyms == [ord("+")]
    assert parse_action({"type": "key", "keys": ["ctrl", "plus"]}).keysyms[1] == ord("+")


def test_answer_validator_reads_answer_text_or_execution_data(tmp_path: Path):
    from cua_rl.local_gym.validators import answer_from
    task = _task([{"id": "a", "type": "answer_matches", "pattern": "12"}])
    assert evaluate(HomeFiles(tmp_path), task.validators, None)["success"] is False
    assert evaluate(HomeFiles(tmp_path), task.validators, " 12\n")["success"] is True
    assert evaluate(HomeFiles(tmp_path), task.validators, "112")["success"] is False
    assert answer_from({"answer_text": "12"}) == "12"
    assert answer_from({"execution_data": {"answer": "12"}}) == "12"   # where the original workflow put it
    assert answer_from({}) is None
