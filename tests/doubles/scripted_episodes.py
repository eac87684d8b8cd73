"""TEST DOUBLE of one episode (``cua_rl.workflow.episode.play_episode``), for the tests of what the workflow
does with its episodes' outcomes (values, drops, records, the monitor's rollouts). A real episode needs a gym's
desktop, an agent service and a model (tests/doubles/embedded_stack.py has them, at a minute's cost); these
tests need only outcomes of known lengths and rewards. Each call plays the script of its task row: per episode
index, ``(turns, reward)`` or a ``Dropped``; the turns carry ``OUTPUT`` trained tokens each. Like
``play_episode`` it reports the rollout's result to the monitor when given a report."""

from __future__ import annotations

from cua_rl.policy.records import Turn
from cua_rl.trajectory import EpisodeOutcome
from cua_rl.workflow import Dropped

OUTPUT = 8


class ScriptedEpisodes:
    def __init__(self, script: dict[str, list]):
        self.script = script                       # task id -> [(turns, reward) or Dropped, per episode index]
        self.calls: list[tuple[str, int, int | None]] = []   # (task id, episode index, instance seed)

    async def __call__(self, setup, endpoint, data, index, report=None, seed=None, placement=None):
        task_id = str(data["task_id"])
        self.calls.append((task_id, index, seed))
        played = self.script[task_id][index]
        if isinstance(played, Dropped):
            return played
        turns, reward = played
        turn = Turn(prompt_ids=[1] * 4, output_ids=[2] * OUTPUT, output_logprobs=[-0.5] * OUTPUT,
                    output_versions=[0] * OUTPUT)
        if report is not None:
            report.finished(reward=reward, task_success=reward > 0, num_turns=turns, summary={"task_id": task_id})
        return EpisodeOutcome(turns=[turn] * turns, reward=reward,
                              info={"seconds": 0.1, "success": reward > 0, "seed": seed},
                              monitor_uuid=report.uuid if report is not None else None)


def install(monkeypatch, script: dict[str, list]) -> ScriptedEpisodes:
    """The workflow's episodes played by the script from now on (for this test)."""
    episodes = ScriptedEpisodes(script)
    monkeypatch.setattr("cua_rl.workflow.group.play_episode", episodes)
    return episodes
