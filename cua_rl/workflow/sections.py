"""The typed sections a ``CUAAgentWorkflow`` is built from: where the gym and the agent service are, which
model the agent calls, how long an episode may run, where the Training Monitor is.

Why sections and not one flat list of keyword arguments: AReaL rebuilds the workflow on every rollout
worker from its kwargs (and logs and saves them), so they must be plain, picklable values; grouped by what
they configure, each is validated where it is defined and read as one thing (``limits.max_turns``), and a
new setting has one obvious home. The policy endpoint's settings (``cua_rl.policy.EndpointSettings``, beside
the endpoint) and how turns become rows (``cua_rl.config.TrajectoryConfig``, with the run's other config
sections: ``CUAConfig`` checks it against AReaL's own settings, its reward normalisation above all) are the other
two sections.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
