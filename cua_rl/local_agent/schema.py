"""The start-run body as our agent service accepts it: the one wire contract (cua_rl/wire/agent.py), checked once
more where only the service can: ``agent`` must name one of its prompt formats.

Why a subclass that adds validators only: the fields, their JSON names and bounds are the client's too, stated
once; FastAPI turns a bad body into a 422 naming the offending field, so a caller learns what is wrong and
nothing starts. Keys beyond the contract are ignored (a stock gbox-mini-agent caller may send its own).
"""

from __future__ import annotations

from pydantic import ConfigDict, field_validator

from ..wire.agent import RunRequest as WireRunRequest
from .formats import format_names


class RunRequest(WireRunRequest):
    """``POST /runs`` body, as validated by the service."""

    model_config = ConfigDict(extra="ignore")

    @field_validator("agent")
    @classmethod
    def _known_format(cls, value: str) -> str:
        if value not in format_names():
            raise ValueError(f"unknown agent {value!r}; known: {', '.join(format_names())}")
        return value
