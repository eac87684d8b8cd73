"""Validators: weighted checks of real state in an execution's files, with partial credit.

The files are a view with ``refuse``/``kind``/``read``/``listdir`` over paths: ``HomeFiles`` for an X11
desktop's HOME, ``vm.backend.GuestFiles`` for a VM's guest (through its guest agent). On the host, checks run
as the gym's user (root) on files a hostile desktop controls, so a path must follow ``home_paths.home_parts``
(relative, no ``..``: the same rule as a task's set-up) and is opened by ``home_paths.HomeDir``: no link is ever
followed, no FIFO ever opened for reading, whatever the desktop swaps in between two looks (``PathRefused``).
Messages never quote file contents (they go back over the API).

A task file's validator is a ``ValidatorSpec``; ``TYPES`` is the one table of validator types: what each
needs in its spec, what it reads and its check. The spec's validation and ``check`` both go by it.
"""

from __future__ import annotations

import configparser
import datetime
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .home_paths import HomeDir, PathRefused, home_parts

MAX_READ = 1 << 20


@dataclass(frozen=True)
class ValidatorResult:
    id: str
    passed: bool
    score: float
    weight: float
    message: str

    def to_wire(self) -> dict:
        return {"id": self.id, "pass": self.passed, "score": self.score, "weight": self.weight,
                "message": self.message}


class HomeFiles:
    """A host HOME folder as the validators see it: paths relative to it (``home_parts``), opened beneath it
    without following links or blocking (``HomeDir``); ``PathRefused`` when what is there is not read."""

    def __init__(self, home: Path | str) -> None:
        self.home = Path(home)
        self._dir = HomeDir(home)

    def refuse(self, rel: str) -> str | None:
        try:
            home_parts(rel)
        except ValueError as exc:
            return f"refused: {exc}"
        return None

    def kind(self, rel: str) -> str | None:
        """"file" (a regular file), "dir", "other" (a link, a FIFO, a socket...) or None when nothing is there."""
        st = self._dir.lstat(rel)
        if st is None:
            return None
        return "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"

    def read(self, rel: str, limit: int = MAX_READ) -> str | None:
        data = self._dir.read(rel, limit)
        return None if data is None else data.decode("utf-8", errors="replace")

    def listdir(self, rel: str) -> list[str] | None:
        return self._dir.listdir(rel)


def _norm(text: str) -> str:
    """Compare texts modulo trailing whitespace per line and trailing blank lines (editors add them)."""
    return "\n".join(line.rstrip() for line in text.replace("\r\n", "\n").split("\n")).rstrip("\n")


class ValidatorSpec(BaseModel):
    """One check. ``path`` is relative to the execution's HOME; the other fields depend on ``type``.

    ``answer_matches`` checks the agent's final answer (evaluate's ``answer_text``) against ``pattern``
    (re.fullmatch after stripping, case-insensitive) and needs no path."""

    model_config = ConfigDict(extra="forbid")
    id: str
    type: str
    weight: float = Field(1.0, gt=0)
    path: str = ""
    text: str | None = None              # file_equals / file_contains / file_not_contains
    pattern: str | None = None           # file_matches (re.search, MULTILINE)
    date_format: str | None = None       # file_date: strftime format every non-blank line must parse with
    steps: list[str] | None = None       # file_ordered: texts that must appear in this order (partial credit)
    names: list[str] | None = None       # dir_entries: names that must be present
    exact: bool = False                  # dir_entries: and nothing else
    section: str | None = None           # ini_value
    key: str | None = None
    value: str | None = None

    @model_validator(mode="after")
    def _fields_for_type(self) -> "ValidatorSpec":
        kind = TYPES.get(self.type)
        if kind is None:
            raise ValueError(f"unknown validator type {self.type!r}")
        missing = [f for f in kind.needs if getattr(self, f) is None]
        if missing:
            raise ValueError(f"validator {self.id}: type {self.type} needs {missing}")
        if not self.path and kind.reads != "answer":
            raise ValueError(f"validator {self.id}: needs a path")
        if self.pattern is not None:
            re.compile(self.pattern)
        if self.steps is not None and not (self.steps and all(self.steps)):
            raise ValueError(f"validator {self.id}: steps must be non-empty texts")
        if self.date_format is not None and "%" not in self.date_format:
            raise ValueError(f"validator {self.id}: date_format {self.date_format!r} has no strftime field")
        return self


