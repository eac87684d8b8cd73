"""What the service keeps about one run: status, events, steps, tokens, screenshots.

Why in memory and append-only: a run's record is written only by its own asyncio task and read by the
HTTP handlers on the same event loop, so no locks are needed and runs cannot see each other's state.
Screenshots are stored once, as the data-URL string sent to the model; request bodies in ``model_call``
events reference the same string objects, so keeping the exact bodies costs no extra copies.
"""

from __future__ import annotations

import base64
import bisect
import dataclasses
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ..mini_agent.states import RunFailure, RunState


def iso(dt: datetime) -> str:
    """ISO-8601 UTC with milliseconds and ``Z`` (what JavaScript's ``toISOString`` writes)."""
    return dt.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_time(value: str) -> datetime:
    """A ``from``/``to`` query value: ISO-8601 (``Z`` or offset; naive = UTC) or epoch milliseconds."""
    text = value.strip()
    if text.lstrip("-").replace(".", "", 1).isdigit():
        return datetime.fromtimestamp(float(text) / 1000.0, tz=timezone.utc)
    dt = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


def _ms(dt: datetime) -> datetime:
    """Truncate to milliseconds so stored times compare equal to the ISO strings clients send back."""
    return dt.replace(microsecond=dt.microsecond // 1000 * 1000)


@dataclass(frozen=True)
class ResumePoint:
    """Where a run stood after one of its steps, what another run needs to continue its episode from there
    (``startFrom``): the prompt history (``formats.HistoryStep``s), the pointer position, the feedback the
    next step's screenshot carries, the invalid replies in a row so far, and the seconds of ``maxRunTimeSec`` the
    path had used. A continuation starts from a copy (``continued``) that also counts the time its parent has
    spent on its next step meanwhile (a tree's held call): siblings have equal time. Kept in memory only."""

    steps: int
    history: tuple[Any, ...]
    pointer: tuple[float, float] | None
    feedback: str | None
    invalid_in_a_row: int
    elapsed_s: float = 0.0
    next_step_s: float = 0.0   # of ``maxStepTimeSec``: what the parent's next step had used when this copy was made

    def continued(self, parent: "RunRecord") -> "ResumePoint":
        """This point as a continuation starts from it: when ``parent`` is running the step after it, the seconds
        it has spent on that step count against the continuation's run and first step too."""
        running = parent.running_step
        if parent.finished or running is None or running[0] != self.steps + 1:
            return self
        spent = max(time.monotonic() - running[1], 0.0)
        return dataclasses.replace(self, elapsed_s=self.elapsed_s + spent, next_step_s=spent)


@dataclass
class RunRecord:
    run_id: str
    request: dict[str, Any]                      # redacted payload
    agent: str
    status: RunState = RunState.RUNNING
    ok: bool | None = None
    reason: str | None = None
    answer: str | None = None
    created_at: datetime = field(default_factory=lambda: _ms(datetime.now(timezone.utc)))
    ended_at: datetime | None = None
    ended_monotonic: float | None = None
    invalid_turns: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    tokens: list[dict[str, Any]] = field(default_factory=list)
    screenshots: dict[str, str] = field(default_factory=dict)   # name -> data URL
    cancel_requested: bool = False
    running_step: tuple[int, float] | None = None   # (the step running now, when it began: time.monotonic)
    resume_points: list[ResumePoint] = field(default_factory=list, repr=False)   # one per finished path step
    # SHA-256 of the model key the run was started with (b"": none): a continuation (startFrom) must show that key
    key_digest: bytes = field(default=b"", repr=False)
    _event_times: list[datetime] = field(default_factory=list, repr=False)

    # -- events --------------------------------------------------------------------------------------

    def now(self) -> datetime:
        """Current time, never earlier than the last event's (so ``from=<last ts>`` polling is safe)."""
        now = _ms(datetime.now(timezone.utc))
        if self._event_times and now < self._event_times[-1]:
            now = self._event_times[-1]
        return now

    def emit(self, type: str, step: int | None = None, **fields: Any) -> dict[str, Any]:
        at = self.now()
        event: dict[str, Any] = {"type": type, "ts": iso(at)}
        if step is not None:
            event["step"] = step
        event.update(fields)
        self.events.append(event)
        self._event_times.append(at)
        return event

    def events_between(self, start: datetime | None, end: datetime | None) -> list[dict[str, Any]]:
        """Events with ``start <= ts < end`` (either bound optional), in order."""
        lo = bisect.bisect_left(self._event_times, start) if start else 0
        hi = bisect.bisect_left(self._event_times, end) if end else len(self.events)
        return self.events[lo:hi]

    # -- end ---------------------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return self.status != RunState.RUNNING

    def finish(self, ok: bool, reason: str, status: RunState | None = None, failure: RunFailure | None = None) -> None:
        """Set the final state once and emit ``run_end`` (with ``failure``, whose failure it was: see
        ``runner.RunFailed``); later calls are ignored."""
        if self.finished:
            return
        self.ok, self.reason = ok, reason
        self.status = status or (RunState.COMPLETED if ok else RunState.FAILED)
        self.ended_at = self.now()
        self.ended_monotonic = time.monotonic()
        fields: dict[str, Any] = {"ok": ok, "reason": reason}
        if failure is not None and not ok:
            fields["failure"] = str(failure)   # the wire value
        if self.answer is not None:
            fields["answer"] = self.answer
        self.emit("run_end", **fields)

    # -- views -------------------------------------------------------------------------------------

    def screenshot_png(self, name: str) -> tuple[bytes, str] | None:
        data_url = self.screenshots.get(name)
        if data_url is None:
            return None
        header, _, payload = data_url.partition(",")
        media = header[5:].split(";")[0] or "image/png"
        return base64.b64decode(payload), media

    def summary(self) -> dict[str, Any]:
        """``GET /runs/{id}``: status plus the result (answer included)."""
        return {
            "runId": self.run_id, "status": self.status, "ok": self.ok, "reason": self.reason,
            "answer": self.answer, "agent": self.agent, "steps": len(self.steps),
            "invalidTurns": self.invalid_turns, "createdAt": iso(self.created_at),
            "endedAt": iso(self.ended_at) if self.ended_at else None, "request": self.request,
        }
