"""dataset.py: gym / file / ids task sources, tag filter, splits, limit, rows, errors.

The gym source runs against the genv TEST DOUBLE (tests/doubles/genv_double.py) over real loopback HTTP.
"""

import json

import pytest

from cua_rl.config import CUAConfig, TaskSourceConfig
from cua_rl.dataset import (
    ROW_FEATURES,
    TaskSourceError,
    aload_task_datasets,
    apply_limit,
    choose_splits,
    load_task_datasets,
    read_task_file,
    split_tasks,
)
from cua_rl.genv import Task
from cua_rl.http.serve import free_port
from gym_tasks import numbered_tasks

GYM_ID = "desk"


def cfg(url: str = "", **kwargs) -> CUAConfig:
    return CUAConfig(gym_base_url=url, gym_id=GYM_ID if url else kwargs.pop("gym_id", ""), **kwargs)


def tasks(n: int = 40) -> list[Task]:
    return [Task.from_raw(raw) for raw in numbered_tasks(n)]


# --- the gym source ----------------------------------------------------------------------------
async def test_gym_number_range_split_and_rows(gym_server, gym_state):
    train, evaluation = await aload_task_datasets(cfg(gym_server.url, gym_eval_number_range="001-032"))
    assert sorted(evaluation["number"]) == list(range(1, 33))
    assert sorted(train["number"]) == list(range(33, 41))
    row = next(r for r in train if r["number"] == 33)
    assert row == {"task_id": "t033", "number": 33, "name": "task 33", "instruction": "do thing 33",
                   "description": "describe 33", "tags": ["easy", "gym"], "difficulty": "easy",
                   "gym_base_url": gym_server.url, "gym_id": GYM_ID, "seed_bits": None}
    meta_row = next(r for r in train if r["number"] == 34)
    # meta-schema entry: id from `id`, instruction falls back to the description
    assert (meta_row["task_id"], meta_row["instruction"], meta_row["difficulty"]) == ("uuid-34", "describe 34", "normal")
    assert train.features == ROW_FEATURES
    assert gym_state.requests[0][1] == f"/api/v1/{GYM_ID}/tasks"


async def test_gym_entries_without_instruction_are_fetched_in_full(gym_server, gym_state):
    gym_state.tasks = {"tasks": [{"task_id": "bare-1", "name": "bare"}] + numbered_tasks(3)}
    await aload_task_datasets(cfg(gym_server.url, gym_train_ratio=1.0))
    gets = [path for method, path, *_ in gym_state.requests if method == "GET" and "/tasks/" in path]
    assert gets == [f"/api/v1/{GYM_ID}/tasks/bare-1"]


async def test_ratio_split_is_seeded_disjoint_and_complete(gym_server):
    a_train, a_eval = await aload_task_datasets(cfg(gym_server.url, gym_train_ratio=0.75, gym_seed=7))
    b_train, b_eval = await aload_task_datasets(cfg(gym_server.url, gym_train_ratio=0.75, gym_seed=7))
    c_train, _ = await aload_task_datasets(cfg(gym_server.url, gym_train_ratio=0.75, gym_seed=8))
    assert (len(a_train), len(a_eval)) == (30, 10)
    assert set(a_train["task_id"]) == set(b_train["task_id"]) and set(a_eval["task_id"]) == set(b_eval["task_id"])
    assert not set(a_train["task_id"]) & set(a_eval["task_id"])
    assert len(set(a_train["task_id"]) | set(a_eval["task_id"])) == 40
    assert set(c_train["task_id"]) != set(a_train["task_id"])


def test_ratio_split_ignores_listing_order():
    forward, backward = tasks(), list(reversed(tasks()))
    a = split_tasks(forward, eval_number_range=None, train_ratio=0.5, seed=3)
    b = split_tasks(backward, eval_number_range=None, train_ratio=0.5, seed=3)
    assert {t.id for t in a[0]} == {t.id for t in b[0]} and len(a[0]) == 20
    assert [t.id for t in a[0]] == [t.id for t in forward if t in a[0]]  # source order kept


def test_ratio_split_keeps_one_task_on_each_side():
    train, evaluation = split_tasks(tasks(2), eval_number_range=None, train_ratio=0.9, seed=0)
    assert (len(train), len(evaluation)) == (1, 1)
    train, evaluation = split_tasks(tasks(5), eval_number_range=None, train_ratio=1.0, seed=0)
    assert (len(train), len(evaluation)) == (5, 0)


