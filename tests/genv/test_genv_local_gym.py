"""GenvClient against the REAL embedded gym (cua_rl.local_gym) on loopback: the client and the server
agree on every endpoint, the evaluate reply parses into the reward the validators imply, and the
execution is terminated by ``GenvClient.execution`` (a later read is a 404)."""

import pytest

from cua_rl.genv import GenvClient, GenvError

pytestmark = pytest.mark.desktop

TASK = "001-editor-append-line"


@pytest.fixture(scope="module")
def local_gym():
    from cua_rl.local_gym.server import start_gym_server

    server = start_gym_server(gym_id="desktop", width=640, height=400, pool_size=0, max_spares=0)
    yield server
    server.stop()


async def test_client_roundtrip_on_real_gym(local_gym):
    async with GenvClient(local_gym.url, local_gym.gym_id) as gym:
        tasks = {t.id: t for t in await gym.list_tasks()}
        task = tasks[TASK]
        assert task.number == 1 and task.difficulty == "easy" and "Buy milk" in task.instruction
        assert (await gym.get_task(TASK)).evaluation is not None
        async with gym.execution(TASK) as ex:
            info = await gym.get_execution(ex.execution_id)
            assert info["screen"] == {"width": 640, "height": 400}
            png = await gym.screenshot(ex.execution_id)
            assert png.startswith(b"\x89PNG")
            assert (await gym.act(ex.execution_id, {"type": "wait", "ms": 10}))["ok"] is True
            with pytest.raises(GenvError) as bad:
                await gym.act(ex.execution_id, {"type": "teleport"})
            assert 400 <= bad.value.status_code < 500 and bad.value.detail
            ev = await gym.evaluate(ex.execution_id, answer_text="not done")
            # nothing typed yet: the task is not solved, and the gym's total score is the weighted
            # share of passing validators, which is what our parser reads from the same reply
            assert ev.source == "result.score" and ev.success is False and ev.reward < 1.0
            assert "has-line" in {v.id for v in ev.validators}
            weights = sum(v.weight for v in ev.validators)
            assert ev.reward == pytest.approx(sum(v.weight for v in ev.validators if v.passed) / weights)
        with pytest.raises(GenvError) as gone:
            await gym.get_execution(ex.execution_id)
        assert gone.value.status_code == 404
