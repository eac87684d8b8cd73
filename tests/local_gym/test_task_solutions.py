"""Every task, on a real desktop through the HTTP API: untouched it scores below 1; its reference solution
scores exactly 1.0. The built-in tasks, and the keyboard suite's (keyboard_suite.py) played as the keyboard
agent format parses its solutions. Executions run a few at a time (CUA_GYM_TEST_CONCURRENCY, default 4); set
CUA_GYM_TEST_TASKS=001,006 to play only some built-in tasks while developing them."""

from __future__ import annotations

import os

import pytest

from cua_rl.local_gym import load_tasks, start_gym_server
from cua_rl.local_gym.keyboard_suite import write_suite
from gym_helpers import keyboard_actions, solve_all

pytestmark = pytest.mark.desktop


def _selected():
    only = {k for k in os.environ.get("CUA_GYM_TEST_TASKS", "").split(",") if k}
    tasks = load_tasks()
    # Seeded families have no fixed solution: tests/local_gym/test_curriculum.py plays their instances.
    return [t for t in tasks.tasks if t.family is None and (not only or t.number in only or t.task_id in only)]


async def test_reference_solutions_score_one_and_untouched_tasks_do_not(gym, tmp_path_factory):
    failures = await solve_all(gym, _selected(), tmp_path_factory.mktemp("failed-task-screens"))
    assert not failures, "\n".join(failures)
    assert gym.manager.executions == {}


async def test_the_keyboard_suite_in_the_keyboard_format_scores_one_and_untouched_below(tmp_path_factory):
    """Issue 37 item 3: all 50 tasks of the suite's desktop target (mousepad and xterm), each solution sent as
    the actions the keyboard format parses from its ``<action>`` tags."""
    folder = tmp_path_factory.mktemp("keyboard-suite")
    write_suite("desktop", folder)
    tasks = load_tasks(folder).tasks
    assert len(tasks) == 50
    with start_gym_server(tasks_dir=str(folder), port=0, max_executions=8, pool_size=0) as gym:
        failures = await solve_all(gym, tasks, tmp_path_factory.mktemp("failed-suite-screens"),
                                   lambda task: keyboard_actions(task.solution))
        assert gym.manager.executions == {}
    assert not failures, "\n".join(failures)
