"""An episode whose prompt outgrows the policy's context (``gconfig.max_tokens``) ends as the policy's: evaluated
and scored, its turns before the overflow trained, the overflowing turn never generated or recorded. Before,
the endpoint's 400 became the agent's model error, the run a ``model`` failure and the episode was dropped as
the model server's: long, mostly failing episodes left their groups (survivorship).

Real pieces: the embedded gym (an Xvfb desktop), our agent service, the policy endpoint with the tiny model's
processor; AReaL's engine is ``EngineDouble`` (tests/doubles/policy_helpers.py): the limit is set just above
the first turn's prompt, so the second turn (one more screenshot in the agent's history) outgrows it."""

import pytest
from areal.api.cli_args import GenerationHyperparameters

from cua_rl.mini_agent import MiniAgentClient
from cua_rl.policy import close_loop_servers
from cua_rl.trajectory import EpisodeOutcome, group_batch
from cua_rl.workflow import CUAAgentWorkflow, play_episode
from tests.doubles.policy_helpers import EngineDouble
from tests.sections import workflow_args

pytestmark = [pytest.mark.desktop]


class FirstTurnSetsTheLimit(EngineDouble):
    """After the first turn, the policy's context holds that turn's prompt and one token more."""

    endpoint = None

    async def agenerate(self, req):
        if not self.requests:
            self.endpoint.gconfig = self.endpoint.gconfig.new(max_tokens=len(req.input_ids) + 1)
        return await super().agenerate(req)


@pytest.fixture(scope="module")
def services():
    from cua_rl.local_agent.server import start_agent_server
    from cua_rl.local_gym.server import start_gym_server

    gym = start_gym_server(gym_id="desktop", pool_size=1)
    agent = start_agent_server()
    try:
        yield gym, agent
    finally:
        agent.stop()
        gym.stop()


async def _episode(services, tiny_model_dir, processor):
    """One episode of the gym's first task against an endpoint whose context the second turn outgrows: (the
    outcome, the endpoint, the agent's run_end event)."""
    from cua_rl.genv import GenvClient

    gym, agent = services
    async with GenvClient(gym.url, "desktop") as client:
        task = (await client.list_tasks())[0]
    wf = CUAAgentWorkflow(**workflow_args(
        gconfig=GenerationHyperparameters(max_new_tokens=16, max_tokens=1 << 20),
        model={"path": tiny_model_dir}, gym={"base_url": gym.url, "gym_id": "desktop"},
        agent={"base_url": agent.url, "agent": "qwen3-vl", "poll_interval_s": 0.2},
        limits={"max_turns": 4, "max_task_time_seconds": 120, "max_turn_time_seconds": 60},
        policy={"max_pixels": 50176, "max_screenshots_in_history": 2}, group_size=1))
    engine = FirstTurnSetsTheLimit(processor.tokenizer)
    endpoint = engine.endpoint = wf.policy_endpoint(engine)
    outcome = await play_episode(wf.episode_setup, endpoint, {"task_id": task.id, "instruction": task.instruction}, 0)
    run_end = None
    if isinstance(outcome, EpisodeOutcome):
        async with MiniAgentClient(agent.url) as client:
            run_end = [e for e in await client.events(outcome.info["run_id"]) if e["type"] == "run_end"][-1]
    return outcome, endpoint, run_end


async def test_right_data_9_an_overlong_prompt_ends_the_episode_as_the_policys(services, tiny_model_dir, processor):
    try:
        outcome, endpoint, run_end = await _episode(services, tiny_model_dir, processor)
        assert isinstance(outcome, EpisodeOutcome), f"the episode was dropped: {outcome}"
        assert endpoint.totals["context_overflows"] == 1 and len(endpoint.engine.requests) == 1
        assert len(outcome.turns) == 1                     # the turn before the overflow; the overflow not recorded
        assert 0.0 <= outcome.reward <= 1.0 and "context" in outcome.info["reason"]
        assert run_end["ok"] is False and run_end["failure"] == "policy", run_end
        batch = group_batch([outcome], normalise=False, group_weight="tokens")   # its row, with its score
        assert batch["input_ids"].shape[0] == 1 and batch["rewards"].tolist() == [pytest.approx(outcome.reward)]
    finally:
        await close_loop_servers()


async def test_right_data_9_an_agent_that_calls_the_overflow_a_model_failure_is_overruled(
        services, tiny_model_dir, processor, monkeypatch):
    """The rule for an agent that does not read the error code (a stock gbox-mini-agent, an older agent): it
    ends the run as a model failure, and the workflow still evaluates the episode, since its policy endpoint
    knows the episode ended at its overflow."""
    monkeypatch.setattr("cua_rl.local_agent.model_client.context_exceeded", lambda response: False)
    try:
        outcome, endpoint, run_end = await _episode(services, tiny_model_dir, processor)
        assert isinstance(outcome, EpisodeOutcome), f"the episode was dropped: {outcome}"
        assert run_end["failure"] == "model", run_end          # what such an agent says
        assert endpoint.totals["context_overflows"] == 1 and len(outcome.turns) == 1
    finally:
        await close_loop_servers()