def test_number_range_list_and_unnumbered_tasks_train():
    items = tasks(10) + [Task.from_raw({"task_id": "abc", "name": "no number"})]
    train, evaluation = split_tasks(items, eval_number_range="1-2,9", train_ratio=0.8, seed=0)
    assert sorted(t.number for t in evaluation) == [1, 2, 9]
    assert "abc" in {t.id for t in train} and len(train) == 8


async def test_tags_filter_is_case_insensitive(gym_server):
    train, evaluation = await aload_task_datasets(cfg(gym_server.url, gym_tags=["HARD"], gym_train_ratio=1.0))
    assert evaluation is None  # ratio 1.0: nothing left for eval
    assert len(train) == 13 and all(r["difficulty"] == "hard" for r in train)
    two, _ = await aload_task_datasets(cfg(gym_server.url, gym_tags="easy,normal", gym_train_ratio=1.0))
    assert {r["difficulty"] for r in two} == {"easy", "normal"} and len(two) == 27


def test_unknown_tag_names_the_tags_present():
    with pytest.raises(TaskSourceError, match=r"tags present: \['easy', 'gym', 'hard', 'normal'\]"):
        choose_splits(tasks(), cfg(gym_tags=["nosuch"]))


def test_limit_caps_each_split_with_a_seeded_sample():
    train, evaluation = choose_splits(tasks(), cfg(gym_eval_number_range="001-032", gym_limit=5, gym_seed=1))
    assert len(train) == 5 and len(evaluation) == 5
    again, _ = choose_splits(tasks(), cfg(gym_eval_number_range="001-032", gym_limit=5, gym_seed=1))
    assert [t.id for t in again] == [t.id for t in train]
    numbers = [t.number for t in evaluation]
    assert numbers == sorted(numbers) and all(1 <= n <= 32 for n in numbers)  # order kept
    assert apply_limit(tasks(3), 10, 0) == tasks(3)


def test_split_type_picks_what_trains():
    train, evaluation = choose_splits(tasks(), cfg(gym_eval_number_range="1-4", gym_split_type="eval"))
    assert [t.number for t in train] == [1, 2, 3, 4] == [t.number for t in evaluation]
    train, evaluation = choose_splits(tasks(), cfg(gym_eval_number_range="1-4", gym_split_type="all"))
    assert len(train) == 40 and len(evaluation) == 4


def test_empty_training_split_is_an_error():
    with pytest.raises(TaskSourceError, match="training split is empty"):
        choose_splits(tasks(5), cfg(gym_eval_number_range="1-99"))


async def test_empty_gym_is_an_error(gym_server, gym_state):
    gym_state.tasks = {"tasks": []}
    with pytest.raises(TaskSourceError, match=f"gym '{GYM_ID}' at .* lists no tasks"):
        await aload_task_datasets(cfg(gym_server.url))


async def test_unreachable_gym_is_a_clear_error():
    url = f"http://127.0.0.1:{free_port()}"  # a port nobody listens on
    with pytest.raises(TaskSourceError, match="cannot list the tasks of gym 'desk'.*cannot reach gym"):
        await aload_task_datasets(cfg(url))


async def test_gym_source_needs_url_and_id():
    with pytest.raises(TaskSourceError, match="needs gym_base_url and gym_id"):
        await aload_task_datasets(cfg())


def test_sync_loader(gym_server):
    train, evaluation = load_task_datasets(cfg(gym_server.url, gym_eval_number_range="1-10"))
    assert (len(train), len(evaluation)) == (30, 10)


# --- explicit ids ------------------------------------------------------------------------------
async def test_ids_match_id_name_or_number_in_request_order(gym_server):
    source = TaskSourceConfig(kind="ids", task_ids=["uuid-4", "task 7", "011", "t001"])
    train, evaluation = await aload_task_datasets(cfg(gym_server.url, task_source=source, gym_train_ratio=1.0))
    assert train["task_id"] == ["uuid-4", "t007", "t011", "t001"] and evaluation is None


