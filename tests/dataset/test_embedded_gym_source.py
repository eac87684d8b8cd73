"""The gym task source against the real embedded gym (cua_rl.local_gym) on loopback.

Listing tasks starts no desktop, so this needs no X server."""

import pytest

from cua_rl.config import CUAConfig, TaskSourceConfig
from cua_rl.local_gym.server import start_gym_server
from cua_rl.local_gym.tasks import load_tasks
from cua_rl.dataset import aload_task_datasets


@pytest.fixture(scope="module")
def local_gym():
    gym = start_gym_server()
    yield gym
    gym.stop()


def gym_cfg(gym, **kwargs) -> CUAConfig:
    return CUAConfig(gym_base_url=gym.url, gym_id=gym.gym_id, **kwargs)


async def test_every_embedded_task_becomes_a_row(local_gym):
    defs = {t.task_id: t for t in load_tasks().tasks}
    train, evaluation = await aload_task_datasets(gym_cfg(local_gym, gym_train_ratio=1.0))
    assert evaluation is None and sorted(train["task_id"]) == sorted(defs)
    for row in train:
        task = defs[row["task_id"]]
        assert row["number"] == int(task.number) and row["instruction"] == task.instruction
        assert row["difficulty"] == task.difficulty and task.category in row["tags"]
        assert (row["gym_base_url"], row["gym_id"]) == (local_gym.url, local_gym.gym_id)


async def test_embedded_gym_range_split_tags_and_ids(local_gym):
    defs = load_tasks().tasks
    train, evaluation = await aload_task_datasets(gym_cfg(local_gym, gym_eval_number_range="001-008"))
    assert sorted(evaluation["number"]) == list(range(1, 9))
    assert len(train) == len(defs) - 8
    hard, _ = await aload_task_datasets(gym_cfg(local_gym, gym_tags=["hard"], gym_train_ratio=1.0))
    assert sorted(hard["task_id"]) == sorted(t.task_id for t in defs if t.difficulty == "hard")
    picked = TaskSourceConfig(kind="ids", task_ids=[defs[2].task_id, defs[0].name])
    chosen, _ = await aload_task_datasets(gym_cfg(local_gym, task_source=picked, gym_train_ratio=1.0))
    assert chosen["task_id"] == [defs[2].task_id, defs[0].task_id]


async def test_sources_combined_by_weight_with_their_own_filters_limits_and_gyms(local_gym, tmp_path):
    """Issue 37 item 1: several sources in one list (two gyms, a task file), each with its own tags, difficulty,
    limit and seed, sharing the training rows by weight; a separate eval source, the training sources then
    unsplit."""
    defs = load_tasks().tasks
    with start_gym_server(gym_id="miniwob") as miniwob:
        easy_desktop = TaskSourceConfig(difficulty=["easy"], limit=4, seed=3, weight=1.0)
        web = TaskSourceConfig(gym_base_url=miniwob.url, gym_id="miniwob", limit=2, seed=5, weight=3.0)
        evaluation_source = TaskSourceConfig(kind="ids", task_ids=[defs[0].task_id, defs[1].task_id])
        config = gym_cfg(local_gym, task_sources=[easy_desktop, web], eval_task_source=evaluation_source)
        train, evaluation = await aload_task_datasets(config)
        desktop_rows = [r for r in train if r["gym_id"] == "desktop"]
        web_rows = [r for r in train if r["gym_id"] == "miniwob"]
        # 4 + 2 tasks give 6 rows, shared 1:3 (2 and 4 rows; the web source's 2 tasks cycle twice)
        assert (len(desktop_rows), len(web_rows)) == (2, 4)
        assert {r["gym_base_url"] for r in web_rows} == {miniwob.url} and len({r["task_id"] for r in web_rows}) == 2
        assert all(r["difficulty"] == "easy" for r in desktop_rows)
        assert evaluation["task_id"] == [defs[0].task_id, defs[1].task_id]   # from the eval source, not a split
        # a source's own seed decides its sample: the same seed gives the same tasks, another seed others
        again, _ = await aload_task_datasets(config)
        assert again["task_id"] == train["task_id"]
        from cua_rl.dataset import aload_tasks, choose_splits

        other = TaskSourceConfig(difficulty=["easy"], limit=4, seed=4, weight=1.0)
        tasks = await aload_tasks(config, easy_desktop)
        assert [t.id for t in choose_splits(tasks, config, easy_desktop, whole=True)[0]] != \
            [t.id for t in choose_splits(tasks, config, other, whole=True)[0]]
