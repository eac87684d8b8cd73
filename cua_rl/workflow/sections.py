"""The typed sections a ``CUAAgentWorkflow`` is built from: where the gym and the agent service are, which
model the agent calls, how long an episode may run, where the Training Monitor is.

Why sections and not one flat list of keyword arguments: AReaL rebuilds the workflow on every rollout
worker from its kwargs (and logs and saves them), so they must be plain, picklable values; grouped by what
they configure, each is validated where it is defined and read as one thing (``limits.max_turns``), and a
new setting has one obvious home. The policy endpoint's settings (``cua_rl.policy.EndpointSettings``, beside
the endpoint) and how turns become rows (``cua_rl.trajectory.config.TrajectoryConfig``, beside the rows;
``CUAConfig`` checks it against AReaL's own settings, its reward normalisation above all) are the other two
sections. ``workflow_kwargs`` is the one mapping from a ``CUAConfig`` to all of them (train.py and evaluate.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cua_rl.runs import RunPaths

if TYPE_CHECKING:
    from areal.api.cli_args import GenerationHyperparameters

    from cua_rl.config import CUAConfig


@dataclass
class GymTarget:
    """The genv gym episodes run on (a task row's own ``gym_base_url``/``gym_id`` win): one URL, or several
    (``URL,URL,...``: a fleet, each group placed on one host, ``cua_rl.workflow.placement``; each host's health
    asked every ``health_interval_s``, within ``health_timeout_s``). ``seed_instances``: every episode of a
    group asks for one instance seed (see ``cua_rl.workflow.seeding``)."""

    base_url: str
    gym_id: str
    seed_instances: bool = True
    health_interval_s: float = 2.0
    health_timeout_s: float = 3.0


@dataclass
class AgentTarget:
    """The agent service (gbox-mini-agent or ours) that plays each episode, with its prompt format and
    action space; ``poll_interval_s``: how often a run's status is asked for."""

    base_url: str
    agent: str = "qwen3-vl"
    action_space: str = "pc"
    poll_interval_s: float = 1.0
    extra: dict = field(default_factory=dict)    # sent as-is in each run request (RunRequest.extra)

    def __post_init__(self) -> None:
        if self.poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s must be > 0, got {self.poll_interval_s}")


@dataclass
class ModelTarget:
    """The policy the agent calls. ``path``: the trained model (its processor builds the prompts). With
    ``base_url`` the agent calls that model instead of our policy endpoint: nothing is recorded or trained
    (an evaluation of another model)."""

    path: str
    base_url: str = ""
    name: str = ""


@dataclass
class EpisodeLimits:
    """How long an episode may run: model turns, the whole task, one turn (the agent's step time limit).
    The task limit also bounds the wait for a gym or agent service that is down or at capacity."""

    max_turns: int = 20
    max_task_time_seconds: float = 600
    max_turn_time_seconds: float = 120

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.max_task_time_seconds <= 0 or self.max_turn_time_seconds <= 0:
            raise ValueError("max_task_time_seconds and max_turn_time_seconds must be > 0")


@dataclass
class MonitorTarget:
    """The Training Monitor each episode reports to (off without ``base_url``). Its token is never here:
    kwargs are logged and saved; it is read from the environment (``cua_rl.monitor``)."""

    base_url: str = ""
    project_id: str = ""
    training_id: int | None = None


def workflow_kwargs(config: CUAConfig, gconfig: GenerationHyperparameters, group_size: int, *, is_eval: bool = False,
                    monitor_training_id: int | None = None) -> dict[str, Any]:
    """Serialisable ``CUAAgentWorkflow`` constructor kwargs from a ``CUAConfig`` (train and eval differ in gconfig and
    group size): the one mapping from the config's keys to the workflow's sections. The monitor gets its URL,
    project and training id here, never its token (read from the environment)."""
    return dict(
        gconfig=gconfig,
        model=ModelTarget(path=config.actor.path, base_url=config.model_base_url, name=config.model_name),
        gym=GymTarget(base_url=config.gym_base_url, gym_id=config.gym_id,
                      seed_instances=bool(config.gym_seed_instances),
                      health_interval_s=config.gym_fleet.health_interval_seconds,
                      health_timeout_s=config.gym_fleet.health_timeout_seconds),
        agent=AgentTarget(base_url=config.gbox_mini_agent_base_url, agent=config.gbox_mini_agent_agent,
                          action_space=config.gbox_mini_agent_standard_action_space,
                          extra=dict(config.gbox_mini_agent_extra)),
        limits=EpisodeLimits(max_turns=config.max_turns, max_task_time_seconds=config.max_task_time_seconds,
                             max_turn_time_seconds=config.max_turn_time_seconds),
        policy=config.policy, trajectory=config.trajectory,
        monitor=MonitorTarget(base_url=config.monitor_base_url, project_id=config.project_id,
                              training_id=monitor_training_id),
        group_size=group_size, is_eval=is_eval, stats_dir=_stats_dir(config), seed=int(config.seed),
        tree=None if is_eval else config.tree)


def _stats_dir(config: CUAConfig) -> str:
    """The run's log directory, where the launcher's summary reads the endpoint counts, computed without
    creating it (AReaL's ``StatsLogger.get_log_path`` makes the directory: for ``CUAConfig()`` in a test that
    was ``???/logs/<user>/???/???`` in the working directory). None for a config that names no run."""
    from omegaconf import MISSING

    s = getattr(config, "stats_logger", None)
    if s is None or any(not part or part == MISSING for part in (s.fileroot, s.experiment_name, s.trial_name)):
        return ""
    return str(RunPaths.of(config).logs)
