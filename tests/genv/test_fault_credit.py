"""Which of a gym's own faults drop an episode, and what is counted instead (issue 83 item 4).

Only a fault that decided the episode drops it: one the execution ended on (``faults.gym_unrecovered`` > 0 in the
evaluate answer, docs/protocols.md 1.4). A fault the agent went on past (a screenshot it retried, an action after
which the next one played) is counted and the episode trained with its reward: dropping those took the long,
mostly failing episodes (which meet more faults) out of their groups' baselines. A gym that sends no ``faults``
has its episodes' failed runs counted by kind in the summary; drops that grow with episode length warn
(``lost_length_skew``).

Each episode is ``play_episode`` over real loopback HTTP against the genv double (a third-party gym: its evaluate
answer set per case) and the agent double (a stock gbox-mini-agent: it sends no failure kind).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from areal.utils import stats_tracker

from cua_rl.http.serve import serve_app_in_thread
from cua_rl.mini_agent import Sampling
from cua_rl.policy import EndpointSettings
from cua_rl.run.summary import fault_lines
from cua_rl.trainer.health import Health, HealthConfig
from cua_rl.trajectory import EpisodeOutcome
from cua_rl.trajectory.config import TrajectoryConfig
from cua_rl.workflow import Dropped, play_episode
from cua_rl.workflow.episode import EpisodeSetup
from cua_rl.workflow.group import CUAAgentWorkflow
from cua_rl.workflow.worker import WorkerState
from tests.doubles.agent_double import AgentState, build_agent_double, scripted_events
from tests.sections import sections

ROW = {"task_id": "task-001", "instruction": "Open the settings app"}
TURNS = 3


@pytest.fixture
def agent_state():
    return AgentState(script=scripted_events(TURNS, ok=False), final_status="failed", final_reason="gave up",
                      steps=[{"actions": [], "text": f"s{i}"} for i in range(1, TURNS + 1)])


@pytest.fixture
def agent_server(agent_state):
    served = serve_app_in_thread(build_agent_double(agent_state))
    yield served
    served.stop()


def _setup(gym_url: str, agent_url: str) -> EpisodeSetup:
    s = sections(gym={"base_url": gym_url, "gym_id": "g"}, agent={"base_url": agent_url, "poll_interval_s": 0.05},
                 model={"path": "", "base_url": "http://127.0.0.1:9/v1", "name": "elsewhere"},
                 limits={"max_turns": 4, "max_task_time_seconds": 30, "max_turn_time_seconds": 10})
    return EpisodeSetup(gym=s["gym"], agent=s["agent"], model=s["model"], limits=s["limits"],
                        settings=EndpointSettings(), trajectory=TrajectoryConfig(), sampling=Sampling())


async def _play(gym_server, gym_state, agent_server, faults: dict | None):
    gym_state.evaluation_reply = {"success": True, "score": 1.0, **({"faults": faults} if faults is not None else {})}
    return await play_episode(_setup(gym_server.url, agent_server.url), None, ROW, 0)


async def test_right_credit_4_a_gym_fault_the_agent_went_on_past_is_counted_not_dropped(gym_server, gym_state,
                                                                                       agent_server):
    recovered = await _play(gym_server, gym_state, agent_server, {"gym": 2, "policy": 0, "gym_unrecovered": 0})
    assert isinstance(recovered, EpisodeOutcome), f"a recovered fault dropped the episode: {recovered}"
    assert recovered.reward == 1.0 and recovered.info["gym_faults_recovered"] == 2
    decided = await _play(gym_server, gym_state, agent_server, {"gym": 2, "policy": 0, "gym_unrecovered": 1})
    assert isinstance(decided, Dropped) and decided.cause == "gym" and decided.turns == TURNS, decided
    # a gym that counts faults but not which were recovered from: a failed run is dropped as before
    unknown = await _play(gym_server, gym_state, agent_server, {"gym": 1, "policy": 0})
    assert isinstance(unknown, Dropped) and unknown.cause == "gym", unknown
    worker = WorkerState("train")
    worker.count_use([recovered])
    totals = worker.totals()
    assert (totals["episodes_gym_faults_recovered"], totals["gym_faults_recovered"]) == (1, 2), totals
    assert "2 recovered from in 1 evaluated episodes" in " ".join(fault_lines(totals))


async def test_right_credit_4_a_gym_without_faults_has_its_failed_runs_counted_by_kind(gym_server, gym_state,
                                                                                      agent_server):
    outcome = await _play(gym_server, gym_state, agent_server, None)
    assert isinstance(outcome, EpisodeOutcome) and outcome.info["gym_counts_faults"] is False, outcome
    worker = WorkerState("train")
    worker.count_use([outcome])
    totals = worker.totals()
    assert totals["episodes_gym_without_faults"] == 1
    assert totals["episodes_gym_without_faults_failed_unreported"] == 1, totals
    (line,) = fault_lines(totals)
    assert "1 evaluated episodes on a gym that sends no faults" in line and "unreported 1" in line, line


def test_right_credit_4_drops_that_grow_with_episode_length_warn():
    """Long episodes (at least half of max_turns played) lost at a higher share than short ones: the workflow's
    statistics carry both shares (``rollout/lost_long``, ``rollout/lost_short``) and the health check warns on
    their difference; drops alike at every length do not."""
    workflow = SimpleNamespace(limits=sections(limits={"max_turns": 20})["limits"])
    health = Health(HealthConfig(), max_turns=20, max_head_offpolicyness=1)
    scope = stats_tracker.get("rollout")
    scope.export(reset=True)

    def step(evaluated: list[int], lost: list[int]) -> dict:
        CUAAgentWorkflow._record_lost_by_length(workflow, scope, evaluated, lost)
        return scope.export(reset=True)

    skewed = step(evaluated=[3, 4, 20, 20], lost=[15, 18, 17])    # 3 of 5 long episodes lost, 0 of 2 short
    assert skewed["rollout/lost_long"] == pytest.approx(0.6) and skewed["rollout/lost_short"] == 0.0, skewed
    findings = []
    for n in (1, 2, 3):
        findings = health.observe(n, dict(skewed))
    assert [(f.invariant.name, f.action) for f in findings] == [("lost_length_skew", "warn")], findings
    even = step(evaluated=[3, 20, 20, 2], lost=[2, 19])           # 1 of 3 long, 1 of 3 short
    assert health.values(even)["lost_length_skew"] == pytest.approx(0.0)
