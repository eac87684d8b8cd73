"""Async client of a gbox-mini-agent-compatible agent service: start, poll, cancel, typed results."""

from .client import MiniAgentClient, MiniAgentError
from .events import EventLog, ModelOutput, RunEvent, answer_of_action, event_key
from .models import (ACTION_SPACES, START_FROM, GenvEnv, ModelEndpoint, RunRequest, RunResult, RunStatus, Sampling,
                     StartFrom, TERMINAL_STATUSES)

__all__ = ["MiniAgentClient", "MiniAgentError", "EventLog", "ModelOutput", "RunEvent", "answer_of_action",
           "event_key", "ACTION_SPACES", "GenvEnv", "ModelEndpoint", "RunRequest", "RunResult", "RunStatus",
           "Sampling", "START_FROM", "StartFrom", "TERMINAL_STATUSES"]
