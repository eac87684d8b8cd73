"""Run events of the gbox-mini-agent (docs/protocols.md §2.3): de-duplication and normalisation.

Why: events are polled with an inclusive ``from`` timestamp, so every poll repeats some; they are
de-duplicated on ``type:ts:step:actionIndex`` (the original's key, on the raw values). Servers drifted:
old ones say ``turn_start``/``turn_end`` and number steps (``step`` or ``turn``) from 0, new ones say
``step_start``/``step_end`` and number from 1. We normalise to ``step_*`` names and 1-based steps.

Base detection: a 0-based server reports step 0 for its first step and a 1-based one never reports 0,
so a run whose events contain any step (or turn) number 0 is 0-based and every step gets +1. The
decision is made over all events seen so far (``EventLog.events()`` recomputes), so an early read
cannot lock in the wrong base.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

TYPE_ALIASES = {"turn_start": "step_start", "turn_end": "step_end"}
ANSWER_ACTIONS = frozenset({"finished", "finish", "answer", "run_end"})


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def raw_step(event: dict) -> int | None:
    """The step number as the server wrote it (``step``, else ``turn``)."""
    step = _int(event.get("step"))
    return step if step is not None else _int(event.get("turn"))


def event_key(event: dict) -> str:
    """De-duplication key ``type:ts:step:actionIndex`` of a raw event."""
    return f"{event.get('type')}:{event.get('ts')}:{raw_step(event)}:{event.get('actionIndex')}"


@dataclass(frozen=True)
class RunEvent:
    """A normalised event: ``type`` uses ``step_*`` names, ``step`` is 1-based; ``data`` is the raw event."""

    type: str
    raw_type: str
    ts: str | int | float | None
    step: int | None
    action_index: int | None
    data: dict = field(repr=False, compare=False)


@dataclass(frozen=True)
class ModelOutput:
    """The full chat-completion response of one model call (``model_output.modelOutput``)."""

    step: int | None
    output: dict


def answer_of_action(action: Any) -> str | None:
    """The final answer carried by a ``finished``/``answer``/``run_end`` action (args.content or text)."""
    if not isinstance(action, dict) or str(action.get("name", "")).lower() not in ANSWER_ACTIONS:
        return None
    args = action.get("args") if isinstance(action.get("args"), dict) else {}
    for value in (args.get("content"), args.get("text"), args.get("answer"), action.get("text")):
        if isinstance(value, str) and value.strip():
            return value
    return None


class EventLog:
    """Accumulates polled events of one run, without duplicates, in arrival order."""

    def __init__(self) -> None:
        self._raw: list[dict] = []
        self._keys: set[str] = set()

    def add(self, events: Iterable[Any]) -> int:
        """Add raw events (non-dicts are ignored); returns how many were new."""
        added = 0
        for event in events:
            if not isinstance(event, dict):
                continue
            key = event_key(event)
            if key in self._keys:
                continue
            self._keys.add(key)
            self._raw.append(event)
            added += 1
        return added

    def __len__(self) -> int:
        return len(self._raw)

    @property
    def last_ts(self) -> str | None:
        """The newest ``ts`` seen, as the next poll's inclusive ``from``."""
        for event in reversed(self._raw):
            if event.get("ts") is not None:
                return str(event["ts"])
        return None

    @property
    def zero_based(self) -> bool:
        return any(raw_step(e) == 0 for e in self._raw)

    def events(self) -> list[RunEvent]:
        offset = 1 if self.zero_based else 0
        out = []
        for e in self._raw:
            raw_type = str(e.get("type", ""))
            step = raw_step(e)
            out.append(RunEvent(type=TYPE_ALIASES.get(raw_type, raw_type), raw_type=raw_type, ts=e.get("ts"),
                                step=None if step is None else step + offset,
                                action_index=_int(e.get("actionIndex")), data=e))
        return out

    def run_end(self) -> RunEvent | None:
        ends = [e for e in self.events() if e.type == "run_end"]
        return ends[-1] if ends else None

    def model_outputs(self) -> list[ModelOutput]:
        return [ModelOutput(step=e.step, output=e.data["modelOutput"]) for e in self.events()
                if e.type == "model_output" and isinstance(e.data.get("modelOutput"), dict)]

    def errors(self) -> list[str]:
        return [str(e.data.get("message", "")) for e in self.events() if e.type == "error"]

    def answer(self) -> str | None:
        """Last answer from an answer action, or a ``run_end`` event's own ``answer`` field."""
        found = None
        for e in self.events():
            candidate = answer_of_action(e.data.get("action")) if e.type == "action_executed" else None
            if e.type == "run_end" and isinstance(e.data.get("answer"), str) and e.data["answer"].strip():
                candidate = e.data["answer"]
            found = candidate or found
        return found

    def num_steps(self) -> int:
        return max((e.step for e in self.events() if e.step is not None), default=0)
