"""What ``CUAAgentWorkflow.arun_episode`` does with a group beyond its episodes: which instances its episodes are
given (training: one per group; evaluation: a held-out one each) and which groups it drops and records for
resume. The workflow is real (its policy endpoint on the tiny model's processor, with ``EngineDouble`` for
AReaL's engine, tests/doubles/policy_helpers.py); the episodes are either real against the genv TEST DOUBLE
(tests/doubles/genv_double.py, a user's seeded gym, which records what it is sent) or scripted
(tests/doubles/scripted_episodes.py)."""

import pytest
from areal.api.cli_args import GenerationHyperparameters

from cua_rl.policy import close_loop_servers
from cua_rl.runs import STREAM_KEY, read_dropped
from cua_rl.workflow import CUAAgentWorkflow, Dropped
from cua_rl.workflow.worker import forget_workers
from tests.doubles.policy_helpers import EngineDouble
from tests.doubles.scripted_episodes import install
from tests.sections import workflow_args

UNREACHABLE = "http://127.0.0.1:9"


def _workflow(model_dir: str, **kw) -> CUAAgentWorkflow:
    args = dict(gconfig=GenerationHyperparameters(max_new_tokens=8), model={"path": model_dir},
                gym={"base_url": UNREACHABLE, "gym_id": "g"}, agent={"base_url": UNREACHABLE}, group_size=4,
                limits={"max_turns": 2, "max_task_time_seconds": 1, "max_turn_time_seconds": 1})
    args.update(kw)
    return CUAAgentWorkflow(**workflow_args(**args))


@pytest.fixture
def gym():
    """The genv test double on a loopback port, with three tasks."""
    from cua_rl.http.serve import serve_app_in_thread
    from tests.doubles.genv_double import GymState, build_gym_double

    state = GymState(tasks={"tasks": [{"task_id": t, "name": t, "description": "x"} for t in ("a", "b", "c")]})
    served = serve_app_in_thread(build_gym_double(state))
    yield served.url, state
    served.stop()


def _created(state) -> list[tuple[str, int | None]]:
    """(task, options.seed) of every create-execution request the gym received, in order."""
    import json

    out = []
    for method, path, _query, body in state.requests:
        if method == "POST" and "/tasks/" in path:
            out.append((path.rsplit("/", 1)[1], (json.loads(body or b"{}").get("options") or {}).get("seed")))
    return out


async def test_right_data_5_evaluation_plays_distinct_heldout_instances(gym, tiny_model_dir, processor,
                                                                        monkeypatch):
    """AReaL's evaluator submits each eval row once, as one group of ``n_samples`` episodes. Each episode must
    play its own held-out instance (the curriculum's held-out list, the one ``cua_rl.evaluate`` plays), the
    same ones at every evaluation; a training group keeps one instance for all its members. Asserted on the
    seeds the gym receives (the agent service is unreachable here: each episode is dropped after its create)."""
    from cua_rl.local_gym import curriculum

    url, state = gym
    engine = EngineDouble(processor.tokenizer)
    rows = [{"task_id": t, "instruction": "x", "seed_bits": 53} for t in ("a", "b")]   # as our gyms declare
    forget_workers()
    try:
        evaluation = _workflow(tiny_model_dir, gym={"base_url": url, "gym_id": "g"}, group_size=3, is_eval=True)
        for row in rows:
            assert await evaluation.arun_episode(engine, row) is None       # every episode lost: nothing trains
        first = _created(state)
        assert len(first) == 6 and len(set(first)) == 6, f"an instance played twice: {first}"
        assert all(curriculum.split_of(seed) == "heldout" for _, seed in first), first
        assert sorted(seed for task, seed in first if task == "a") == curriculum.heldout_seeds(3)
        # the next evaluation (the next policy version, here a fresh process) plays the same instances
        state.requests.clear()
        forget_workers()
        for row in rows:
            await _workflow(tiny_model_dir, gym={"base_url": url, "gym_id": "g"}, group_size=3,
                            is_eval=True).arun_episode(engine, row)
        assert sorted(_created(state)) == sorted(first)
        # the held-out set is read in one place: change it there, and evaluation follows
        state.requests.clear()
        forget_workers()
        monkeypatch.setattr(curriculum, "heldout_seeds", lambda n, offset=0: [7 + offset + i for i in range(n)])
        await _workflow(tiny_model_dir, gym={"base_url": url, "gym_id": "g"}, group_size=3,
                        is_eval=True).arun_episode(engine, rows[0])
        assert sorted(seed for _, seed in _created(state)) == [7, 8, 9]
        # training: the group's members share one instance, from the training seeds
        state.requests.clear()
        await _workflow(tiny_model_dir, gym={"base_url": url, "gym_id": "g"}, group_size=3).arun_episode(
            engine, {**rows[0], STREAM_KEY: 5})
        seeds = {seed for _, seed in _created(state)}
        assert len(seeds) == 1 and curriculum.split_of(seeds.pop()) == "train"
    finally:
        await close_loop_servers()


