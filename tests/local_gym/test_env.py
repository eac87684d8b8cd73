"""LocalGym without HTTP (Gymnasium's shape): reset, screenshot, act, evaluate, terminate on a real desktop,
refusals as GymError with the status the genv API answers, and close ending every desktop."""

from __future__ import annotations

import pytest

from cua_rl.local_gym import GymError, GymOptions, LocalGym, load_tasks

pytestmark = pytest.mark.desktop


async def test_a_task_played_through_the_object_scores_one_and_refusals_are_typed():
    task = next(t for t in load_tasks().tasks if t.family is None and t.solution)
    async with LocalGym(GymOptions(gym_id="env-test", pool_size=0, max_executions=2)) as gym:
        with pytest.raises(GymError) as info:
            await gym.reset("no-such-task")
        assert info.value.status == 404 and "unknown task" in info.value.detail
        with pytest.raises(GymError) as info:
            await gym.reset(task.task_id, {"options": "x"})
        assert info.value.status == 422 and gym.manager.executions == {}   # refused before any desktop

        ex = await gym.reset(task.task_id)
        eid = ex["execution_id"]
        assert ex["status"] == "running" and gym.describe(eid)["task_id"] == task.task_id
        png, fmt = await gym.screenshot(eid)
        assert fmt == "png" and png.startswith(b"\x89PNG")
        with pytest.raises(GymError) as info:
            await gym.act(eid, {"type": "teleport"})
        assert info.value.status in (400, 422)
        before = await gym.evaluate(eid)
        for action in task.solution:
            assert (await gym.act(eid, action))["ok"]
        after = await gym.evaluate(eid, {"answer_text": task.answer} if task.answer else None)
        assert before["score"] < 1.0 and after["score"] == 1.0 and after["success"], after
        assert (await gym.terminate(eid))["status"] == "terminated"
        with pytest.raises(GymError) as info:
            gym.describe(eid)
        assert info.value.status == 404
        await gym.reset(task.task_id)   # left open: close() must end it
        manager = gym.manager
    assert manager.executions == {}
