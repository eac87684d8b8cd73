"""The keyboard suite (cua_rl/local_gym/keyboard_suite.py), without desktops: one generator gives both targets
the same four levels, split and checkers; the checkers give the example's partial credit on real files; the
written task files are what the gym serves and a task source picks a split by its tag; every scripted solution
is expressible in the keyboard agent format.

Played on real desktops: tests/local_gym/test_task_solutions.py; on the VM guest: tests/local_gym/test_vm_gym.py."""

from __future__ import annotations

import datetime
from collections import Counter
from pathlib import Path

import pytest

from cua_rl.local_gym import keyboard_suite as K
from cua_rl.local_gym.tasks import inline_tasks, load_tasks
from cua_rl.local_gym.validators import HomeFiles, evaluate
from gym_helpers import keyboard_actions


@pytest.fixture
def fake_guest(tmp_path, monkeypatch):
    """Files where $CUA_RL_VM_TEST_GUEST names the guest, so the VM tasks' image paths validate (not booted)."""
    for name in ("base.qcow2", "vmlinuz", "initrd.gz"):
        (tmp_path / name).write_bytes(b"")
    monkeypatch.setenv("CUA_RL_VM_TEST_GUEST", str(tmp_path))
    return tmp_path


def test_one_generator_gives_both_targets_four_levels_a_split_and_the_same_checkers(fake_guest):
    desktop, vm = K.suite_tasks("desktop"), K.suite_tasks("vm")
    assert len(desktop) == len(vm) == len(K.SENTENCES) == 50
    for tasks, first in ((desktop, 101), (vm, 201)):
        defs = inline_tasks(tasks)            # valid task files, numbers and names unique
        assert [int(t.number) for t in defs] == list(range(first, first + 50))
        levels = Counter(t.tags[1] for t in defs)
        assert levels == {"level-1": 13, "level-2": 13, "level-3": 12, "level-4": 12}
        by_split = Counter((t.tags[1], t.tags[2]) for t in defs)
        assert sum(n for (_, s), n in by_split.items() if s == "test") == 10
        assert all(by_split[(level, split)] >= 2 for level in levels for split in ("train", "test")), by_split
    for d, v in zip(desktop, vm):
        assert d["validators"] == v["validators"] and d["tags"] == v["tags"]
        assert ("apps" in d["setup"], "vm" in v["setup"]) == (True, True) and "apps" not in v["setup"]
    assert [t["name"] for t in K.suite_tasks("desktop", "test")] == [t["name"] for t in desktop if "test" in t["tags"]]
    kinds = Counter(next(v["type"] for v in t["validators"] if v["id"] != "exists") for t in desktop)
    assert set(kinds) == {"file_contains", "file_date", "dir_exists"}   # text, date, folders (contains), steps
    with pytest.raises(ValueError, match="target"):
        K.suite_task("windows", 0)
    with pytest.raises(ValueError, match="0..49"):
        K.suite_task("desktop", 50)


def _score(task: dict, home: Path) -> float:
    return evaluate(HomeFiles(home), inline_tasks([task])[0].validators)["score"]


