"""The agent service's start-run body (docs/protocols.md §2.2, plus ``apiKey``, ``sampling`` and our extensions):
one pydantic model per wire shape that the client (``mini_agent``) builds and dumps and our agent service
(``local_agent``) validates.

Why pydantic with camelCase aliases: the JSON is the gbox-mini-agent's; a bad value fails where the request is
built (the client: a ``ValueError`` before anything is sent) or where it arrives (the service: FastAPI's 422
naming the field). The service's own extra check, that ``agent`` names one of its prompt formats, is its
subclass's validator (local_agent/schema.py). Api keys are ``SecretStr``: a dump shows ``***`` unless
``to_payload()`` is asked for the real body, so a key reaches no log line, event or ``GET /runs/{id}``.
Unknown keys: the service ignores them (its subclass); the client sends service-specific ones as-is
(``RunRequest(..., extra={...})``).
"""

from __future__ import annotations

from typing import Any, Literal, get_args
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    SerializationInfo,
    field_serializer,
    field_validator,
    model_validator,
)

from ..http.input import MAX_JSON_DEPTH, too_deep

ActionSpace = Literal["mobile", "pc"]
ACTION_SPACES: tuple[str, ...] = get_args(ActionSpace)
# The desktop action space when a caller names none (the client and our agent service alike).
DEFAULT_ACTION_SPACE = "pc"
# What an agent service lists in ``/health``'s ``features`` when it continues another run's episode (``startFrom``,
# our agent service's extension: docs/local_agent.md): what a tree group needs of its agent.
START_FROM = "startFrom"
MAX_STEPS = 1000
MAX_RUN_TIME_S = 24 * 3600.0   # maxRunTimeSec and maxStepTimeSec: at most a day
# Characters that cannot be in an id the agent puts into a gym URL as one path segment.
_NOT_IN_IDS = set("/\\?#%")
# The fields a caller may also set through ``extra`` (our service's knobs that a stock agent does not know).
_EXTENSIONS = frozenset({"history_images", "max_invalid_turns"})


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


class _Wire(BaseModel):
    """A wire shape: built by field name or JSON name; immutable once built."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)

    def to_payload(self, *, redact: bool = False) -> dict[str, Any]:
        """The JSON (api keys as ``***`` when ``redact``), unset fields left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True, context={"secrets": not redact})


def _key(value: SecretStr | None, info: SerializationInfo) -> str | None:
    """An api key as dumped: the key itself only where the dump asks for it (``context={"secrets": True}``)."""
    if value is None:
        return None
    return value.get_secret_value() if (info.context or {}).get("secrets") else "***"


