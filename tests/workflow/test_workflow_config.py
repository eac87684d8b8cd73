"""train.py's wiring without services: config -> workflow kwargs -> a workflow AReaL can rebuild."""

import pickle
from pathlib import Path

import pytest
from areal.api.cli_args import load_expr_config

from cua_rl.config import CUAConfig
from cua_rl.workflow import CUAAgentWorkflow, workflow_kwargs
from tests.sections import workflow_args

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cua_agent"


@pytest.mark.parametrize("name", ["config.yaml", "config.cpu.yaml"])
def test_kwargs_from_shipped_configs_build_a_serialisable_workflow(name, tmp_path, monkeypatch):
    monkeypatch.setenv("CUA_RL_FILEROOT", str(tmp_path))
    config, _ = load_expr_config(["--config", str(EXAMPLE / name), "gym_base_url=http://127.0.0.1:5010",
                                  "gym_id=desktop"], CUAConfig)
    kwargs = workflow_kwargs(config, config.gconfig.new(n_samples=1), config.gconfig.n_samples)
    pickle.loads(pickle.dumps(kwargs))  # AReaL ships workflow kwargs to rollout workers
    wf = CUAAgentWorkflow(**kwargs)
    assert wf.group_size == config.gconfig.n_samples >= 2 and wf.min_group_size == 2
    assert wf.settings.max_pixels == config.policy.max_pixels
    assert wf.settings.max_screenshots_in_history == config.policy.max_screenshots_in_history
    assert wf.settings.bind_host == config.policy.bind_host
    assert wf.agent.agent == config.gbox_mini_agent_agent and wf.limits.max_turns == config.max_turns
    assert (wf.gym.base_url, wf.gym.gym_id, wf.model.path) == ("http://127.0.0.1:5010", "desktop", config.actor.path)
    # the design decision the config must keep: groups are normalised by the workflow, not by AReaL
    assert config.actor.reward_norm is None


def test_trajectory_section_reaches_the_workflow(tmp_path, monkeypatch):
    monkeypatch.setenv("CUA_RL_FILEROOT", str(tmp_path))
    config, _ = load_expr_config(["--config", str(EXAMPLE / "config.yaml"), "gym_base_url=http://127.0.0.1:5010",
                                  "gym_id=desktop", "trajectory.turn_discount=0.9", "trajectory.scale_by_std=false",
                                  "trajectory.min_group_size=3", "trajectory.group_weight=tokens"], CUAConfig)
    wf = CUAAgentWorkflow(**workflow_kwargs(config, config.gconfig.new(n_samples=1), 4))
    t = wf.trajectory
    assert (t.turn_discount, t.scale_by_std, t.group_weight, wf.min_group_size) == (0.9, False, "tokens", 3)
    assert t.normalise_in_group is True
    config, _ = load_expr_config(["--config", str(EXAMPLE / "config.yaml"), "gym_base_url=http://127.0.0.1:5010",
                                  "gym_id=desktop", "trajectory.export_style=concat"], CUAConfig)
    wf = CUAAgentWorkflow(**workflow_kwargs(config, config.gconfig.new(n_samples=1), 4))
    assert wf.trajectory.export_style == "concat"


def test_bad_settings_fail_at_construction():
    from areal.api.cli_args import GenerationHyperparameters

    base = workflow_args(gconfig=GenerationHyperparameters(), model={"path": "/nonexistent"},
                         gym={"base_url": "http://x", "gym_id": "g"}, agent={"base_url": "http://y"})
    with pytest.raises(ValueError):
        CUAAgentWorkflow(**{**base, "group_size": 0})
    with pytest.raises(ValueError):
        CUAAgentWorkflow(**base, policy={"no_such_setting": 1})
    with pytest.raises(ValueError, match="poll_interval_s"):
        CUAAgentWorkflow(**{**base, "agent": {**vars(base["agent"]), "poll_interval_s": 0}})
    with pytest.raises(TypeError):   # a flat keyword of the old signature is refused, not ignored
        CUAAgentWorkflow(**base, max_turns=3)
    with pytest.raises(TypeError, match="max_task_time_seconds"):   # a section names every field: no defaults
        CUAAgentWorkflow(**{**base, "limits": {"max_turns": 3}})
    with pytest.raises(TypeError, match="EpisodeLimits section is required"):
        CUAAgentWorkflow(**{**base, "limits": None})