async def test_right_data_7_every_group_the_workflow_drops_is_recorded_for_resume(tmp_path, tiny_model_dir,
                                                                                   processor, monkeypatch):
    """A training row the workflow returns nothing for must be recorded (``cua_rl.runs.record_dropped``), or
    it pins the trainer's restart point for the rest of the run: a group rejected for too few evaluated
    episodes, one that trained no row, and one dropped for carrying no signal
    (``trajectory.drop_zero_variance``, which replaces AReaL's ``dynamic_filter_fn``: that drops groups the
    workflow never hears of). A group that trains is not recorded, nor is an eval group."""
    lost = Dropped("gym", "the gym failed (scripted)")
    episodes = install(monkeypatch, {
        "rejected": [lost, lost, lost, (2, 1.0)],             # 1 of 4 evaluated: below min_group_size
        "silent": [(0, 1.0), (0, 0.0), (0, 0.0), (0, 0.0)],    # evaluated, but the agent never called the model
        "flat": [(3, 0.0)] * 4,                                # every reward equal: no GRPO signal
        "trained": [(1, 1.0), (3, 0.0), (2, 0.0), (3, 0.0)],
    })
    engine = EngineDouble(processor.tokenizer)
    forget_workers()
    try:
        plain = _workflow(tiny_model_dir, stats_dir=str(tmp_path))
        filtering = _workflow(tiny_model_dir, stats_dir=str(tmp_path), trajectory={"drop_zero_variance": True})
        out = {}
        for index, (task, wf) in enumerate([("rejected", plain), ("silent", plain), ("flat", filtering),
                                            ("trained", filtering)]):
            out[task] = await wf.arun_episode(engine, {"task_id": task, "instruction": "x", STREAM_KEY: index})
        assert [task for task, batch in out.items() if batch is None] == ["rejected", "silent", "flat"]
        assert out["trained"][STREAM_KEY].tolist() == [3] * 9
        assert read_dropped(tmp_path) == {0, 1, 2}
        # without the option the flat group trains (with zero values), and evaluation records nothing
        assert await plain.arun_episode(engine, {"task_id": "flat", "instruction": "x", STREAM_KEY: 4}) is not None
        await _workflow(tiny_model_dir, stats_dir=str(tmp_path), is_eval=True).arun_episode(
            engine, {"task_id": "rejected", "instruction": "x", STREAM_KEY: 5})
        assert read_dropped(tmp_path) == {0, 1, 2}
        assert len(episodes.calls) == 6 * 4
    finally:
        await close_loop_servers()


def test_right_data_7_areals_dynamic_filter_is_refused():
    """AReaL's ``dynamic_filter_fn`` drops groups after the workflow returned them, unrecorded: our trainer
    refuses it (before anything starts) and names the option that records its drops."""
    from cua_rl.trainer.trainer import Trainer

    trainer = Trainer.__new__(Trainer)              # nothing started: the refusal comes first
    with pytest.raises(ValueError, match="trajectory.drop_zero_variance"):
        Trainer.train(trainer, workflow="cua_rl.workflow.CUAAgentWorkflow", dynamic_filter_fn="my.filter")
    with pytest.raises(ValueError, match="trajectory.drop_zero_variance"):   # as AReaL's fifth argument
        Trainer.train(trainer, "cua_rl.workflow.CUAAgentWorkflow", None, {}, None, "my.filter")
