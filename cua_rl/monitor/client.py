"""Training Monitor ingest client: ``POST {base}/api/ingest/batch`` with a bearer token (§4).

Why these rules: the monitor is an observer, so by default a failure is logged and training goes on
(``raise_errors=True`` for callers that want to know). Transport errors (timeouts, refused connections)
are retried with backoff; HTTP errors are not, as in the original (a 4xx will not heal, and a 5xx after
the server wrote part of a batch is better dropped than duplicated). With no base URL or no token the
client is disabled and sends nothing. The token appears in no log line, repr or error message.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Iterable

import httpx

from ..http.client import async_client
from ..http.retry import RetryPolicy, error_detail, send_with_retry
from .records import KINDS, Record, training_end

logger = logging.getLogger(__name__)


def token_from_env(environ: dict | None = None) -> str:
    """PROJECT_TOKEN, else MONITOR_PROJECT_TOKEN: the one place that decides the lookup order."""
    env = os.environ if environ is None else environ
    return env.get("PROJECT_TOKEN", "") or env.get("MONITOR_PROJECT_TOKEN", "")


class MonitorError(Exception):
    """An ingest call failed (only raised with ``raise_errors=True``)."""


@dataclass
class IngestResult:
    """``sent`` is False when disabled or failed; ``ids[kind][client_id]`` is the monitor's row id."""

    sent: bool
    training_id: int | None = None
    ids: dict[str, dict[str, Any]] = field(default_factory=dict)
    error: str | None = None

    def id_of(self, kind: str, client_id: str) -> Any:
        return self.ids.get(kind, {}).get(client_id)


class MonitorClient:
    """``MonitorClient.from_settings(url, token)``; disabled (no HTTP at all) when either is empty."""

    def __init__(self, base_url: str, token: str, *, project_id: str | None = None, timeout_s: float = 120.0,
                 retry: RetryPolicy | None = None, raise_errors: bool = False,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.base_url = (base_url or "").rstrip("/")
        self._token = token or ""
        self.project_id = project_id or None
        self.raise_errors = raise_errors
        self.retry = retry or RetryPolicy(attempts=6, backoff_s=1.0, max_backoff_s=8.0, retry_5xx=False)
        self.enabled = bool(self.base_url and self._token)
        if self.base_url and not self._token:
            logger.warning("monitor base URL set but no project token: monitoring is disabled")
        self._http = async_client(timeout=timeout_s, transport=transport) if self.enabled else None

    @classmethod
    def from_settings(cls, base_url: str | None, token: str | None, project_id: str | None = None,
                      **kwargs: Any) -> "MonitorClient":
        return cls(base_url or "", token or "", project_id=project_id, **kwargs)

    @classmethod
    def from_env(cls, **kwargs: Any) -> "MonitorClient":
        """MONITOR_BASE_URL, PROJECT_TOKEN (else MONITOR_PROJECT_TOKEN), PROJECT_ID."""
        token = token_from_env()
        return cls.from_settings(os.environ.get("MONITOR_BASE_URL"), token, os.environ.get("PROJECT_ID"), **kwargs)

    def __repr__(self) -> str:
        return f"MonitorClient(base_url={self.base_url!r}, enabled={self.enabled}, token=***)"

    async def __aenter__(self) -> "MonitorClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()

    def ui_url(self, training_id: int) -> str | None:
        if not self.enabled:
            return None
        suffix = f"?project_id={self.project_id}" if self.project_id else ""
        return f"{self.base_url}/{training_id}{suffix}"

    def _scrub(self, text: str) -> str:
        return text.replace(self._token, "***") if self._token else text

    async def ingest(self, *, training: dict | None = None, records: Iterable[Record] = ()) -> IngestResult:
        """Send one batch; records are grouped into their kind's array. Re-sent client_ids upsert."""
        body: dict[str, Any] = {}
        if training is not None:
            body["training"] = training
        for record in records:
            body.setdefault(record.kind, []).append(record.to_payload())
        if not self.enabled or not body:
            return IngestResult(sent=False)
        reply = await self._send("POST", "/api/ingest/batch", f"monitor ingest {sorted(body)}", json=body)
        if isinstance(reply, IngestResult):
            return reply
        return self._parse_reply(reply)

    async def put_blob(self, data: bytes, sha256: str | None = None, media_type: str = "image/png") -> IngestResult:
        """Upload a screenshot to ``PUT {base}/api/blobs/{sha256}`` (our monitor's content-addressed store);
        re-uploading the same bytes is harmless. ``sent`` tells whether the monitor has it now."""
        if not self.enabled:
            return IngestResult(sent=False)
        name = sha256 or hashlib.sha256(data).hexdigest()
        reply = await self._send("PUT", f"/api/blobs/{name}", "monitor blob upload", content=data,
                                 content_type=media_type)
        return reply if isinstance(reply, IngestResult) else IngestResult(sent=True)

    async def _send(self, method: str, path: str, what: str, *, content_type: str = "application/json",
                    **kwargs: Any) -> Any:
        """The decoded JSON reply, or a failed ``IngestResult`` (raised as MonitorError with raise_errors)."""
        url = f"{self.base_url}{path}"
        headers = {"Authorization": f"Bearer {self._token}", "Content-Type": content_type}
        try:
            response = await send_with_retry(self._http, method, url, policy=self.retry, headers=headers,
                                             what=what, **kwargs)
            if response.status_code >= 400:
                raise MonitorError(f"HTTP {response.status_code}: {error_detail(response)}")
            return response.json() if response.content else {}
        except (httpx.TransportError, MonitorError, ValueError) as exc:
            message = self._scrub(f"{what} to {url} failed: {type(exc).__name__}: {exc}")
            if self.raise_errors:
                raise MonitorError(message) from None
            logger.warning("%s", message)
            return IngestResult(sent=False, error=message)

    @staticmethod
    def _parse_reply(reply: Any) -> IngestResult:
        result = IngestResult(sent=True)
        if not isinstance(reply, dict):
            return result
        if isinstance(reply.get("training_id"), int):
            result.training_id = reply["training_id"]
        for kind in KINDS:
            rows = reply.get(kind)
            if isinstance(rows, list):
                result.ids[kind] = {str(r["client_id"]): r.get("id") for r in rows
                                    if isinstance(r, dict) and "client_id" in r}
        return result

    async def upsert(self, *records: Record) -> IngestResult:
        return await self.ingest(records=records)

    async def start_training(self, training: dict) -> int | None:
        """Post a ``training_start(...)`` object; returns the monitor's training id (None if disabled)."""
        result = await self.ingest(training=training)
        if result.sent and result.training_id is not None:
            logger.info("monitor training %s: %s", result.training_id, self.ui_url(result.training_id))
        return result.training_id

    async def finish_training(self, training_id: int, status: str = "completed") -> IngestResult:
        return await self.ingest(training=training_end(training_id, status))
