"""The gym task source against the real embedded gym (cua_rl.local_gym) on loopback.

Listing tasks starts no desktop, so this needs no X server."""

import pytest

from cua_rl.config import CUAConfig, TaskSourceConfig
from cua_rl.dataset import aload_task_datasets
from cua_rl.local_gym.server import start_gym_server
from cua_rl.local_gym.tasks import load_tasks


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


# A task written in a training config (issue 37 item 1): the embedded gym's task-file schema, inline.
CUSTOM = {"number": "950", "name": "editor-write-hello", "category": "text_editor", "difficulty": "easy",
          "instruction": "The file notes.txt is open in the text editor. Make it read exactly hello and save it.",
          "setup": {"files": {"notes.txt": ""}, "apps": [{"app": "mousepad", "args": ["notes.txt"]}]},
          "validators": [{"id": "hello", "type": "file_equals", "path": "notes.txt", "text": "hello"}],
          "solution": [{"type": "type", "text": "hello"}, {"type": "key", "keys": ["ctrl", "s"]},
                       {"type": "wait", "ms": 300}]}


@pytest.mark.desktop
async def test_tasks_written_in_the_config_are_served_rowed_and_scored_by_the_embedded_gym():
    """``task_source.kind: custom``: tasks written in the config (instruction, setup, validators), combined
    with the gym's own by weight. The embedded gym the launcher starts serves them beside its built-in tasks
    (``extra_tasks``); rows name them; the reference solution scores 1 through the HTTP API, untouched below 1."""
    from cua_rl.genv import GenvClient

    custom = TaskSourceConfig(kind="custom", tasks=[CUSTOM], weight=1.0)
    easy = TaskSourceConfig(difficulty=["easy"], limit=2, seed=1, weight=1.0)
    assert custom.task_ids == ["950-editor-write-hello"]
    served = CUAConfig(task_sources=[custom, easy]).custom_tasks()
    with start_gym_server(extra_tasks=served, pool_size=0) as gym:
        train, _ = await aload_task_datasets(gym_cfg(gym, task_sources=[custom, easy], gym_train_ratio=1.0))
        rows = [r for r in train if r["task_id"] == "950-editor-write-hello"]
        assert rows and rows[0]["instruction"] == CUSTOM["instruction"] and rows[0]["gym_id"] == "desktop"
        assert len({r["task_id"] for r in train}) == 3, "the custom task and two of the gym's own"
        async with GenvClient(gym.url, gym.gym_id) as client:
            async with client.execution("950-editor-write-hello") as ex:
                untouched = await client.evaluate(ex.execution_id)
                for action in CUSTOM["solution"]:
                    assert (await client.act(ex.execution_id, action))["ok"]
                solved = await client.evaluate(ex.execution_id)
    assert untouched.reward < 1.0 and solved.reward == 1.0


def test_a_bad_task_in_the_config_is_named_and_a_users_gym_cannot_serve_one(tmp_path):
    """A task written in the config is checked when the config loads (the gym's own schema), the error naming
    it; the launcher refuses custom tasks on a gym it does not start, and a custom task may not reuse a
    built-in task's number."""
    from cua_rl.run.launch import ConfigError, _check_custom_tasks

    named = r"(?s)task_source.tasks \[0\] \(950-editor-write-hello\).*unknown validator type .nope."
    with pytest.raises(ValueError, match=named):
        TaskSourceConfig(kind="custom", tasks=[{**CUSTOM, "validators": [{"id": "h", "type": "nope"}]}])
    with pytest.raises(ValueError, match="kind=custom needs its tasks"):
        TaskSourceConfig(kind="custom")
    config = CUAConfig(gym_base_url="http://gym.example:8000", gym_id="desktop",
                       task_source=TaskSourceConfig(kind="custom", tasks=[CUSTOM]))
    with pytest.raises(ConfigError, match="embedded desktop gym only, not on the gym at http://gym.example:8000"):
        _check_custom_tasks(config)
    _check_custom_tasks(CUAConfig(task_source=TaskSourceConfig(kind="custom", tasks=[CUSTOM])))   # embedded: fine
    clash = {**CUSTOM, "number": "001"}
    with pytest.raises(ValueError, match="duplicate task key '001'"):
        start_gym_server(extra_tasks=[clash], pool_size=0)
