"""Chat completions against the run's OpenAI-compatible ``model.baseUrl``, with retries.

Why the token hints: training needs the sampled token ids and their logprobs. ``logprobs: true`` is
OpenAI-standard; ``return_token_ids: true`` is vLLM's (and our policy endpoint's) extension. An endpoint
that rejects them with a 400 naming the field gets the plain request instead, and that choice is
remembered per base URL, so a strict server costs one extra request per service lifetime.

Why bounded: the model server is not ours to trust. An answer past ``MAX_ANSWER_BYTES`` is not read on (a
``ModelError``: the model server's failure), and its JSON is parsed with a depth limit (``http.input.parse_json``).
The bound holds on the wire and decoded alike: the answer is asked for uncompressed, and one that comes
compressed all the same is refused undecoded (a few hundred bytes of stacked gzip decode to gigabytes;
``http.retry._bounded``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

import httpx

from ..http.input import MiB, parse_json
from ..http.retry import AnswerRefused, RetryPolicy, send_with_retry

logger = logging.getLogger(__name__)

TOKEN_HINTS: dict[str, Any] = {"logprobs": True, "return_token_ids": True}
# The largest model answer read. A real one (2048 tokens with logprobs and token ids, the prompt's ids echoed)
# is well under 1 MiB; a server answering more is broken or hostile, and the run keeps what it reads.
MAX_ANSWER_BYTES = 8 * MiB


class ModelError(Exception):
    """The model endpoint failed for good (after retries) or replied with something unusable."""


class ContextExceeded(ModelError):
    """The model refused the request as longer than its context: the prompt outgrew what the policy can read.
    Not a failure of the model server: the run ends there as the policy's (docs/protocols.md §3)."""


# OpenAI's error code for a request over the model's context (our policy endpoint sends it); vLLM's own server
# says so in the message instead ("This model's maximum context length is N tokens ...").
CONTEXT_EXCEEDED_CODE = "context_length_exceeded"


def context_exceeded(response: httpx.Response) -> bool:
    """Whether an error reply says the request was longer than the model's context."""
    if response.status_code != 400:
        return False
    try:
        body = parse_json(response.content)
    except ValueError:
        return False
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return False
    return error.get("code") == CONTEXT_EXCEEDED_CODE or "maximum context length" in str(error.get("message", ""))


def _detail(response: httpx.Response) -> str:
    try:
        body = parse_json(response.content)
    except ValueError:
        return response.text[:300]
    if isinstance(body, dict):
        error = body.get("error", body.get("detail", body))
        if isinstance(error, dict):
            error = error.get("message", error)
        return str(error)[:300]
    return str(body)[:300]


class ModelClient:
    """One run's view of its model endpoint (the ``http`` client is shared by all runs)."""

    def __init__(self, http: httpx.AsyncClient, base_url: str, api_key: str | None, *,
                 retry: RetryPolicy, timeout_s: float, hints_supported: dict[str, bool],
                 send_token_hints: bool = True, max_answer_bytes: int = MAX_ANSWER_BYTES) -> None:
        self.http = http
        self.base_url = base_url.rstrip("/")
        self.retry = retry
        self.timeout_s = timeout_s
        self.max_answer_bytes = max_answer_bytes
        # A time limit (or a cancel) ended a wait for the model server's answer: when a run's time runs out,
        # this says it was the model server's (runner.AgentRun.run).
        self.cut_off = False
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._hints_supported = hints_supported  # shared cache: base URL -> accepts TOKEN_HINTS
        self._send_hints = send_token_hints

    async def _send(self, method: str, path: str, what: str, **kwargs) -> httpx.Response:
        url = f"{self.base_url}{path}"
        try:
            return await send_with_retry(self.http, method, url, policy=self.retry, what=what,
                                         headers=self._headers, timeout=self.timeout_s,
                                         max_bytes=self.max_answer_bytes, **kwargs)
        except httpx.TransportError as exc:
            raise ModelError(f"model endpoint {url} unreachable after {self.retry.attempts} tries: "
                             f"{type(exc).__name__}: {exc}") from exc
        except AnswerRefused as exc:   # kept would be hundreds of MB per run, in events and GETs
            raise ModelError(f"{what} from {url}: {exc}") from None
        except asyncio.CancelledError:
            self.cut_off = True
            raise

    async def model_name(self) -> str:
        """The first id of ``GET {baseUrl}/models`` (servers reject names they do not serve)."""
        response = await self._send("GET", "/models", "model list")
        if response.status_code >= 400:
            raise ModelError(f"GET {self.base_url}/models: HTTP {response.status_code}: {_detail(response)}")
        try:
            return str(parse_json(response.content)["data"][0]["id"])
        except (ValueError, KeyError, IndexError, TypeError):
            raise ModelError(f"GET {self.base_url}/models has no data[0].id: {response.text[:200]!r}") from None

    async def complete(self, body: dict[str, Any], on_request: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """POST ``/chat/completions``; ``on_request`` sees each body exactly as sent (for events)."""
        use_hints = self._send_hints and self._hints_supported.get(self.base_url, True)
        sent = {**body, **TOKEN_HINTS} if use_hints else body
        on_request(sent)
        response = await self._send("POST", "/chat/completions", "chat completion", json=sent)
        if use_hints and response.status_code in (400, 422) and any(k in response.text for k in TOKEN_HINTS):
            logger.info("model endpoint %s rejects token hints (%s); sending plain requests from now on",
                        self.base_url, _detail(response))
            self._hints_supported[self.base_url] = False
            on_request(body)
            response = await self._send("POST", "/chat/completions", "chat completion", json=body)
        if context_exceeded(response):
            raise ContextExceeded(f"the prompt exceeds the model's context: {_detail(response)}")
        if response.status_code >= 400:
            raise ModelError(f"chat completion: HTTP {response.status_code}: {_detail(response)}")
        try:
            data = parse_json(response.content)
            message = data["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise ModelError(f"chat completion reply has no choices[0].message: {response.text[:200]!r}") from None
        if not isinstance(message, dict):
            raise ModelError("chat completion reply: choices[0].message is not an object")
        return data


def token_record(step: int, response: dict[str, Any]) -> dict[str, Any]:
    """What ``GET /runs/{id}/tokens`` lists per model call: ids and logprobs when the server sent them."""
    choice = response.get("choices", [{}])[0]
    logprobs = choice.get("logprobs") or {}
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    return {
        "step": step,
        "model": response.get("model"),
        "promptTokenIds": response.get("prompt_token_ids") or choice.get("prompt_token_ids"),
        "tokenIds": choice.get("token_ids"),
        "logprobs": [c.get("logprob") for c in content] if isinstance(content, list) else None,
        "finishReason": choice.get("finish_reason"),
        "usage": response.get("usage"),
    }
