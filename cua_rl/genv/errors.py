"""The one error type of the genv client.

Why a single type: the workflow must end one episode cleanly on any gym failure (HTTP error, bad reply,
timeout) and log why; ``detail`` carries the server's own FastAPI-style ``{"detail": ...}`` message.
"""

from __future__ import annotations


class GenvError(Exception):
    """A gym call failed. ``status_code`` is None for transport errors, timeouts and malformed replies."""

    def __init__(self, detail: str, status_code: int | None = None, *, url: str | None = None) -> None:
        self.detail = detail
        self.status_code = status_code
        self.url = url
        where = f" ({url})" if url else ""
        code = f"HTTP {status_code}: " if status_code is not None else ""
        super().__init__(f"{code}{detail}{where}")