def test_group_seeds_are_shared_reproducible_and_differ_between_groups():
    from areal.api.cli_args import GenerationHyperparameters

    from cua_rl.workflow import CUAAgentWorkflow
    from cua_rl.workflow.worker import forget_workers

    class Engine:
        version = 3

        def get_version(self):
            return self.version

    def workflow(**kw):
        return CUAAgentWorkflow(**workflow_args(
            gconfig=GenerationHyperparameters(), model={"path": "m"},
            gym={"base_url": "http://g", "gym_id": "g", **kw.pop("gym", {})}, agent={"base_url": "http://a"},
            group_size=4, seed=5, **kw))

    engine, row = Engine(), {"task_id": "click-test", "instruction": "x"}
    forget_workers()                     # a fresh process
    a = workflow()
    first = [a.group_seed(engine, row) for _ in range(3)]
    assert len(set(first)) == 3, "groups of one task at one version need different instances"
    # AReaL builds a new workflow object per submitted task: the next one continues the process's count
    assert workflow().group_seed(engine, row) not in first, "a new workflow object repeated an instance"
    forget_workers()                     # another run of the same experiment
    assert first == [workflow().group_seed(engine, row) for _ in range(3)], "seeds must reproduce across runs"
    engine.version = 4
    assert a.group_seed(engine, row) not in first
    assert a.group_seed(engine, {**row, "task_id": "click-button"}) != a.group_seed(engine, row)
    assert all(0 <= s < 2 ** 31 for s in first)
    forget_workers()
    ev = workflow(is_eval=True).episode_seeds(engine, row)
    forget_workers()                     # the next evaluation (a fresh process here): the same instances
    assert workflow(is_eval=True).episode_seeds(engine, row) == ev, "evaluation instances must not move"
    assert a.group_seed(engine, {**row, "seed": 11}) == 11
    assert workflow(gym={"seed_instances": False}).group_seed(engine, row) is None


def test_groups_dealt_round_robin_to_four_rollout_workers_never_share_an_instance():
    """AReaL deals the loader's rows to its rollout workers round-robin (``dp_size`` 4 here), each worker a
    process with counts of its own. A task repeated in the stream (``task_source.repeat``) must still get a
    new instance in every group: the seed follows the row's stream index, not a per-process count."""
    from areal.api.cli_args import GenerationHyperparameters

    from cua_rl.runs import STREAM_KEY
    from cua_rl.workflow import CUAAgentWorkflow
    from cua_rl.workflow.worker import forget_workers

    class Engine:
        def get_version(self):
            return 0

    stream = [{"task_id": task, "instruction": "x", STREAM_KEY: i}
              for i, task in enumerate(["a", "b"] * 8)]            # 2 tasks, each 8 times, one step's read-ahead
    seeds = {}
    for worker in range(4):
        forget_workers()                          # a rollout worker is a fresh process
        wf = CUAAgentWorkflow(**workflow_args(gconfig=GenerationHyperparameters(), model={"path": "m"},
                                              gym={"base_url": "http://g", "gym_id": "g"},
                                              agent={"base_url": "http://a"}, group_size=4, seed=5))
        seeds.update({row[STREAM_KEY]: wf.group_seed(Engine(), row) for row in stream[worker::4]})
    assert len(set(seeds.values())) == len(stream), "two groups of one task got the same instance"
    forget_workers()                              # a resumed run, on another worker
    again = CUAAgentWorkflow(**workflow_args(gconfig=GenerationHyperparameters(), model={"path": "m"},
                                             gym={"base_url": "http://g", "gym_id": "g"},
                                             agent={"base_url": "http://a"}, group_size=4, seed=5))
    assert again.group_seed(Engine(), stream[5]) == seeds[5], "a resumed row must get its instance again"


def test_the_workflows_of_one_rollout_worker_share_its_policy_endpoint(tiny_model_dir):
    """AReaL builds a workflow object per submitted task (``RemoteInfEngine._resolve_workflow``); they share
    the rollout worker's policy endpoint (one per engine, kind and settings, built once) and its counts."""
    from areal.api.cli_args import GenerationHyperparameters

    from cua_rl.workflow import CUAAgentWorkflow
    from cua_rl.workflow.worker import forget_workers, worker_state

    class Engine:
        def get_version(self):
            return 0

    def workflow(**kw):
        return CUAAgentWorkflow(**workflow_args(gconfig=GenerationHyperparameters(), model={"path": tiny_model_dir},
                                                gym={"base_url": "http://g", "gym_id": "g"},
                                                agent={"base_url": "http://a"}, group_size=2, **kw))

    forget_workers()
    engine = Engine()
    first = workflow().policy_endpoint(engine)
    assert workflow().policy_endpoint(engine) is first, "a new workflow object built another endpoint"
    first.totals["recorded_turns"] += 3
    replaced = Engine()                                  # the engine was rebuilt: a new endpoint, counts kept
    second = workflow().policy_endpoint(replaced)
    assert second is not first and second.engine is replaced
    second.totals["recorded_turns"] += 2
    assert worker_state("train").totals()["recorded_turns"] == 5
    assert workflow(is_eval=True).policy_endpoint(replaced) is not second, "evaluation has its own endpoint and counts"
    assert worker_state("eval").totals()["recorded_turns"] == 0
    assert workflow(policy={"model_name": "other"}).policy_endpoint(replaced) is not second, "other settings, same endpoint"
    forget_workers()
