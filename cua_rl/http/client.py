"""One way to make an HTTP client: ``async_client(...)`` is ``httpx.AsyncClient(...)`` with the process's one
TLS context.

Why: httpx builds a new ``ssl.SSLContext`` for every client (loading the CA bundle), although the
project's URLs are mostly plain http. The workflow opens a gym client and an agent client per episode, so a
profile of held-out evaluation found 14% of the rollout process's CPU in ``ssl.create_default_context``
(docs/testing.md). The context is built once, the way httpx builds it (``SSL_CERT_FILE``/``SSL_CERT_DIR``
honoured), and shared: an ``SSLContext`` may wrap sockets from many threads and event loops.
"""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def tls_context() -> ssl.SSLContext:
    return httpx.create_ssl_context()


def async_client(**kwargs) -> httpx.AsyncClient:
    """``httpx.AsyncClient(**kwargs)`` verifying TLS with the shared context (unless ``verify`` is given)."""
    kwargs.setdefault("verify", tls_context())
    return httpx.AsyncClient(**kwargs)
