"""LocalGym without HTTP (Gymnasium's shape): reset, screenshot, act, evaluate, terminate on a real desktop,
refusals as GymError with the status the genv API answers, and close ending every desktop."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from cua_rl.local_gym import GymError, GymOptions, LocalGym, keyboard_suite as K, load_tasks
from gym_helpers import names
from tests.hosts import descendants

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


def _mousepad_pids() -> set[int]:
    """The mousepad processes below this test process (the gym runs in-process)."""
    return {pid for pid, name in names(descendants([os.getpid()])).items() if name == "mousepad"}


async def test_an_enter_after_typing_waits_for_the_client_to_have_taken_the_keys():
    """A new document's Save As turns its Save sensitive 300 ms (of the editor's clock) after the last typed
    letter, and an Enter read before that is dropped. The Enter must save when sent with the name
    ("today.txt\\n"); when the editor is stopped while the name is typed (its keys taken late: the gap is timed
    from its answer to a ping, not from when the keys were sent); and when it is stopped after taking them,
    before its timer ran (the Enter waits for a ping answered after the gap, so the timer fires first)."""
    task = K.suite_task("desktop", 1)        # keys-filename-01: mousepad, a new document, saved as today.txt
    opening = task["solution"][:4]           # type the sentence, ctrl+s, wait, ctrl+a (Save As, name selected)
    name = task["solution"][4]["text"]

    async def save(gym, stop_before_name: bool, stop_before_enter: bool) -> float:
        eid = (await gym.reset(task["name"]))["execution_id"]
        for action in opening:
            assert (await gym.act(eid, action))["ok"]
        (editor,) = _mousepad_pids()
        loop = asyncio.get_running_loop()
        resume = None
        try:
            if not (stop_before_name or stop_before_enter):
                assert (await gym.act(eid, {"type": "type", "text": name + "\n"}))["ok"]
            else:
                if stop_before_name:
                    os.kill(editor, signal.SIGSTOP)
                    resume = loop.call_later(0.6, os.kill, editor, signal.SIGCONT)
                assert (await gym.act(eid, {"type": "type", "text": name}))["ok"]
                if stop_before_enter:
                    os.kill(editor, signal.SIGSTOP)
                    resume = loop.call_later(0.8, os.kill, editor, signal.SIGCONT)
                assert (await gym.act(eid, {"type": "key", "keys": ["enter"]}))["ok"]
        finally:
            if resume:
                resume.cancel()
            os.kill(editor, signal.SIGCONT)
        # the save lands a moment after its Enter (GTK looks the name up on a worker thread first: 0.5-0.8 s on a
        # loaded machine, past the 500 ms this waited; gym_helpers.evaluation_within): a lost Enter stays 0
        deadline = time.monotonic() + 5.0
        while (score := (await gym.evaluate(eid))["score"]) < 1.0 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await gym.terminate(eid)
        return score

    async with LocalGym(GymOptions(gym_id="enter-test", pool_size=0, max_executions=2),
                        tasks=load_tasks(extra=[task])) as gym:
        assert await save(gym, False, False) == 1.0, "the name and its Enter in one action did not save"
        assert await save(gym, True, False) == 1.0, "an Enter after keys an editor took late was lost"
        assert await save(gym, False, True) == 1.0, "an Enter to an editor stopped before its timer ran was lost"


async def test_right_credit_4_a_gym_fault_is_unrecovered_until_the_next_call_is_served(monkeypatch):
    """The evaluate answer's ``faults.gym_unrecovered`` (docs/protocols.md 1.4): a screenshot the X server failed
    counts as the gym's, and once the agent's next screenshot is served it is recovered from (0); a failed action
    the execution ends on stays unrecovered, which is what drops an episode (cua_rl.workflow.episode)."""
    task = next(t for t in load_tasks().tasks if t.family is None and t.solution)
    async with LocalGym(GymOptions(gym_id="env-faults", pool_size=0, max_executions=1)) as gym:
        eid = (await gym.reset(task.task_id))["execution_id"]

        async def x_gone(*args, **kwargs):   # the desktop's screen unreadable, connections opened again or not
            raise OSError("X connection broken")

        with monkeypatch.context() as patch:
            patch.setattr(gym, "_frame_now", x_gone)
            with pytest.raises(GymError) as info:
                await gym.screenshot(eid)
            assert info.value.status == 503 and info.value.fault == "gym"
        assert (await gym.evaluate(eid))["faults"] == {"gym": 1, "policy": 0, "gym_unrecovered": 1}
        await gym.screenshot(eid)   # the agent's retry, served
        assert (await gym.evaluate(eid))["faults"] == {"gym": 1, "policy": 0, "gym_unrecovered": 0}
        with monkeypatch.context() as patch:
            patch.setattr(gym, "_input", lambda *a, **kw: (_ for _ in ()).throw(OSError("BadWindow")))
            answer = await gym.act(eid, task.solution[0])
        assert answer["ok"] is False and answer["fault"] == "gym", answer
        assert (await gym.evaluate(eid))["faults"] == {"gym": 2, "policy": 0, "gym_unrecovered": 1}
