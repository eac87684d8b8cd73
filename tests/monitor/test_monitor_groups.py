"""The Training Monitor's view of a step's GRPO groups, from the workflow's own reports: our monitor server on
real storage (SQLite and PostgreSQL, tests/monitor/conftest.py), the real workflow and reporter; the episodes are
scripted (tests/doubles/scripted_episodes.py), since what is tested is what the workflow reports of them."""

import asyncio

import httpx
import pytest
from areal.api.cli_args import GenerationHyperparameters

from cua_rl.monitor import training_run
from cua_rl.policy import close_loop_servers
from cua_rl.runs import STREAM_KEY
from cua_rl.workflow import CUAAgentWorkflow, MonitorTarget
from cua_rl.workflow.worker import forget_workers
from tests.doubles.policy_helpers import EngineDouble
from tests.doubles.scripted_episodes import install
from tests.sections import workflow_args


class Engine(EngineDouble):
    def get_version(self):
        return 0


def test_right_data_11_each_group_shows_apart_with_the_values_it_trained(our_monitor, tiny_model_dir, processor,
                                                                         monkeypatch):
    """Three groups of one task at one policy version (two training rows with stream indices, one without):
    the step's group view shows three groups of four, and each member's advantage (and each of its turns') is
    the value its rows trained with (the batch's ``rewards``: group-normalised, episode- and group-weighted),
    not the bare normalised reward."""
    monitor, token = our_monitor
    monkeypatch.setenv("PROJECT_TOKEN", token)
    install(monkeypatch, {"a": [(1, 1.0), (3, 0.0), (2, 0.0), (3, 1.0)]})
    rows = [{"task_id": "a", "instruction": "x", STREAM_KEY: 0}, {"task_id": "a", "instruction": "x", STREAM_KEY: 1},
            {"task_id": "a", "instruction": "x"}]
    forget_workers()

    async def groups(wf):
        try:
            batches = [await wf.arun_episode(Engine(processor.tokenizer), row) for row in rows]
            await wf.monitor_flush(30)
            return batches
        finally:
            await close_loop_servers()

    with training_run(monitor.url, "p1", "cua", "right-data-11", token=token) as training_id:
        wf = CUAAgentWorkflow(**workflow_args(
            gconfig=GenerationHyperparameters(max_new_tokens=8), model={"path": tiny_model_dir},
            gym={"base_url": "http://127.0.0.1:9", "gym_id": "g"}, agent={"base_url": "http://127.0.0.1:9"},
            group_size=4, monitor=MonitorTarget(base_url=monitor.url, project_id="p1", training_id=training_id)))
        batches = asyncio.run(groups(wf))
    # the value each episode trained with: its first row's reward (one row per turn, no discount)
    turns = [1, 3, 2, 3]
    starts = [sum(turns[:i]) for i in range(4)]
    trained = [[float(b["rewards"][s]) for s in starts] for b in batches]
    assert trained[0][0] != pytest.approx(1.0)           # weighted: not the bare normalised reward (+1.0 here)

    [step] = httpx.get(f"{monitor.url}/api/trainings/{training_id}").json()["steps"]
    view = httpx.get(f"{monitor.url}/api/steps/{step['id']}").json()["groups"]
    assert sorted(len(g["members"]) for g in view) == [4, 4, 4], [g["group_id"] for g in view]
    assert len({g["group_id"] for g in view}) == 3
    for group in view:
        members = sorted(group["members"], key=lambda m: m["env_index"])
        assert [m["advantage"] for m in members] == pytest.approx(trained[0], rel=1e-6)
        for member in members:
            rollout = httpx.get(f"{monitor.url}/api/rollouts/{member['id']}").json()
            assert [t["advantage"] for t in rollout["turns"]] == pytest.approx([member["advantage"]] * member["num_turns"])


def test_a_tree_groups_members_show_as_a_tree(tmp_path):
    """A tree group's rollouts (cua_rl/workflow/tree.py) name the rollout each was forked from in their summary:
    the group view lists each parent before the paths forked from it, with the turn each starts at and its depth;
    a plain group's members come as before."""
    import json

    from sqlalchemy import insert

    from cua_rl.monitor.schema import TABLES, projects
    from cua_rl.monitor.store import Store, sqlite_url
    from cua_rl.monitor.views import groups

    store = Store.open(sqlite_url(tmp_path / "monitor.db"))
    tree = [("r0", 0, {"tree_path": 0, "tree_first_turn": 1}), ("r1", 1, {"tree_path": 1, "tree_first_turn": 1}),
            ("c2", 2, {"tree_path": 2, "tree_first_turn": 2, "tree_parent": "r1"}),
            ("c3", 3, {"tree_path": 3, "tree_first_turn": 3, "tree_parent": "c2"}),
            ("c4", 4, {"tree_path": 4, "tree_first_turn": 2, "tree_parent": "r0"})]
    with store.engine.begin() as conn:
        conn.execute(insert(projects).values(id=1, name="p", created_at="now"))
        conn.execute(insert(TABLES["steps"]).values(id=1, project_id=1, client_id="s0", step=0))
        for i, (client, index, summary) in enumerate(tree, 1):
            conn.execute(insert(TABLES["rollouts"]).values(
                id=i, project_id=1, client_id=client, step_id=1, is_eval=False, group_id="tree", env_index=index,
                status="completed", reward=1.0, summary_json=json.dumps(summary)))
        conn.execute(insert(TABLES["rollouts"]).values(id=9, project_id=1, client_id="plain", step_id=1,
                                                       is_eval=False, group_id="grpo", env_index=0, status="completed",
                                                       reward=0.0, summary_json=json.dumps({"seed": 1})))
    view = {g["group_id"]: g["members"] for g in groups(store, "steps", 1)["groups"]}
    store.close()
    assert [(m["client_id"], m["tree"]["parent"], m["tree"]["first_turn"], m["tree"]["depth"]) for m in view["tree"]] \
        == [("r0", None, 1, 0), ("c4", 1, 2, 1), ("r1", None, 1, 0), ("c2", 2, 2, 1), ("c3", 3, 3, 2)]
    assert ["tree" in m or "summary_json" in m for m in view["grpo"]] == [False]
