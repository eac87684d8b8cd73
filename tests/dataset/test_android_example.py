"""Issue 37 item 6: the example Android task file parses, carries the tinker example's categories and
difficulties as tags, filters by category (gym_tags) and difficulty (task_source.difficulty), and the documented
command's config loads (mobile action space, MAI-UI format, the file as the task source). No Android gym runs
here (docs/android.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cua_rl.config import CUAConfig, TaskSourceConfig
from cua_rl.dataset import TaskSourceError, choose_splits, read_task_file

TASKS = Path(__file__).resolve().parents[2] / "examples" / "android" / "tasks.yaml"


def test_the_example_tasks_have_categories_and_difficulties():
    tasks = read_task_file(TASKS)
    assert len(tasks) == 10 and all(t.instruction and t.difficulty for t in tasks)
    categories = {tag for t in tasks for tag in t.tags} - {"easy", "medium", "hard"}
    assert categories == {"settings", "navigation", "app", "input", "system"}


def test_category_and_difficulty_filters():
    config = CUAConfig(gym_tags=["settings"], gym_split_type="all",
                       task_source=TaskSourceConfig(kind="file", task_file=str(TASKS), difficulty=["easy"]))
    train, _ = choose_splits(read_task_file(TASKS), config)
    assert [t.id for t in train] == ["train_01_open_settings", "train_02_enable_wifi"]
    config.task_source.difficulty = ["medium"]   # "medium" counts as normal
    train, _ = choose_splits(read_task_file(TASKS), config)
    assert [t.id for t in train] == ["train_03_brightness_max", "train_04_dark_theme"]
    config.gym_tags = ["navigation"]
    config.task_source.difficulty = ["hard"]
    with pytest.raises(TaskSourceError, match="no task has difficulty"):
        choose_splits(read_task_file(TASKS), config)
    with pytest.raises(ValueError, match="task_source.difficulty"):
        TaskSourceConfig(difficulty=["trivial"])


def test_the_documented_command_loads(launcher):
    rc, report, overrides, out = launcher([
        "--gym", "http://10.9.9.9:5010", "--gym-id", "android", "--gbox-mini-url", "http://10.9.9.8:3000",
        "--standard-action-space", "mobile", "--gbox-agent", "mai-ui", "task_source.kind=file",
        f"task_source.task_file={TASKS}", "--gym-tags", "settings,navigation", "task_source.difficulty=[easy]"])
    assert rc == 0, out.err
    assert report["mode"] == "external gym http://10.9.9.9:5010" and "gbox_mini_agent_agent=mai-ui" in overrides
