"""Validators: weighted checks of real state in an execution's files, with partial credit.

The files are a view with ``refuse``/``kind``/``read``/``listdir`` over paths: ``HomeFiles`` for an X11
desktop's HOME, ``vm.backend.GuestFiles`` for a VM's guest (through its guest agent). On the host, checks run
as the gym's user, so every path is resolved first and must stay inside the HOME: an agent could plant a
symlink to a host file, and a checker must never follow it out.
Messages never quote file contents (they go back over the API).
"""

from __future__ import annotations

import configparser
import datetime
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .tasks import ValidatorSpec

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


def _inside(home: Path, rel: str) -> Path | None:
    home_real = os.path.realpath(home)
    target = os.path.realpath(os.path.join(home_real, rel))
    if target != home_real and not target.startswith(home_real + os.sep):
        return None
    return Path(target)


class HomeFiles:
    """A host HOME folder as the validators see it: paths relative to it, never resolved out of it."""

    def __init__(self, home: Path | str) -> None:
        self.home = Path(home)

    def refuse(self, rel: str) -> str | None:
        return None if _inside(self.home, rel) is not None else "resolves outside HOME"

    def kind(self, rel: str) -> str | None:
        """"file", "dir", "other" (a socket, a dangling link...) or None when nothing is there."""
        path = _inside(self.home, rel)
        if path is None or not os.path.lexists(path):
            return None
        return "dir" if path.is_dir() else "file" if path.is_file() else "other"

    def read(self, rel: str, limit: int = MAX_READ) -> str | None:
        path = _inside(self.home, rel)
        if path is None or not path.is_file():
            return None
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", errors="replace")

    def listdir(self, rel: str) -> list[str] | None:
        path = _inside(self.home, rel)
        return os.listdir(path) if path is not None and path.is_dir() else None


def _norm(text: str) -> str:
    """Compare texts modulo trailing whitespace per line and trailing blank lines (editors add them)."""
    return "\n".join(line.rstrip() for line in text.replace("\r\n", "\n").split("\n")).rstrip("\n")


def check(files, spec: ValidatorSpec, answer: str | None = None) -> ValidatorResult:
    """One validator on ``files`` (``HomeFiles`` or ``GuestFiles``)."""

    def result(ok: bool, msg: str) -> ValidatorResult:
        return ValidatorResult(spec.id, ok, 1.0 if ok else 0.0, spec.weight, msg)

    if spec.type == "answer_matches":
        if answer is None:
            return result(False, "no answer was given")
        ok = re.fullmatch(spec.pattern, answer.strip(), re.IGNORECASE | re.DOTALL) is not None
        return result(ok, f"answer {'matches' if ok else 'does not match'} the expected one")

    why = files.refuse(spec.path)
    if why is not None:
        return result(False, f"{spec.path}: {why}")
    t = spec.type
    if t in ("file_exists", "file_absent", "dir_exists"):
        kind = files.kind(spec.path)
        if t == "file_exists":
            return result(kind == "file", f"{spec.path}: {'exists' if kind == 'file' else 'missing'}")
        if t == "file_absent":
            return result(kind is None, f"{spec.path}: {'absent' if kind is None else 'still exists'}")
        return result(kind == "dir", f"{spec.path}: {'is a folder' if kind == 'dir' else 'no such folder'}")
    if t == "dir_entries":
        names = files.listdir(spec.path)
        if names is None:
            return result(False, f"{spec.path}: no such folder")
        have = set(names)
        missing = [n for n in spec.names if n not in have]
        extra = sorted(have - set(spec.names)) if spec.exact else []
        ok = not missing and not extra
        return result(ok, f"{spec.path}: missing {missing}, unexpected {extra}" if not ok else f"{spec.path}: ok")
    if t == "ini_value":
        text = files.read(spec.path, MAX_READ)
        if text is None:
            return result(False, f"{spec.path}: missing")
        parser = configparser.ConfigParser(interpolation=None, strict=False)
        try:
            parser.read_string(text)
            value = parser.get(spec.section, spec.key, fallback=None)
        except configparser.Error:
            value = None
        ok = value is not None and value.strip() == spec.value
        return result(ok, f"{spec.path}: [{spec.section}] {spec.key} {'is' if ok else 'is not'} {spec.value}")
    text = files.read(spec.path, MAX_READ)
    if text is None:
        return result(False, f"{spec.path}: missing")
    if t == "file_equals":
        ok = _norm(text) == _norm(spec.text)
        return result(ok, f"{spec.path}: content {'matches' if ok else 'differs'}")
    if t == "file_contains":
        ok = spec.text in text
        return result(ok, f"{spec.path}: {'contains' if ok else 'lacks'} the expected text")
    if t == "file_not_contains":
        ok = spec.text not in text
        return result(ok, f"{spec.path}: {'free of' if ok else 'still has'} the unwanted text")
    if t == "file_matches":
        ok = re.search(spec.pattern, text, re.MULTILINE) is not None
        return result(ok, f"{spec.path}: {'matches' if ok else 'does not match'} /{spec.pattern}/")
    if t == "file_non_empty":
        ok = bool(text.strip())
        return result(ok, f"{spec.path}: {'has content' if ok else 'is empty'}")
    if t == "file_date":
        return result(*_dates(text, spec.date_format, spec.path))
    if t == "file_ordered":
        done = _steps_in_order(text, spec.steps)
        return ValidatorResult(spec.id, done == len(spec.steps), done / len(spec.steps), spec.weight,
                               f"{spec.path}: {done} of {len(spec.steps)} steps in order")
    raise ValueError(f"unknown validator type {t}")


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
    original workflow actually put it, external-protocols §1.4)."""
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
