"""Validation of one ``POST /api/ingest/batch`` body before anything is written (docs/protocols.md §4.1).

Why validate the whole batch first: bad input must get a clear 4xx and change nothing, so every row of
every kind is checked against ``schema.FIELDS`` (types, sizes, client ids) up front; the store then
applies the batch in one transaction. Fields the spec does not know are kept (``extra``), not refused,
so a client newer than this server loses nothing.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from .schema import BATCH_KINDS, CLIENT_ID_MAX, FIELDS, INT_MAX, INT_MIN

MAX_ROWS_PER_BATCH = 5000
MAX_TEXT_CHARS = 1_000_000       # one field; the whole body is capped by the server (MAX_BODY_BYTES)


class IngestError(ValueError):
    """Bad input: ``status`` is the HTTP status to answer (400, 404, 413, 422), ``message`` says why."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Row:
    """One validated row: typed ``values`` (links still raw: an int id or a client_id) and ``extra``."""

    client_id: str | None
    values: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Batch:
    training: Row | None
    training_id: int | None            # set when the training object updates an existing run
    rows: dict[str, list[Row]]


def _coerce(kind: str, name: str, spec: str, value: Any, where: str) -> Any:
    bad = IngestError(f"{where}.{name}: expected {spec.split(':')[0]}, got {type(value).__name__} {value!r:.60}")
    if spec in ("str", "text"):
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise bad
        text = str(value)
        limit = 256 if spec == "str" else MAX_TEXT_CHARS
        if len(text) > limit:
            raise IngestError(f"{where}.{name}: {len(text)} characters exceed the limit of {limit}", 413)
        return text
    if spec == "int" or spec.startswith("link:"):
        if spec.startswith("link:") and isinstance(value, str) and 0 < len(value) <= CLIENT_ID_MAX:
            return value          # a client_id, resolved by the store
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        if not INT_MIN <= value <= INT_MAX:
            raise IngestError(f"{where}.{name}: {value} is outside the integer range {INT_MIN}..{INT_MAX}")
        return value
    if spec == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise bad
        return float(value)
    if spec == "bool":
        if not isinstance(value, bool):
            raise bad
        return value
    if spec == "jsonstr":
        text = value if isinstance(value, str) else json.dumps(value)
        if len(text) > MAX_TEXT_CHARS:
            raise IngestError(f"{where}.{name}: {len(text)} characters exceed the limit of {MAX_TEXT_CHARS}", 413)
        return text
    return value                   # json: any JSON value


def parse_row(kind: str, raw: Any, where: str, *, needs_client_id: bool = True) -> Row:
    if not isinstance(raw, dict):
        raise IngestError(f"{where}: expected an object, got {type(raw).__name__}")
    client_id = raw.get("client_id")
    if needs_client_id:
        if not isinstance(client_id, str) or not client_id.strip():
            raise IngestError(f"{where}: client_id must be a non-empty string")
        if len(client_id) > CLIENT_ID_MAX:
            raise IngestError(f"{where}: client_id longer than {CLIENT_ID_MAX} characters")
    spec = FIELDS[kind]
    values, extra = {}, {}
    for name, value in raw.items():
        if name == "client_id" or value is None:
            continue
        if name in spec:
            values[name] = _coerce(kind, name, spec[name], value, where)
        else:
            extra[name] = value
    return Row(client_id=client_id if needs_client_id else None, values=values, extra=extra)


def parse_batch(body: Any) -> Batch:
    """The whole body, validated; raises ``IngestError`` naming the first bad row and field."""
    if not isinstance(body, dict):
        raise IngestError("the body must be a JSON object with 'training' and/or arrays of records", 400)
    unknown = sorted(set(body) - {"training", *BATCH_KINDS})
    if unknown:
        raise IngestError(f"unknown keys {unknown}; expected 'training' or any of {list(BATCH_KINDS)}")
    if not body:
        raise IngestError("empty batch: nothing to ingest")
    training, training_id = None, None
    if "training" in body:
        raw = body["training"]
        training = parse_row("trainings", raw, "training", needs_client_id=False)
        training_id = training.extra.pop("training_id", None)
        if training_id is not None and (isinstance(training_id, bool) or not isinstance(training_id, int)
                                        or not INT_MIN <= training_id <= INT_MAX):
            raise IngestError(f"training.training_id: expected int, got {training_id!r:.60}")
    rows: dict[str, list[Row]] = {}
    total = 0
    for kind in BATCH_KINDS:
        items = body.get(kind)
        if items is None:
            continue
        if not isinstance(items, list):
            raise IngestError(f"{kind}: expected an array, got {type(items).__name__}")
        total += len(items)
        if total > MAX_ROWS_PER_BATCH:
            raise IngestError(f"more than {MAX_ROWS_PER_BATCH} records in one batch; split it", 413)
        rows[kind] = [parse_row(kind, item, f"{kind}[{i}]") for i, item in enumerate(items)]
    return Batch(training=training, training_id=training_id, rows=rows)