class ModelEndpoint(_Wire):
    """``model``: the OpenAI-compatible endpoint the agent calls every step (our policy endpoint in training);
    ``name`` empty or unset = the first id of its ``GET /models``."""

    base_url: str = Field(alias="baseUrl", min_length=1)
    name: str | None = None
    provider: str = "openai"
    api_key: SecretStr | None = Field(default=None, alias="apiKey")

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        return http_url(value, "model.baseUrl")

    @field_validator("api_key", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return None if value == "" else value

    _dump_key = field_serializer("api_key")(_key)


class GenvEnv(_Wire):
    """``env``: where the agent acts, an execution of a genv gym (it screenshots and acts through it)."""

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


class Sampling(_Wire):
    """``sampling``: copied into every chat-completion request the agent makes (OpenAI field names; None = not
    sent). Extra OpenAI fields (seed, stop, ...) pass through unchanged; ``model``/``messages``/``stream`` cannot
    be overridden this way."""

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
        """The fields set, as they go into a chat-completion request."""
        body = {k: v for k, v in self.model_dump().items() if v is not None}
        for reserved in ("model", "messages", "stream"):
            body.pop(reserved, None)
        return body


class StartFrom(_Wire):
    """``startFrom``: continue the episode of another run of the service after its first ``steps`` steps (a
    continuation on a forked execution: its first step is ``steps + 1``, its prompt history the parent's, and its
    time limits count from the episode's start as ``maxSteps`` does: it has the time its parent has left, of the
    run and, while the parent's next step runs (a tree's held call), of that step; docs/local_agent.md, "Starting
    from another run's history"). ``apiKey``: the model key the parent run was started with, the proof that the
    caller started it, when the continuation's own ``model.apiKey`` is another (a policy endpoint's key per
    episode); a continuation that shows neither is refused (the parent's screenshots, replies and task would
    reach a stranger's model). Our agent service's extension."""

    run_id: str = Field(alias="runId", min_length=1, max_length=128)
    steps: int = Field(ge=1, le=MAX_STEPS)
    api_key: SecretStr | None = Field(default=None, alias="apiKey")

    @field_validator("run_id")
    @classmethod
    def _segment(cls, value: str) -> str:
        return path_segment_id(value, "startFrom.runId")

    _dump_key = field_serializer("api_key")(_key)


class RunRequest(_Wire):
    """``POST /runs``: one agent run on one execution. ``extra``: service-specific keys sent as-is (say a
    stock agent's own knob); one that names an extension of ours (``historyImages``) sets that field, one that
    names a documented field is refused. Keys beyond the fields are kept (and sent); our service ignores them."""

    model_config = ConfigDict(extra="allow")

    task: str = Field(min_length=1)
    agent: str = "mai-ui"
    # Every limit has an upper bound too: a run of 1e308 s is a run that never ends (and holds its desktop).
    max_steps: int = Field(default=20, alias="maxSteps", ge=1, le=MAX_STEPS)
    # None: the service's own default.
    max_run_time_s: float | None = Field(default=None, alias="maxRunTimeSec", gt=0, le=MAX_RUN_TIME_S,
                                         allow_inf_nan=False)
    max_step_time_s: float | None = Field(default=None, alias="maxStepTimeSec", gt=0, le=MAX_RUN_TIME_S,
                                          allow_inf_nan=False)
    model: ModelEndpoint
    env: GenvEnv
    standard_action_space: ActionSpace = Field(default=DEFAULT_ACTION_SPACE, alias="standardActionSpace")
    sampling: Sampling | None = None
    # Extensions of our service (absent from the original protocol); the service's defaults apply if unset.
    history_images: int | None = Field(default=None, alias="historyImages", ge=1, le=32)
    max_invalid_turns: int | None = Field(default=None, alias="maxInvalidTurns", ge=1, le=MAX_STEPS)
    start_from: StartFrom | None = Field(default=None, alias="startFrom")

    @model_validator(mode="after")
    def _steps_left(self) -> "RunRequest":
        if self.start_from is not None and self.start_from.steps >= self.max_steps:
            raise ValueError(f"startFrom.steps ({self.start_from.steps}) leaves no step of maxSteps "
                             f"({self.max_steps}): the continuation's steps count from the episode's start")
        return self

    @field_validator("task")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("task (the instruction) is blank")
        return value

    def __init__(self, /, extra: dict[str, Any] | None = None, **fields: Any) -> None:
        clash = sorted(set(extra or {}) & _documented_keys(type(self)))
        if clash:
            raise ValueError(f"RunRequest.extra may not override the documented keys {clash}")
        super().__init__(**fields, **(extra or {}))

    def to_payload(self, *, redact: bool = False) -> dict[str, Any]:
        """The JSON body (api keys as ``***`` when ``redact``): unset fields and an empty ``sampling`` left
        out, extra keys last."""
        body = super().to_payload(redact=redact)
        if self.sampling is not None and not self.sampling.to_body():
            del body["sampling"]
        return body

    def redacted(self) -> dict[str, Any]:
        """The body with api keys masked, for logs and ``GET /runs/{id}``."""
        return self.to_payload(redact=True)


def _documented_keys(model: type[BaseModel]) -> set[str]:
    """The names and JSON names of ``model``'s fields that ``extra`` may not set (all but our extensions)."""
    fields = {name: f for name, f in model.model_fields.items() if name not in _EXTENSIONS}
    return set(fields) | {f.alias for f in fields.values() if f.alias}
