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