# ---- the checks, one per type: each returns (score, message); a bool score is all or nothing -------------
Outcome = tuple[float, str]   # a bool is a score too (True = 1.0)


def _answer_matches(spec: ValidatorSpec, answer: str | None) -> Outcome:
    if answer is None:
        return False, "no answer was given"
    ok = re.fullmatch(spec.pattern, answer.strip(), re.IGNORECASE | re.DOTALL) is not None
    return ok, f"answer {'matches' if ok else 'does not match'} the expected one"


def _file_exists(spec: ValidatorSpec, files) -> Outcome:
    kind = files.kind(spec.path)
    return kind == "file", f"{spec.path}: {'exists' if kind == 'file' else 'missing'}"


def _file_absent(spec: ValidatorSpec, files) -> Outcome:
    kind = files.kind(spec.path)
    return kind is None, f"{spec.path}: {'absent' if kind is None else 'still exists'}"


def _dir_exists(spec: ValidatorSpec, files) -> Outcome:
    kind = files.kind(spec.path)
    return kind == "dir", f"{spec.path}: {'is a folder' if kind == 'dir' else 'no such folder'}"


def _dir_entries(spec: ValidatorSpec, files) -> Outcome:
    names = files.listdir(spec.path)
    if names is None:
        return False, f"{spec.path}: no such folder"
    have = set(names)
    missing = [n for n in spec.names if n not in have]
    extra = sorted(have - set(spec.names)) if spec.exact else []
    ok = not missing and not extra
    return ok, f"{spec.path}: missing {missing}, unexpected {extra}" if not ok else f"{spec.path}: ok"


def _ini_value(spec: ValidatorSpec, text: str) -> Outcome:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        parser.read_string(text)
        value = parser.get(spec.section, spec.key, fallback=None)
    except configparser.Error:
        value = None
    ok = value is not None and value.strip() == spec.value
    return ok, f"{spec.path}: [{spec.section}] {spec.key} {'is' if ok else 'is not'} {spec.value}"


def _file_equals(spec: ValidatorSpec, text: str) -> Outcome:
    ok = _norm(text) == _norm(spec.text)
    return ok, f"{spec.path}: content {'matches' if ok else 'differs'}"


def _file_contains(spec: ValidatorSpec, text: str) -> Outcome:
    ok = spec.text in text
    return ok, f"{spec.path}: {'contains' if ok else 'lacks'} the expected text"


def _file_not_contains(spec: ValidatorSpec, text: str) -> Outcome:
    ok = spec.text not in text
    return ok, f"{spec.path}: {'free of' if ok else 'still has'} the unwanted text"


def _file_matches(spec: ValidatorSpec, text: str) -> Outcome:
    ok = re.search(spec.pattern, text, re.MULTILINE) is not None
    return ok, f"{spec.path}: {'matches' if ok else 'does not match'} /{spec.pattern}/"


def _file_non_empty(spec: ValidatorSpec, text: str) -> Outcome:
    ok = bool(text.strip())
    return ok, f"{spec.path}: {'has content' if ok else 'is empty'}"


def _file_date(spec: ValidatorSpec, text: str) -> Outcome:
    return _dates(text, spec.date_format, spec.path)


def _file_ordered(spec: ValidatorSpec, text: str) -> Outcome:
    done = _steps_in_order(text, spec.steps)
    return done / len(spec.steps), f"{spec.path}: {done} of {len(spec.steps)} steps in order"


@dataclass(frozen=True)
class ValidatorType:
    """What a validator type needs in its spec and how it is checked. ``reads`` says what ``check`` is
    given besides the spec: the agent's ``answer`` (no path), the ``files`` view (to look at ``path``), or
    the ``text`` of the file at ``path`` (a missing file fails before the check runs)."""

    needs: tuple[str, ...]
    reads: Literal["answer", "files", "text"]
    check: Callable[[ValidatorSpec, Any], Outcome]


