"""A gym's own failures are never trained as the policy's (issue 59 item 2).

What was wrong: our gym answered ``{"ok": false}`` for any exception while playing an action (an X error, a page
that never took its input), and our agent counted that as the policy's invalid action, fed back to the model;
three in a row ended the run as the policy's. A step time-out spent waiting on a slow gym was the policy's too.
And a stock gbox-mini-agent sends no failure kind at all, so whatever the gym failed was scored and trained.

Now the gym says whose failure it was (``fault`` in its action answer, docs/protocols.md 1.5) and counts its own
per execution (``faults`` in the evaluate answer, 1.4); our agent ends a run on a gym-fault action, or on a step
time-out mostly spent inside the gym, as an ``env`` failure; and the workflow drops an episode whose evaluation
reports gym faults even when the agent said nothing.

Real gym (Xvfb desktops), real agent service, the workflow's own ``play_episode``; the faults are injected in the
gym (an X call that raises, an action that takes too long). The model is the scripted model server (the
documented test double for a policy, tests/doubles/model_double.py): the agent calls it directly (no policy
endpoint, so nothing is recorded), which is all these outcomes need.
"""

from __future__ import annotations

import asyncio

import pytest

from cua_rl.http.retry import RetryPolicy
from cua_rl.http.serve import serve_app_in_thread
from cua_rl.local_agent import AgentSettings, start_agent_server
from cua_rl.local_gym import start_gym_server
from cua_rl.local_gym.xinput import XInput
from cua_rl.mini_agent import MiniAgentClient, Sampling
from cua_rl.policy import EndpointSettings
from cua_rl.trajectory import EpisodeOutcome
from cua_rl.trajectory.config import TrajectoryConfig
from cua_rl.workflow import Dropped, play_episode
from cua_rl.workflow.episode import EpisodeSetup
from tests.doubles.model_double import MODEL_ID, ScriptedModel, build_model_app, qwen_call
from tests.sections import sections

pytestmark = [pytest.mark.desktop]

CLICK = qwen_call(action="left_click", coordinate=[500, 500])


@pytest.fixture(scope="module")
def gym():
    with start_gym_server(gym_id="desktop", port=0, max_executions=3, pool_size=1, display_base=900) as server:
        yield server


@pytest.fixture(scope="module")
def agent():
    settings = AgentSettings(gym_retry=RetryPolicy(attempts=2, backoff_s=0.05),
                             model_retry=RetryPolicy(attempts=2, backoff_s=0.05))
    handle = start_agent_server(settings=settings)
    yield handle
    handle.stop()


@pytest.fixture
def model():
    scripted = ScriptedModel()
    served = serve_app_in_thread(build_model_app(scripted))
    yield scripted, served.url + "/v1"
    served.stop()


def _setup(gym, agent, model_url: str, turn_s: float = 30) -> EpisodeSetup:
    s = sections(gym={"base_url": gym.url, "gym_id": "desktop"}, agent={"base_url": agent.url, "poll_interval_s": 0.2},
                 model={"path": "", "base_url": model_url, "name": MODEL_ID},
                 limits={"max_turns": 4, "max_task_time_seconds": 90, "max_turn_time_seconds": turn_s})
    return EpisodeSetup(gym=s["gym"], agent=s["agent"], model=s["model"], limits=s["limits"],
                        settings=EndpointSettings(), trajectory=TrajectoryConfig(), sampling=Sampling())


ROW = {"task_id": "001", "instruction": "Append the line and save the file."}


def _x_error(monkeypatch) -> list[int]:
    """Every click on a desktop fails in the X server (as a BadWindow for a window gone mid-call would)."""
    calls = []

    def failing_click(self, *args, **kwargs):
        calls.append(1)
        raise RuntimeError("X error: BadWindow (injected)")

    monkeypatch.setattr(XInput, "click", failing_click)
    return calls


async def test_right_data_2_a_gym_input_fault_ends_our_agents_run_as_the_gyms(gym, agent, model, monkeypatch):
    scripted, url = model
    scripted.script("", [CLICK])
    clicks = _x_error(monkeypatch)
    dropped = await play_episode(_setup(gym, agent, url), None, ROW, 0)
    assert isinstance(dropped, Dropped) and dropped.cause == "gym", dropped
    assert clicks == [1], "the failed action was played more than once"
    assert len(scripted.requests[""]) == 1, "the gym's failure was fed back to the policy as an invalid turn"
    assert not gym.manager.executions, "an execution was left running"


async def test_right_data_2_the_action_answer_and_the_run_say_whose_failure_it_was(gym, agent, model, monkeypatch):
    """What travels on the wire: the action answer's ``fault: gym`` (kept in the agent's ``rawResult``), the run's
    ``run_end`` ``failure: env``, no invalid-turn error."""
    from cua_rl.genv import GenvClient

    scripted, url = model
    scripted.script("", [CLICK])
    _x_error(monkeypatch)
    seen = {}
    real_evaluate = GenvClient.evaluate

    async def evaluate(self, execution_id, **kwargs):   # the trainer's evaluate call: keep its answer
        seen["evaluation"] = await real_evaluate(self, execution_id, **kwargs)
        return seen["evaluation"]

    monkeypatch.setattr(GenvClient, "evaluate", evaluate)
    real_run = MiniAgentClient.run

    async def run(self, request, **kwargs):   # the workflow's agent run: keep its result
        seen["run"] = result = await real_run(self, request, **kwargs)
        return result

    monkeypatch.setattr(MiniAgentClient, "run", run)
    dropped = await play_episode(_setup(gym, agent, url), None, ROW, 0)
    assert isinstance(dropped, Dropped) and dropped.cause == "gym", dropped
    result = seen["run"]
    assert result.failure == "env" and not result.ok, (result.failure, result.reason)
    actions = [e.data["action"] for e in result.events if e.type == "action_executed"]
    assert [a["rawResult"]["ok"] for a in actions] == [False] and actions[0]["rawResult"]["fault"] == "gym"
    assert not [e for e in result.events if e.type == "error" and e.data.get("invalid")]
    assert "evaluation" not in seen, "an episode whose run failed in the gym was evaluated"