async def test_repeat_lists_each_training_task_n_times_and_not_the_eval_split(gym_server):
    source = TaskSourceConfig(kind="ids", task_ids=["t001", "t003", "t005", "t007"], repeat=3)
    train, evaluation = await aload_task_datasets(cfg(gym_server.url, task_source=source, gym_train_ratio=0.75,
                                                      gym_seed=1))
    assert len(train) == 9 and len(set(train["task_id"])) == 3
    assert all(train["task_id"].count(t) == 3 for t in set(train["task_id"]))
    assert len(evaluation) == 1
    with pytest.raises(ValueError, match="repeat must be >= 1"):
        TaskSourceConfig(kind="ids", task_ids=["t001"], repeat=0)


async def test_unknown_ids_are_an_error_not_a_substitute(gym_server):
    source = TaskSourceConfig(kind="ids", task_ids=["t001", "nope", "999"])
    with pytest.raises(TaskSourceError, match=r"not found on the gym: nope, 999"):
        await aload_task_datasets(cfg(gym_server.url, task_source=source))


# --- task files --------------------------------------------------------------------------------
def file_cfg(path, **kwargs) -> CUAConfig:
    return cfg(task_source=TaskSourceConfig(kind="file", task_file=str(path)), gym_train_ratio=1.0, **kwargs)


async def test_jsonl_file(tmp_path):
    path = tmp_path / "tasks.jsonl"
    lines = ["# my tasks", ""] + [json.dumps(t) for t in numbered_tasks(4)]
    path.write_text("\n".join(lines) + "\n")
    train, evaluation = await aload_task_datasets(file_cfg(path))
    assert train["task_id"] == ["t001", "uuid-2", "t003", "uuid-4"] and evaluation is None
    assert train["gym_id"] == [""] * 4  # no gym configured: rows say so rather than invent one


async def test_yaml_file_list_and_mapping(tmp_path):
    listed = tmp_path / "list.yaml"
    listed.write_text("- task_id: a1\n  instruction: open the editor\n  tags: [easy]\n- task_id: a2\n  name: two\n")
    mapped = tmp_path / "map.yml"
    mapped.write_text("tasks:\n  - {task_id: b1, task_number: '7', instruction: x}\n")
    train, _ = await aload_task_datasets(file_cfg(listed))
    assert train["task_id"] == ["a1", "a2"] and train["difficulty"] == ["easy", None]
    assert train["instruction"] == ["open the editor", "two"]
    train, _ = await aload_task_datasets(file_cfg(mapped))
    assert train["number"] == [7]


def test_json_array_file(tmp_path):
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps(numbered_tasks(2), indent=1))
    assert [t.id for t in read_task_file(path)] == ["t001", "uuid-2"]


@pytest.mark.parametrize("name, text, message", [
    ("bad.jsonl", '{"task_id": "a"}\n{"task_id": \n', r"bad.jsonl:2: not valid JSON"),
    ("noid.jsonl", '{"task_id": "a"}\n\n{"name": "x"}\n', r"noid.jsonl:3: task has no id"),
    ("list.jsonl", '["a"]\n', r"list.jsonl:1: task entry is not an object"),
    ("dup.jsonl", '{"task_id": "a"}\n{"id": "a"}\n', r"dup.jsonl:2: duplicate task id 'a' \(first at line 1\)"),
    ("bad.yaml", "- task_id: a\n- task_id: [b\n", r"bad.yaml:\d+: not valid YAML"),
    ("noid.yaml", "- task_id: a\n- name: b\n  tags: [x]\n", r"noid.yaml:2: task has no id"),
    ("scalar.yaml", "just text\n", r"scalar.yaml: expected a list of tasks"),
    ("empty.jsonl", "\n# nothing\n", r"empty.jsonl holds no tasks"),
    ("tasks.txt", "a\n", r"unknown format '.txt'"),
])
def test_malformed_files_name_file_and_line(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TaskSourceError, match=message):
        read_task_file(path)


def test_missing_file(tmp_path):
    with pytest.raises(TaskSourceError, match="cannot read task file"):
        read_task_file(tmp_path / "absent.jsonl")