# The one table of validator types: a new type is one line here plus its check above.
TYPES: dict[str, ValidatorType] = {
    "file_exists": ValidatorType((), "files", _file_exists),
    "file_absent": ValidatorType((), "files", _file_absent),
    "file_equals": ValidatorType(("text",), "text", _file_equals),
    "file_contains": ValidatorType(("text",), "text", _file_contains),
    "file_not_contains": ValidatorType(("text",), "text", _file_not_contains),
    "file_matches": ValidatorType(("pattern",), "text", _file_matches),
    "file_non_empty": ValidatorType((), "text", _file_non_empty),
    "file_date": ValidatorType(("date_format",), "text", _file_date),
    "file_ordered": ValidatorType(("steps",), "text", _file_ordered),
    "dir_exists": ValidatorType((), "files", _dir_exists),
    "dir_entries": ValidatorType(("names",), "files", _dir_entries),
    "ini_value": ValidatorType(("section", "key", "value"), "text", _ini_value),
    "answer_matches": ValidatorType(("pattern",), "answer", _answer_matches),
}


def check(files, spec: ValidatorSpec, answer: str | None = None) -> ValidatorResult:
    """One validator on ``files`` (``HomeFiles`` or ``GuestFiles``): its type's check (``TYPES``) on what
    the type reads; a path the rule refuses, a file to read that is missing, or a link or FIFO where it must
    not be (``PathRefused``) fails it."""
    kind = TYPES.get(spec.type)
    if kind is None:
        raise ValueError(f"unknown validator type {spec.type}")
    try:
        if kind.reads == "answer":
            score, message = kind.check(spec, answer)
        elif (why := files.refuse(spec.path)) is not None:
            score, message = False, f"{spec.path}: {why}"
        elif kind.reads == "files":
            score, message = kind.check(spec, files)
        elif (text := files.read(spec.path, MAX_READ)) is None:
            score, message = False, f"{spec.path}: missing"
        else:
            score, message = kind.check(spec, text)
    except PathRefused as exc:   # a link or a FIFO where a file should be: never followed, never read
        score, message = False, f"{spec.path}: {exc}"
    return ValidatorResult(spec.id, score == 1, float(score), spec.weight, message)


def _dates(text: str, fmt: str, path: str) -> tuple[bool, str]:
    """Every non-blank line is a date in ``fmt`` (and there is at least one)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return False, f"{path}: no date"
    for n, line in enumerate(lines, 1):
        try:
            datetime.datetime.strptime(line, fmt)
        except ValueError:
            return False, f"{path}: line {n} is not a date in the format {fmt}"
    return True, f"{path}: {len(lines)} date(s) in the format {fmt}"


def _steps_in_order(text: str, steps: list[str]) -> int:
    """How many of ``steps``, from the first, appear in ``text`` one after another (partial credit)."""
    at = 0
    for done, step in enumerate(steps):
        found = text.find(step, at)
        if found < 0:
            return done
        at = found + len(step)
    return len(steps)


def answer_from(body: dict) -> str | None:
    """The agent's answer from an evaluate body: ``answer_text``, else ``execution_data.answer`` (where the
    original workflow actually put it, docs/protocols.md §1.4)."""
    if isinstance(body.get("answer_text"), str):
        return body["answer_text"]
    data = body.get("execution_data")
    if isinstance(data, dict):
        for key in ("answer_text", "answer"):
            if isinstance(data.get(key), str):
                return data[key]
    return None


def evaluate(files, specs: list[ValidatorSpec], answer: str | None = None) -> dict:
    """The genv evaluate reply: ``{success, result: {score, success, validators: [...]}}``."""
    results = [check(files, s, answer) for s in specs]
    total = sum(r.weight for r in results)
    score = sum(r.score * r.weight for r in results) / total if total else 0.0
    success = all(r.passed for r in results)
    return {"success": success, "score": score,
            "result": {"score": score, "success": success, "validators": [r.to_wire() for r in results]}}