async def test_right_data_2_an_agent_that_sends_no_failure_kind_still_loses_a_gym_faulted_episode(
        gym, agent, model, monkeypatch):
    """A stock gbox-mini-agent sends no ``failure``: the workflow reads the gym's own fault count in the evaluate
    answer and drops the episode as the gym's (here our agent with ``failure`` taken out of its ``run_end``)."""
    from cua_rl.local_agent import record

    real_finish = record.RunRecord.finish

    def finish_without_failure(self, ok, reason, status=None, failure=None):
        return real_finish(self, ok, reason, status=status)

    monkeypatch.setattr(record.RunRecord, "finish", finish_without_failure)
    scripted, url = model
    scripted.script("", [CLICK])
    _x_error(monkeypatch)
    outcome = await play_episode(_setup(gym, agent, url), None, ROW, 0)
    assert isinstance(outcome, Dropped) and outcome.cause == "gym", outcome
    assert "fault" in outcome.reason, outcome.reason
    assert not gym.manager.executions, "an execution was left running"


async def test_right_data_2_a_step_time_out_spent_inside_the_gym_is_the_gyms(gym, agent, model, monkeypatch):
    """The gym takes longer than the agent's step limit over an action: the time-out is the gym's (dropped as the
    gym's). The same limit run out by a slow model is not put on the gym: it is the model server's."""
    scripted, url = model
    scripted.script("", [CLICK])
    env = gym.app.state.gym
    real_act = env.act

    async def slow_act(eid, action):
        await asyncio.sleep(4)
        return await real_act(eid, action)

    monkeypatch.setattr(env, "act", slow_act)
    dropped = await play_episode(_setup(gym, agent, url, turn_s=2), None, ROW, 0)
    assert isinstance(dropped, Dropped) and dropped.cause == "gym", dropped
    monkeypatch.setattr(env, "act", real_act)
    scripted.script("", [{"delay": 4, "content": CLICK}])
    slow_model = await play_episode(_setup(gym, agent, url, turn_s=2), None, ROW, 0)
    assert isinstance(slow_model, Dropped) and slow_model.cause == "model_server", slow_model
    await asyncio.sleep(4)   # the slow act of the first episode, still running in the gym, has ended
    assert not gym.manager.executions, "an execution was left running"


async def test_input_the_keyboard_cannot_type_stays_the_policys(gym, agent, model, monkeypatch):
    """Not every ``ok: false`` is the gym's: text a desktop's keyboard has no key for (``InputRefused``, e.g. the VM
    keyboard's US layout, cua_rl/local_gym/vm/keys.py) is what the policy asked. It answers ``fault: "policy"``,
    is fed back to the model as an invalid turn, and the episode is evaluated."""
    from cua_rl.local_gym.vm.keys import char_qcode
    from cua_rl.local_gym.xinput import InputRefused

    with pytest.raises(InputRefused):
        char_qcode("é")

    def refusing(self, text):
        raise InputRefused(f"this keyboard has no key for {text[:1]!r} (injected)")

    monkeypatch.setattr(XInput, "type_text", refusing)
    scripted, url = model
    scripted.script("", [qwen_call(action="type", text="é")])
    outcome = await play_episode(_setup(gym, agent, url), None, ROW, 0)
    assert isinstance(outcome, EpisodeOutcome), outcome
    assert "invalid model replies" in outcome.info["reason"], outcome.info
    assert len(scripted.requests[""]) == 3, "the refusal was not fed back to the policy turn after turn"


async def test_the_benchs_gym_fault_mutation_injects_faults_and_trains_them_as_the_policys(agent, model):
    """The learning bench's mutation ``gym_faults_as_policy`` (bench/learning_bench.py MUTATIONS) is real: the
    gym's ``fault_rate`` fails actions as the gym's, which the workflow drops; with the mutation the same
    episode is evaluated and scored as the policy's."""
    import dataclasses

    scripted, url = model
    with start_gym_server(gym_id="desktop", port=0, max_executions=2, pool_size=1, display_base=940,
                          fault_rate=0.99) as faulty:
        setup = _setup(faulty, agent, url)
        scripted.script("", [CLICK])
        dropped = await play_episode(setup, None, ROW, 0)
        assert isinstance(dropped, Dropped) and dropped.cause == "gym", dropped
        mutated = dataclasses.replace(setup, trajectory=TrajectoryConfig(mutation="gym_faults_as_policy"))
        scripted.script("", [CLICK])
        outcome = await play_episode(mutated, None, ROW, 0)
        assert isinstance(outcome, EpisodeOutcome) and outcome.reward < 1.0, outcome
        assert not faulty.manager.executions
