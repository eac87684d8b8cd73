"""Typed run status and run result (docs/protocols.md §2.6) of the gbox-mini-agent, as the client reads them.

The start-run request the client sends is not here: it is the wire contract that the client and our agent
service both import, cua_rl/wire/agent.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .events import ModelOutput, RunEvent

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
