"""Every task, on a real desktop through the HTTP API: untouched it scores below 1; its reference solution
scores exactly 1.0. Executions run a few at a time (CUA_GYM_TEST_CONCURRENCY, default 4); set
CUA_GYM_TEST_TASKS=001,006 to play only some tasks while developing them."""

from __future__ import annotations

import asyncio
import os

import pytest

from cua_rl.genv import GenvClient
from cua_rl.local_gym import load_tasks

pytestmark = pytest.mark.desktop


async def _play(client: GenvClient, task, shots_dir) -> tuple[float, float, list]:
    async with client.execution(task.task_id) as ex:
        before = await client.evaluate(ex.execution_id)
        for action in task.solution:
            reply = await client.act(ex.execution_id, action)
            assert reply["ok"], (task.task_id, action, reply)
        after = await client.evaluate(ex.execution_id, answer_text=task.answer)
        if after.reward != 1.0:  # keep the evidence: what the desktop looked like at the end
            (shots_dir / f"{task.task_id}.png").write_bytes(await client.screenshot(ex.execution_id))
        return before.reward, after.reward, after.raw["result"]["validators"]


def _selected():
    only = {k for k in os.environ.get("CUA_GYM_TEST_TASKS", "").split(",") if k}
    tasks = load_tasks()
    # Seeded families have no fixed solution: tests/local_gym/test_curriculum.py plays their instances.
    return [t for t in tasks.tasks if t.family is None and (not only or t.number in only or t.task_id in only)]


async def test_reference_solutions_score_one_and_untouched_tasks_do_not(gym, tmp_path_factory):
    shots = tmp_path_factory.mktemp("failed-task-screens")
    tasks = _selected()
    sem = asyncio.Semaphore(int(os.environ.get("CUA_GYM_TEST_CONCURRENCY", "4")))
    async with GenvClient(gym.url, gym.gym_id) as client:
        async def one(task):
            async with sem:
                return task.task_id, await _play(client, task, shots)
        results = await asyncio.gather(*(one(t) for t in tasks), return_exceptions=True)
    failures = [f"{t.task_id}: {type(r).__name__}: {r}" for t, r in zip(tasks, results) if isinstance(r, BaseException)]
    for task_id, (before, after, validators) in [r for r in results if not isinstance(r, BaseException)]:
        if before >= 1.0:
            failures.append(f"{task_id}: untouched task already scores {before}")
        if after != 1.0:
            failed = [v for v in validators if not v["pass"]]
            failures.append(f"{task_id}: reference solution scores {after}: {failed} (screen: {shots}/{task_id}.png)")
    assert not failures, "\n".join(failures)
    assert gym.manager.executions == {}
