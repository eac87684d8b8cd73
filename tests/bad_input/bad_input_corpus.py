"""The malformed-request corpus machinery shared by the per-service tables (issue 16, item 3).

Each service's test module holds one table of ``Case``s; ``send`` plays a case against the real service with
a per-request timeout and records the outcome in ``TALLY``, which the folder's ``conftest.py`` prints after
the run (tried / 4xx / 5xx / hangs per service) so the numbers can be quoted.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import httpx

TIMEOUT_S = 15.0         # longer than any legitimate refusal takes; a case past it is a hang
UNSET = object()
# service -> {"tried", "4xx", "5xx", "hangs", "other"}
TALLY: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(("tried", "4xx", "5xx", "hangs", "other"), 0))


@dataclass(frozen=True)
class Case:
    """One malformed request. ``path`` and header values may hold ``{placeholders}`` that the module's
    context fills (an execution id, a run id, a key); ``headers`` values of None remove a default header.
    ``status``: the exact status expected (None: any 4xx); ``says``: text the error message must contain."""

    name: str
    method: str
    path: str
    json: Any = UNSET
    content: bytes | None = None
    headers: dict[str, str | None] = field(default_factory=dict)
    status: int | None = None
    says: str = ""

    def __str__(self) -> str:  # the pytest id
        return self.name


@dataclass
class Outcome:
    status: int | None           # None: no answer within TIMEOUT_S
    text: str = ""


def nested(depth: int) -> bytes:
    """A JSON document of ``depth`` nested arrays (deeper than Python's recursion limit at 100000)."""
    return b"[" * depth + b"]" * depth


def json_bytes(value: Any) -> bytes:
    return json.dumps(value).encode()


def _headers(case: Case, defaults: dict[str, str], ctx: dict[str, str]) -> dict[str, str]:
    merged = {**defaults, **case.headers}
    return {k: v.format(**ctx) for k, v in merged.items() if v is not None}


async def send(service: str, base_url: str, case: Case, ctx: dict[str, str] | None = None,
               default_headers: dict[str, str] | None = None) -> Outcome:
    """Play ``case`` against ``base_url`` and tally the outcome under ``service``."""
    ctx = ctx or {}
    kwargs: dict[str, Any] = {"headers": _headers(case, default_headers or {}, ctx)}
    if case.json is not UNSET:
        kwargs["json"] = case.json
    elif case.content is not None:
        kwargs["content"] = case.content
    tally = TALLY[service]
    tally["tried"] += 1
    try:
        async with httpx.AsyncClient(base_url=base_url, timeout=TIMEOUT_S) as http:
            res = await http.request(case.method, case.path.format(**ctx), **kwargs)
    except httpx.TimeoutException:
        tally["hangs"] += 1
        return Outcome(None)
    bucket = "4xx" if 400 <= res.status_code < 500 else "5xx" if res.status_code >= 500 else "other"
    tally[bucket] += 1
    return Outcome(res.status_code, res.text)


def check_refused(case: Case, out: Outcome) -> None:
    """The case got the 4xx it should, with a message that says what is wrong."""
    assert out.status is not None, f"{case.name}: no answer within {TIMEOUT_S}s"
    assert 400 <= out.status < 500, f"{case.name}: HTTP {out.status}: {out.text[:300]}"
    if case.status is not None:
        assert out.status == case.status, f"{case.name}: HTTP {out.status}, expected {case.status}: {out.text[:300]}"
    assert case.says in out.text, f"{case.name}: message {out.text[:300]!r} lacks {case.says!r}"
    assert len(out.text) > 10, f"{case.name}: no message: {out.text!r}"


def summary_lines() -> list[str]:
    return [f"{service:>16}: tried {t['tried']}, 4xx {t['4xx']}, 5xx {t['5xx']}, hangs {t['hangs']}"
            + (f", other {t['other']}" if t["other"] else "") for service, t in sorted(TALLY.items())]