def test_a_list_of_sources_and_an_eval_source_load_from_a_users_config(tmp_path):
    """task_sources / eval_task_source as a user writes them: YAML in a config of their own, or an override."""
    from cua_rl.run.launch import RECIPES, ConfigError, load_config

    mine = tmp_path / "mine.yaml"
    mine.write_text("defaults:\n  - config.cpu\n  - _self_\nhydra:\n  searchpath:\n    - pkg://cua_rl.recipes\n"
                    "task_sources:\n  - {difficulty: [easy], limit: 4, seed: 3}\n"
                    "  - {kind: file, task_file: tasks.yaml, weight: 2.0, gym_base_url: 'http://phone:5010', gym_id: android}\n"
                    "eval_task_source: {kind: ids, task_ids: ['001']}\n")
    config = load_config(str(mine), ["gym_base_url=http://127.0.0.1:9", f"cluster.fileroot={tmp_path}"])
    first, second = config.task_sources
    assert (first.difficulty, first.limit, first.seed, first.weight) == (["easy"], 4, 3, 1.0)
    assert (second.kind, second.weight, second.gym_id) == ("file", 2.0, "android")
    assert config.eval_task_source.task_ids == ["001"]
    with pytest.raises(ConfigError, match="weight must be > 0"):
        load_config(str(RECIPES / "config.cpu.yaml"), ["gym_base_url=http://127.0.0.1:9", f"cluster.fileroot={tmp_path}",
                                                       "task_sources=[{kind:gym,weight:0}]"])


# --- instance seeds within what the gym takes (issue 83 item 3) ---------------------------------
def _seeds(row: dict, *, is_eval: bool, groups: int = 4, n: int = 4) -> list[int]:
    """The seeds the workflow sends the gym for ``groups`` groups of ``n`` episodes of ``row``
    (``cua_rl.workflow.seeding``, what ``CUAAgentWorkflow.episode_seeds`` calls), training rows at stream
    indices 0..groups-1."""
    import collections

    from cua_rl.runs import STREAM_KEY
    from cua_rl.workflow.seeding import group_seeds

    run: collections.Counter = collections.Counter()
    return [seed for k in range(groups)
            for seed in group_seeds(1, object(), {**row, **({} if is_eval else {STREAM_KEY: k})}, n,
                                    is_eval=is_eval, groups_run=run)]


async def test_right_credit_3_held_out_seeds_fit_a_gym_that_declares_no_larger_seeds(gym_server, gym_state):
    """A gym that declares no ``seed_bits`` (the genv double's tasks, listed over HTTP like any third-party
    gym's) gets held-out seeds within 31 bits, apart from its training seeds; a gym that declares more keeps
    them within what it declares; our gyms (53 bits) keep the curriculum's held-out seeds and the 31-bit
    training hashes they were calibrated with."""
    import hashlib

    from cua_rl.dataset import own_gym_tasks, task_row
    from cua_rl.local_gym import curriculum

    train, evaluation = await aload_task_datasets(cfg(gym_server.url, gym_eval_number_range="001-032"))
    row = evaluation[0]
    assert row["seed_bits"] is None
    held_out, trained = _seeds(row, is_eval=True), _seeds(row, is_eval=False, groups=200)
    assert len(set(held_out)) == 16 and max(held_out) < 2 ** 31, f"held-out seeds past 31 bits: {held_out[:3]}"
    assert not set(held_out) & set(trained) and max(trained) < min(held_out), (min(held_out), max(trained))

    wider = task_row(Task.from_raw({**numbered_tasks(1)[0], "seed_bits": 36}), gym_server.url, GYM_ID)
    held_out, trained = _seeds(wider, is_eval=True), _seeds(wider, is_eval=False, groups=200)
    assert min(held_out) >= 2 ** 31 > max(trained) and max(held_out) < 2 ** 36, held_out

    for gym_id in ("desktop", "miniwob"):
        ours = task_row(own_gym_tasks(gym_id)[0], "", gym_id)
        assert ours["seed_bits"] == curriculum.SEED_BITS == 53, gym_id
        assert _seeds(ours, is_eval=True) == curriculum.heldout_seeds(16), gym_id
        calibrated = [int.from_bytes(hashlib.sha256(f"1:stream:{ours['task_id']}:0:{k}".encode()).digest()[:4],
                                     "big") & 0x7FFFFFFF for k in range(4)]
        assert _seeds(ours, is_eval=False, n=1) == calibrated, gym_id
