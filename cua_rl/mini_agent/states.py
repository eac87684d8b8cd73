"""The closed sets of the agent service's protocol (gbox-mini-agent's, which ours serves): a run's states and whose
failure a failed run was. One definition each, for both sides: our agent service (cua_rl/local_agent) writes
them, this client and the workflow read them. ``StrEnum``: a member is its wire value (``RunState.COMPLETED ==
"completed"``, JSON writes ``"completed"``), so nothing on the wire changes; a value another agent service
sends outside these sets is kept as the string it is (``RunStatus.status``, ``RunResult.failure``)."""

from __future__ import annotations

from enum import StrEnum


class RunState(StrEnum):
    """``GET /runs/{id}``'s ``status``: running until the run ends, then completed (``ok: true``), failed or
    cancelled (``POST /runs/{id}/cancel``)."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class RunFailure(StrEnum):
    """Whose failure a failed run was (``run_end``'s ``failure``): ``env`` (the gym failed a read or an action
    after retries), ``model`` (the model server failed after retries, or a step's time ran out waiting for it),
    ``policy`` (the model's own doing: invalid replies, step time). A trainer never scores ``env`` or ``model``
    as the policy's."""

    ENV = "env"
    MODEL = "model"
    POLICY = "policy"
