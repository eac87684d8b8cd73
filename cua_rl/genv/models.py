"""Typed views of the gym's task and create-execution replies (docs/protocols.md §1.2, §1.3).

Why so many fallbacks: gyms in the field emit several task schemas (flat, ``meta{...}`` umetrip files,
UUID ids with ``meta.number``). Every field is looked up along a fixed chain and the untouched dict is
kept in ``raw`` so nothing is lost. Difficulty is derived from the tags, never invented.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .errors import GenvError

DIFFICULTY_TAGS = ("easy", "normal", "hard")
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.I)
# A task number is a whole-digit string ("011"), a leading run ("011_open_settings", "3 Open app"),
# or a trailing run after a separator ("task-001"); digits buried in words are not numbers.
_NUMBER_PATTERNS = (re.compile(r"^(\d+)$"), re.compile(r"^(\d+)[-_ .:]"), re.compile(r"[-_ .:#](\d+)$"))


def _first(*values: Any) -> Any:
    """First value that is neither None nor an empty string."""
    for value in values:
        if value is not None and value != "":
            return value
    return None


def _number_in(text: str | None) -> int | None:
    if not text or _UUID.match(text):
        return None
    for pattern in _NUMBER_PATTERNS:
        match = pattern.search(text.strip())
        if match:
            return int(match.group(1))
    return None


def _parse_number(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        return _number_in(value)
    return None


def _parse_tags(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, (list, tuple)):
        return ()
    return tuple(str(t).strip() for t in value if str(t).strip())


def difficulty_from_tags(tags: tuple[str, ...] | list[str]) -> str | None:
    """``easy``/``normal``/``hard`` from the tags (case-insensitive; ``medium`` counts as ``normal``)."""
    lowered = {t.lower() for t in tags}
    if "medium" in lowered:
        lowered.add("normal")
    for level in DIFFICULTY_TAGS:
        if level in lowered:
            return level
    return None


@dataclass(frozen=True)
class Task:
    """One gym task. ``id`` is the URL key; ``instruction`` is what the agent is told to do."""

    id: str
    number: int | None
    name: str
    description: str
    instruction: str
    tags: tuple[str, ...] = ()
    difficulty: str | None = None
    env: dict | None = None
    evaluation: dict | None = None
    seed_id: str | None = None
    timeout_s: float | None = None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_complete(self) -> bool:
        """False when a list entry lacks what ``get_task`` would fill in (description, env, evaluation)."""
        return bool(self.raw.get("description") or (self.raw.get("meta") or {}).get("description")) \
            and self.env is not None and self.evaluation is not None

    @classmethod
    def from_raw(cls, raw: Any) -> "Task":
        """Parse any task shape of §1.2; raises ``GenvError`` when there is no usable id."""
        if not isinstance(raw, dict):
            raise GenvError(f"task entry is not an object: {type(raw).__name__}")
        meta = raw.get("meta") if isinstance(raw.get("meta"), dict) else {}
        task_id = _first(raw.get("task_id"), raw.get("id"), meta.get("id"))
        if task_id is None or isinstance(task_id, (dict, list, bool)):
            raise GenvError(f"task has no id (task_id / id / meta.id): keys={sorted(raw)}")
        task_id = str(task_id)
        name = str(_first(raw.get("name"), raw.get("display_name"), raw.get("task_name"),
                          meta.get("displayName"), meta.get("name"), task_id))
        number = _parse_number(_first(raw.get("task_number"), meta.get("number")))
        if number is None:
            number = _number_in(task_id)
        if number is None:
            number = _number_in(name)
        description = str(_first(raw.get("description"), meta.get("description"), name))
        instruction = str(_first(raw.get("instruction"), meta.get("instruction"), description))
        tags = _parse_tags(_first(raw.get("tags"), meta.get("tags")))
        difficulty = difficulty_from_tags(tags)
        if difficulty is None:  # an explicit field is still data from the gym, not a guess
            explicit = _first(raw.get("difficulty"), meta.get("difficulty"))
            difficulty = difficulty_from_tags([str(explicit)]) if explicit else None
        env = _first(raw.get("env_config"), raw.get("env"))
        evaluation = raw.get("evaluation")
        timeout = _first(raw.get("timeout_sec"), meta.get("timeoutSec"), meta.get("timeout_sec"))
        return cls(
            id=task_id, number=number, name=name, description=description, instruction=instruction,
            tags=tags, difficulty=difficulty,
            env=env if isinstance(env, dict) else None,
            evaluation=evaluation if isinstance(evaluation, dict) else None,
            seed_id=None if raw.get("seed_id") is None else str(raw.get("seed_id")),
            timeout_s=float(timeout) if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) else None,
            raw=raw,
        )


_DEVICE_KEYS = ("box_id", "gbox_id", "device_id", "device_serial")


@dataclass(frozen=True)
class Execution:
    """Reply of create-execution. ``device_id`` is only informative (box/gbox/device serial).

    ``instruction`` is the concrete instruction of a generated instance (e.g. a seeded MiniWoB++ page's
    utterance) when the gym sends one; the agent gets it in place of the task's general instruction."""

    execution_id: str
    task_id: str | None = None
    status: str | None = None
    device_id: str | None = None
    instruction: str | None = None
    seed: int | None = None
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_raw(cls, raw: Any) -> "Execution":
        """Requires a non-empty string ``execution_id`` (§1.3); anything else is a ``GenvError``."""
        if not isinstance(raw, dict):
            raise GenvError(f"create-execution reply is not an object: {str(raw)[:200]}")
        eid = raw.get("execution_id")
        if not isinstance(eid, str) or not eid.strip():
            raise GenvError(f"create-execution reply has no string execution_id: {str(raw)[:300]}")
        device = raw.get("device") if isinstance(raw.get("device"), dict) else {}
        device_id = _first(*(raw.get(k) for k in _DEVICE_KEYS), *(device.get(k) for k in _DEVICE_KEYS))
        instruction = raw.get("instruction")
        seed = raw.get("seed")
        return cls(execution_id=eid, task_id=None if raw.get("task_id") is None else str(raw["task_id"]),
                   status=raw.get("status") if isinstance(raw.get("status"), str) else None,
                   device_id=None if device_id is None else str(device_id),
                   instruction=instruction.strip() if isinstance(instruction, str) and instruction.strip() else None,
                   seed=seed if isinstance(seed, int) and not isinstance(seed, bool) else None, raw=raw)


