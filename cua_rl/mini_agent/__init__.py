"""Async client of a gbox-mini-agent-compatible agent service: start, poll, cancel, typed results.
The start-run request types are the wire contract (cua_rl/wire/agent.py), re-exported here."""

from ..wire.agent import ACTION_SPACES, START_FROM, GenvEnv, ModelEndpoint, RunRequest, Sampling, StartFrom
from .client import MiniAgentClient, MiniAgentError
from .events import EventLog, ModelOutput, RunEvent, answer_of_action, event_key
from .models import TERMINAL_STATUSES, RunResult, RunStatus

__all__ = ["MiniAgentClient", "MiniAgentError", "EventLog", "ModelOutput", "RunEvent", "answer_of_action",
           "event_key", "ACTION_SPACES", "GenvEnv", "ModelEndpoint", "RunRequest", "RunResult", "RunStatus",
           "Sampling", "START_FROM", "StartFrom", "TERMINAL_STATUSES"]