def test_checkers_give_the_examples_partial_credit(tmp_path):
    editor = K.suite_task("desktop", 4)                       # level 1: output.txt
    sentence = K.SENTENCES[4]
    home = tmp_path / "editor"
    home.mkdir()
    assert _score(editor, home) == 0.0                        # untouched
    (home / "output.txt").write_text("something else\n")
    assert _score(editor, home) == pytest.approx(0.2)          # the file exists
    (home / "output.txt").write_text(f"{sentence} and more\n")
    assert _score(editor, home) == pytest.approx(0.5)          # it holds the sentence
    (home / "output.txt").write_text(sentence)                # no final newline: editors differ, still exact
    assert _score(editor, home) == 1.0

    date_task = next(t for i, t in enumerate(K.suite_tasks("desktop")) if t["validators"][1]["type"] == "file_date")
    home = tmp_path / "date"
    home.mkdir()
    (home / "date.txt").write_text("today\n")
    assert _score(date_task, home) == pytest.approx(0.2)
    (home / "date.txt").write_text(datetime.date.today().strftime(date_task["validators"][1]["date_format"]) + "\n")
    assert _score(date_task, home) == 1.0

    folders = next(t for t in K.suite_tasks("desktop") if t["setup"].get("dirs"))
    names = [d.split("/")[1] for d in folders["setup"]["dirs"]]
    assert len(set(names)) == 3
    home = tmp_path / "folders"
    home.mkdir()
    (home / "folders.txt").write_text(names[0] + "\n")
    assert _score(folders, home) == pytest.approx((1 + 4 / 3) / 5)
    (home / "folders.txt").write_text("\n".join(names) + "\n")
    assert _score(folders, home) == 1.0

    multi = K.suite_task("desktop", 3)                        # level 4: a folder, step 1, step 2
    steps = multi["validators"][1]["steps"]
    folder = multi["validators"][0]["path"]
    home = tmp_path / "multi"
    (home / folder).mkdir(parents=True)
    assert _score(multi, home) == pytest.approx(0.25)
    (home / folder / "steps.txt").write_text(steps[0] + "\n")
    assert _score(multi, home) == pytest.approx((1 + 3 * 0.5) / 4)
    (home / folder / "steps.txt").write_text(steps[1] + "\n" + steps[0] + "\n")   # out of order: step 1 only
    assert _score(multi, home) == pytest.approx((1 + 3 * 0.5) / 4)
    (home / folder / "steps.txt").write_text("\n".join(steps) + "\n")
    assert _score(multi, home) == 1.0


def test_every_solution_is_a_keyboard_format_reply():
    """What the keyboard-only policy would have to answer: each scripted solution, written as
    ``<action>...</action>`` tags and parsed by the agent's keyboard format, gives the solution's gym actions
    (the desktop and VM sweeps play the parsed ones)."""
    for target in K.TARGETS:
        for task in K.suite_tasks(target):
            assert keyboard_actions(task["solution"]) == task["solution"], task["name"]


async def test_the_cli_writes_task_files_the_gym_serves_and_sources_pick_a_split_by_tag(tmp_path, fake_guest, capsys):
    from cua_rl.config import CUAConfig, TaskSourceConfig
    from cua_rl.dataset import aload_task_datasets
    from cua_rl.local_gym.__main__ import main
    from cua_rl.local_gym.server import start_gym_server

    assert main(["suite", "keyboard", "--target", "desktop", "--out", str(tmp_path / "desktop")]) == 0
    assert "50 task files" in capsys.readouterr().out
    assert main(["suite", "keyboard", "--target", "vm", "--out", str(tmp_path / "vm")]) == 0
    assert len(load_tasks(tmp_path / "vm")) == 50
    served = load_tasks(tmp_path / "desktop")
    assert [t.model_dump() for t in served.tasks] == [t.model_dump() for t in inline_tasks(K.suite_tasks("desktop"))]
    with start_gym_server(tasks_dir=str(tmp_path / "desktop"), pool_size=0, x_spares=0) as gym:
        config = CUAConfig(gym_base_url=gym.url, gym_id=gym.gym_id,
                           task_sources=[TaskSourceConfig(tags=["train"])],
                           eval_task_source=TaskSourceConfig(tags=["test"]))
        train, evaluation = await aload_task_datasets(config)
    assert sorted(evaluation["name"]) == sorted(t["name"] for t in K.suite_tasks("desktop", "test"))
    assert sorted(train["name"]) == sorted(t["name"] for t in K.suite_tasks("desktop", "train"))
    level3 = [r for r in train if "level-3" in r["tags"]]
    assert level3 and all(r["difficulty"] == "normal" and "keyboard" in r["tags"] for r in level3)
    # the overrides docs/local_gym.md gives make these sources
    from cua_rl.run.launch import load_config

    docs = load_config("examples/cua_agent/config.yaml", [
        f"embedded.tasks_dir={tmp_path / 'desktop'}", "gbox_mini_agent_agent=keyboard", "task_sources=[{tags: [train]}]",
        "eval_task_source={tags: [test]}", f"cluster.fileroot={tmp_path}"])
    assert ([s.tags for s in docs.task_sources], docs.eval_task_source.tags) == ([["train"]], ["test"])
    assert docs.gbox_mini_agent_agent == "keyboard"
