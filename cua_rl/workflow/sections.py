"""The typed sections a ``CUAAgentWorkflow`` is built from: where the gym and the agent service are, which
model the agent calls, how long an episode may run, where the Training Monitor is.

Why sections and not one flat list of keyword arguments: AReaL rebuilds the workflow on every rollout
worker from its kwargs (and logs and saves them), so they must be plain, picklable values, grouped by what
they configure and read as one thing (``limits.max_turns``). One schema per setting: the sections have no
defaults and no checks of the settings they carry; every field is required and filled from a ``CUAConfig``
(``sections_from``), whose field holds the setting's one default, its help and its choices, and whose
``__post_init__`` checks it (tests/config/test_one_spine.py keeps it so). The policy endpoint's settings
(``cua_rl.policy.EndpointSettings``, beside the endpoint) and how turns become rows
(``cua_rl.trajectory.config.TrajectoryConfig``, beside the rows; ``CUAConfig`` checks it against AReaL's own
settings, its reward normalisation above all) are the config's own sections, handed over as they are.
``workflow_kwargs`` is the one mapping from a ``CUAConfig`` to all of them (train.py and evaluate.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cua_rl.runs import RunPaths

if TYPE_CHECKING:
    from areal.api.cli_args import GenerationHyperparameters

    from cua_rl.config import CUAConfig


# How often the workflow asks the agent service for a run's status. Not a setting of the run: a constant of the
# workflow's polling, passed like every other field of ``AgentTarget`` (a test polls faster).
AGENT_POLL_INTERVAL_S = 1.0


@dataclass
class GymTarget:
    """The genv gym episodes run on (a task row's own ``gym_base_url``/``gym_id`` win): one URL, or several
    (``URL,URL,...``: a fleet, each group placed on one host, ``cua_rl.workflow.placement``; each host's health
    asked every ``health_interval_s``, within ``health_timeout_s``). ``seed_instances``: every episode of a
    group asks for one instance seed (see ``cua_rl.workflow.seeding``)."""

    base_url: str
    gym_id: str
    seed_instances: bool
    health_interval_s: float
    health_timeout_s: float


@dataclass
class AgentTarget:
    """The agent service (gbox-mini-agent or ours) that plays each episode, with its prompt format and
    action space; ``poll_interval_s``: how often a run's status is asked for (``AGENT_POLL_INTERVAL_S``)."""

    base_url: str
    agent: str
    action_space: str
    poll_interval_s: float
    extra: dict    # sent as-is in each run request (RunRequest.extra)

    def __post_init__(self) -> None:
        if self.poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s must be > 0, got {self.poll_interval_s}")


@dataclass
class ModelTarget:
    """The policy the agent calls. ``path``: the trained model (its processor builds the prompts). With
    ``base_url`` the agent calls that model instead of our policy endpoint: nothing is recorded or trained
    (an evaluation of another model)."""

    path: str
    base_url: str
    name: str


@dataclass
class EpisodeLimits:
    """How long an episode may run: model turns, the whole task, one turn (the agent's step time limit).
    The task limit also bounds the wait for a gym or agent service that is down or at capacity. Checked where
    the settings are defined (``CUAConfig.__post_init__``)."""

    max_turns: int
    max_task_time_seconds: float
    max_turn_time_seconds: float


@dataclass
class MonitorTarget:
    """The Training Monitor each episode reports to (off without ``base_url``: ``MonitorTarget.off()``). Its
    token is never here: kwargs are logged and saved; it is read from the environment (``cua_rl.monitor``)."""

    base_url: str
    project_id: str
    training_id: int | None

    @classmethod
    def off(cls) -> MonitorTarget:
        """No monitor: nothing is reported (an evaluation, a test)."""
        return cls(base_url="", project_id="", training_id=None)


def sections_from(config: CUAConfig, *, monitor_training_id: int | None = None) -> dict[str, Any]:
    """The sections of this module (``model``, ``gym``, ``agent``, ``limits``, ``monitor``) from a ``CUAConfig``:
    every field filled from the config, whose fields hold each setting's one default, check and help. The
    monitor gets its URL, project and training id here, never its token (read from the environment)."""
    return dict(
        model=ModelTarget(path=config.actor.path, base_url=config.model_base_url, name=config.model_name),
        gym=GymTarget(base_url=config.gym_base_url, gym_id=config.gym_id,
                      seed_instances=bool(config.gym_seed_instances),
                      health_interval_s=config.gym_fleet.health_interval_seconds,
                      health_timeout_s=config.gym_fleet.health_timeout_seconds),
        agent=AgentTarget(base_url=config.gbox_mini_agent_base_url, agent=config.gbox_mini_agent_agent,
                          action_space=config.gbox_mini_agent_standard_action_space,
                          poll_interval_s=AGENT_POLL_INTERVAL_S, extra=dict(config.gbox_mini_agent_extra)),
        limits=EpisodeLimits(max_turns=config.max_turns, max_task_time_seconds=config.max_task_time_seconds,
                             max_turn_time_seconds=config.max_turn_time_seconds),
        monitor=MonitorTarget(base_url=config.monitor_base_url, project_id=config.project_id,
                              training_id=monitor_training_id))


def workflow_kwargs(config: CUAConfig, gconfig: GenerationHyperparameters, group_size: int, *, is_eval: bool = False,
                    monitor_training_id: int | None = None) -> dict[str, Any]:
    """Serialisable ``CUAAgentWorkflow`` constructor kwargs from a ``CUAConfig`` (train and eval differ in gconfig and
    group size): the one mapping from the config's keys to the workflow's sections (``sections_from``) and
    the config's own sections (``policy``, ``trajectory``, ``tree``)."""
    return dict(
        gconfig=gconfig, **sections_from(config, monitor_training_id=monitor_training_id),
        policy=config.policy, trajectory=config.trajectory,
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