@dataclass(frozen=True)
class Fork:
    """Reply of a fork (docs/protocols.md §1.9): the children, each a create reply, and ``mask``, the pixel
    rectangles ``(x0, y0, x1, y1)`` (x1, y1 exclusive) outside which every child's screen equalled the parent's
    at the fork (empty: equal everywhere)."""

    executions: tuple[Execution, ...]
    mask: tuple[tuple[int, int, int, int], ...] = ()
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_raw(cls, raw: Any) -> "Fork":
        """Requires ``executions``, a non-empty list of objects with an ``execution_id`` (or ``id``), and a
        ``mask`` of four-integer lists when present; anything else is a ``GenvError``."""
        if not isinstance(raw, dict) or not isinstance(raw.get("executions"), list) or not raw["executions"]:
            raise GenvError(f"fork reply has no list of executions: {str(raw)[:300]}")
        children = []
        for entry in raw["executions"]:
            if isinstance(entry, dict) and "execution_id" not in entry and isinstance(entry.get("id"), str):
                entry = {**entry, "execution_id": entry["id"]}
            children.append(Execution.from_raw(entry))
        mask = raw.get("mask") or []
        if not isinstance(mask, list) or not all(
                isinstance(r, list) and len(r) == 4 and all(isinstance(v, int) and not isinstance(v, bool) for v in r)
                for r in mask):
            raise GenvError(f"fork reply's mask is not a list of [x0, y0, x1, y1] pixel rectangles: {str(mask)[:200]}")
        return cls(executions=tuple(children), mask=tuple(tuple(r) for r in mask), raw=raw)
