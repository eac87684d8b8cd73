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
            # nothing typed yet: only "kept-old" (weight 1 of 4) passes
            assert ev.reward == pytest.approx(0.25) and ev.success is False
            assert {v.id for v in ev.validators} == {"has-line", "kept-old", "exact"}
        with pytest.raises(GenvError) as gone:
            await gym.get_execution(ex.execution_id)
        assert gone.value.status_code == 404
