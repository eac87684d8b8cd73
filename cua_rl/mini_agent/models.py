"""Typed start-run request (docs/protocols.md §2.2) and run result (§2.6) of the gbox-mini-agent.

Why typed: the original built the payload from loose kwargs, silently dropped the api key and had no
way to pass sampling parameters, so the agent's hard-coded temperature 0 became the behaviour policy.
``api_key`` is excluded from ``repr`` and from ``redacted_payload()`` so it cannot reach a log line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .events import ModelOutput, RunEvent

ACTION_SPACES = ("mobile", "pc")
# The desktop action space when a caller names none: both sides (this client and the embedded agent service,
# local_agent/schema.py) use this one default.
DEFAULT_ACTION_SPACE = "pc"
_CORE_KEYS = frozenset({"task", "agent", "maxSteps", "maxRunTimeSec", "maxStepTimeSec", "model", "env",
                        "standardActionSpace", "sampling", "startFrom"})
# What an agent service lists in ``/health``'s ``features`` when it continues another run's episode (``startFrom``,
# our agent service's extension: docs/local_agent.md): what a tree group needs of its agent.
START_FROM = "startFrom"


def _seconds(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


@dataclass(frozen=True)
class ModelEndpoint:
    """The OpenAI-compatible endpoint the agent calls every turn (our policy endpoint in training)."""

    base_url: str
    name: str
    provider: str = "openai"
    api_key: str | None = field(default=None, repr=False)

    def to_payload(self, *, redact: bool = False) -> dict:
        payload = {"baseUrl": self.base_url, "name": self.name, "provider": self.provider}
        if self.api_key:
            payload["apiKey"] = "***" if redact else self.api_key
        return payload


@dataclass(frozen=True)
class GenvEnv:
    """Where the agent acts: an execution of a genv gym (the agent screenshots and acts through it)."""

    gym_base_url: str
    gym_id: str
    execution_id: str

    def to_payload(self) -> dict:
        return {"type": "genv", "gymBaseUrl": self.gym_base_url, "gymId": self.gym_id,
                "executionId": self.execution_id}


@dataclass(frozen=True)
class Sampling:
    """Sampling the agent must use for model calls; OpenAI field names, None = not sent."""

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None

    def to_payload(self) -> dict:
        return {k: v for k, v in (("temperature", self.temperature), ("top_p", self.top_p),
                                  ("max_tokens", self.max_tokens)) if v is not None}


@dataclass(frozen=True)
class StartFrom:
    """Continue run ``run_id``'s episode after its first ``steps`` steps (a continuation on a forked execution:
    the run's first step is ``steps + 1``, its prompt history the parent's). Our agent service's extension.
    ``api_key``: the model key the parent run was started with, the proof that the caller started it (the
    service refuses a continuation without it unless its own model key is the parent's)."""

    run_id: str
    steps: int
    api_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.run_id or self.steps < 1:
            raise ValueError(f"StartFrom needs a run id and steps >= 1, got {self.run_id!r}, {self.steps}")

    def to_payload(self, *, redact: bool = False) -> dict:
        payload: dict[str, Any] = {"runId": self.run_id, "steps": self.steps}
        if self.api_key:
            payload["apiKey"] = "***" if redact else self.api_key
        return payload


@dataclass(frozen=True)
class RunRequest:
    """One agent run on one execution. Bad values raise ``ValueError`` before anything is sent."""

    task: str
    model: ModelEndpoint
    env: GenvEnv
    agent: str = "mai-ui"
    max_steps: int = 20
    max_run_time_s: float = 600.0
    max_step_time_s: float = 120.0
    standard_action_space: str = DEFAULT_ACTION_SPACE
    sampling: Sampling | None = None
    # Service-specific fields sent as-is (e.g. the embedded agent's ``historyImages``); they cannot
    # override the documented keys above.
    extra: dict[str, Any] = field(default_factory=dict)
    start_from: StartFrom | None = None

    def __post_init__(self) -> None:
        if self.start_from is not None and self.start_from.steps >= self.max_steps:
            raise ValueError(f"start_from.steps ({self.start_from.steps}) leaves no step of max_steps "
                             f"({self.max_steps})")
        if not self.task or not self.task.strip():
            raise ValueError("RunRequest.task (the instruction) is empty")
        if self.standard_action_space not in ACTION_SPACES:
            raise ValueError(f"standard_action_space must be one of {ACTION_SPACES}, "
                             f"got {self.standard_action_space!r}")
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if not self.env.execution_id:
            raise ValueError("RunRequest.env.execution_id is empty")
        clash = set(self.extra) & _CORE_KEYS
        if clash:
            raise ValueError(f"RunRequest.extra may not override {sorted(clash)}")

    def to_payload(self, *, redact: bool = False) -> dict:
        """The §2.2 JSON body; time limits only when > 0 (0 = the agent's own default)."""
        payload: dict[str, Any] = {"task": self.task, "agent": self.agent, "maxSteps": self.max_steps}
        if self.max_run_time_s > 0:
            payload["maxRunTimeSec"] = _seconds(self.max_run_time_s)
        if self.max_step_time_s > 0:
            payload["maxStepTimeSec"] = _seconds(self.max_step_time_s)
        payload["model"] = self.model.to_payload(redact=redact)
        payload["env"] = self.env.to_payload()
        payload["standardActionSpace"] = self.standard_action_space
        if self.sampling and self.sampling.to_payload():
            payload["sampling"] = self.sampling.to_payload()
        if self.start_from is not None:
            payload["startFrom"] = self.start_from.to_payload(redact=redact)
        payload.update(self.extra)
        return payload

    def redacted_payload(self) -> dict:
        return self.to_payload(redact=True)


TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled", "canceled", "error", "timeout", "stopped"})


@dataclass(frozen=True)
class RunStatus:
    """``GET /runs/{id}``: ``status`` is running|completed|failed (others are tolerated)."""

    status: str
    reason: str | None = None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


@dataclass
class RunResult:
    """How a run ended. ``ok`` means the *run* ended cleanly, not that the task was solved (the gym's
    evaluation decides that). ``num_steps`` is the highest 1-based step seen."""

    ok: bool
    reason: str | None
    answer: str | None
    steps: list[dict]
    events: list[RunEvent]
    model_outputs: list[ModelOutput]
    num_steps: int
    run_id: str | None = None
    status: str | None = None
    timed_out: bool = False
    errors: list[str] = field(default_factory=list)
    # The agent service itself failed while the run went (it stopped answering, or answered errors): the
    # episode is the infrastructure's failure, not the policy's.
    service_failed: bool = False
    # Whose failure a failed run was, when the agent says (``run_end``'s ``failure``; our agent service
    # does, local_agent/runner.RunFailed): "env" (the gym failed), "model" (the model server failed) or
    # "policy". None when the agent does not say.
    failure: str | None = None

    @property
    def infrastructure_failed(self) -> bool:
        """The run failed for a reason outside the policy: the agent service, the gym or the model server."""
        return self.service_failed or (not self.ok and self.failure in ("env", "model"))

    def as_execution_data(self) -> dict:
        """The §2.6 dict the original passed to evaluate as ``execution_data``."""
        return {"task_success": self.ok, "task_completed": self.ok, "num_turns": self.num_steps,
                "errors": list(self.errors), "result_message": self.reason, "answer": self.answer}
