"""The start-run payload the agent service accepts (docs/protocols.md §2.2, plus apiKey and sampling).

Why pydantic with camelCase aliases: the payload is the gbox-mini-agent's JSON; FastAPI turns a bad
payload into a 422 naming the offending field, so a caller learns what is wrong and nothing starts.
``apiKey`` is a ``SecretStr`` so it never reaches a log line, an event or ``GET /runs/{id}``.
"""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from ..http.input import MAX_JSON_DEPTH, too_deep
from ..mini_agent.models import ACTION_SPACES, DEFAULT_ACTION_SPACE
from .formats import format_names

MAX_STEPS = 1000
MAX_RUN_TIME_S = 24 * 3600.0   # maxRunTimeSec and maxStepTimeSec: at most a day
# Characters that cannot be in an id the agent puts into a gym URL as one path segment.
_NOT_IN_IDS = set("/\\?#%")


def http_url(value: str, field: str) -> str:
    """``value`` without a trailing slash if it is an http(s) URL with a host; ValueError naming ``field``."""
    if not value.startswith(("http://", "https://")):
        raise ValueError(f"{field} must be an http(s) URL, got {value!r}")
    try:
        host = urlsplit(value).hostname
    except ValueError as exc:
        raise ValueError(f"{field} is not a valid URL: {exc}") from None
    if not host:
        raise ValueError(f"{field} has no host: {value!r}")
    return value.rstrip("/")


def path_segment_id(value: str, field: str) -> str:
    """An id that is exactly one URL path segment (no ``..``, slashes, query or fragment marks, spaces)."""
    if value in (".", "..") or any(c in _NOT_IN_IDS or c.isspace() or not c.isprintable() for c in value):
        raise ValueError(f"{field} must be a plain id (no '/', '\\', '?', '#', '%', spaces, '.' or '..'), "
                         f"got {value!r}")
    return value


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


class ModelSpec(_Model):
    """The OpenAI-compatible endpoint called every step; ``name`` empty = first id of ``GET /models``."""

    base_url: str = Field(alias="baseUrl", min_length=1)
    name: str | None = None
    provider: str = "openai"
    api_key: SecretStr | None = Field(default=None, alias="apiKey")

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        return http_url(value, "model.baseUrl")


class EnvSpec(_Model):
    """The gym execution the agent screenshots and acts on."""

    type: Literal["genv"] = "genv"
    gym_base_url: str = Field(alias="gymBaseUrl", min_length=1)
    gym_id: str = Field(alias="gymId", min_length=1)
    execution_id: str = Field(alias="executionId", min_length=1)

    @field_validator("gym_base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        return http_url(value, "env.gymBaseUrl")

    @field_validator("gym_id", "execution_id")
    @classmethod
    def _segment(cls, value: str, info) -> str:
        return path_segment_id(value, {"gym_id": "env.gymId", "execution_id": "env.executionId"}[info.field_name])


class Sampling(BaseModel):
    """Sampling fields copied into every chat-completion request. Extra OpenAI fields (seed, stop, ...)
    pass through unchanged; ``model``/``messages`` cannot be overridden this way."""

    model_config = ConfigDict(extra="allow")

    temperature: float | None = Field(default=None, ge=0, le=100)
    top_p: float | None = Field(default=None, gt=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1, le=1 << 20)

    @model_validator(mode="after")
    def _shallow_extras(self) -> "Sampling":
        # Extra fields are copied into every model request: keep absurdly nested ones out (a 500 otherwise).
        if too_deep(self.model_extra or {}, MAX_JSON_DEPTH - 2):
            raise ValueError(f"sampling nested too deeply (at most {MAX_JSON_DEPTH - 2} levels)")
        return self

    def to_body(self) -> dict[str, Any]:
        body = {k: v for k, v in self.model_dump().items() if v is not None}
        for reserved in ("model", "messages", "stream"):
            body.pop(reserved, None)
        return body


class StartFrom(_Model):
    """``startFrom``: continue the episode of another run of this service after its first ``steps`` steps (a
    continuation on a forked execution: docs/local_agent.md, "Starting from another run's history"). ``apiKey``:
    the model key the parent run was started with, when the continuation's own ``model.apiKey`` is another (a
    policy endpoint's key per episode); a continuation that shows neither is refused (the parent's screenshots,
    replies and task would reach a stranger's model)."""

    run_id: str = Field(alias="runId", min_length=1, max_length=128)
    steps: int = Field(ge=1, le=MAX_STEPS)
    api_key: SecretStr | None = Field(default=None, alias="apiKey")

    @field_validator("run_id")
    @classmethod
    def _segment(cls, value: str) -> str:
        return path_segment_id(value, "startFrom.runId")


class RunRequest(_Model):
    """``POST /runs`` body."""

    task: str = Field(min_length=1)
    agent: str = "mai-ui"
    # Every limit has an upper bound too: a run of 1e308 s is a run that never ends (and holds its desktop).
    max_steps: int = Field(default=20, alias="maxSteps", ge=1, le=MAX_STEPS)
    max_run_time_sec: float | None = Field(default=None, alias="maxRunTimeSec", gt=0, le=MAX_RUN_TIME_S,
                                           allow_inf_nan=False)
    max_step_time_sec: float | None = Field(default=None, alias="maxStepTimeSec", gt=0, le=MAX_RUN_TIME_S,
                                            allow_inf_nan=False)
    model: ModelSpec
    env: EnvSpec
    standard_action_space: str = Field(default=DEFAULT_ACTION_SPACE, alias="standardActionSpace")
    sampling: Sampling | None = None
    # Extensions of this service (absent from the original protocol); the server's defaults apply if unset.
    history_images: int | None = Field(default=None, alias="historyImages", ge=1, le=32)
    max_invalid_turns: int | None = Field(default=None, alias="maxInvalidTurns", ge=1, le=MAX_STEPS)
    start_from: StartFrom | None = Field(default=None, alias="startFrom")

    @model_validator(mode="after")
    def _steps_left(self) -> "RunRequest":
        if self.start_from is not None and self.start_from.steps >= self.max_steps:
            raise ValueError(f"startFrom.steps ({self.start_from.steps}) leaves no step of maxSteps "
                             f"({self.max_steps}): the continuation's steps count from the episode's start")
        return self

    @field_validator("agent", "standard_action_space")
    @classmethod
    def _known(cls, value: str, info) -> str:
        name, known = (("agent", format_names()) if info.field_name == "agent"
                       else ("standardActionSpace", ACTION_SPACES))
        if value not in known:
            raise ValueError(f"unknown {name} {value!r}; known: {', '.join(known)}")
        return value

    @field_validator("task")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("task (the instruction) is blank")
        return value

    def redacted(self) -> dict[str, Any]:
        """The payload as JSON with the api key masked, for ``GET /runs/{id}`` and logs."""
        data = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        if self.model.api_key is not None:
            data["model"]["apiKey"] = "***"
        if self.start_from is not None and self.start_from.api_key is not None:
            data["startFrom"]["apiKey"] = "***"
        return data
