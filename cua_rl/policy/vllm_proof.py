"""Proof that vLLM generated from exactly the prompt ids we train on, and ``tools`` that reach its template.

Why: with images, AReaL 1.0.4's vLLM backend sends vLLM the chat *messages* (vLLM templates and processes
them itself) and then reports our own ``req.input_ids`` back as ``ModelResponse.input_tokens``. Comparing
those with our ids proves nothing: if vLLM's template or processor differed from ours, training would use
ids the policy never saw. vLLM can say which ids it used (``return_token_ids`` -> ``prompt_token_ids``).

How: ``ProvingBackend`` wraps the engine's ``VLLMBackend`` (the object that builds each HTTP request and
parses each reply inside ``RemoteInfEngine.agenerate``). For a call made inside ``proving(...)`` it adds
``return_token_ids`` and the request's chat extras (``tools``, with ``tool_choice: none`` so vLLM templates
them without parsing tool calls, which would need server flags) to every HTTP attempt, and records the
``prompt_token_ids`` of every reply in the call's ``ProofRecord``. The endpoint compares them with the
processor's ids and refuses the turn on any difference. Calls outside ``proving`` pass through unchanged.

A context variable carries the record: ``agenerate`` builds and parses in the caller's task, so concurrent
episodes never see each other's records.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

_CHAT_ENDPOINT = "/v1/chat/completions"


@dataclass
class ProofRecord:
    """What vLLM said about one ``agenerate`` call: one entry per HTTP attempt (AReaL resumes aborted ones)."""

    chat_extras: dict[str, Any] = field(default_factory=dict)
    prompts: list[list[int] | None] = field(default_factory=list)  # None: the reply carried no ids
    endpoints: list[str] = field(default_factory=list)

    @property
    def attempts(self) -> int:
        return len(self.prompts)

    def mismatch(self, expected: list[int], outputs: list[int]) -> str | None:
        """Why vLLM's prompts differ from ``expected`` (None when every attempt is proved equal).

        Chat attempts must equal ``expected``. Token-id attempts (``/v1/completions``) resume after an abort
        with the tokens generated so far appended, so attempt k must be ``expected`` + a prefix of ``outputs``.
        """
        if not self.prompts:
            return "vLLM answered no request for this turn"
        for k, (seen, endpoint) in enumerate(zip(self.prompts, self.endpoints)):
            if seen is None:
                return f"attempt {k + 1}: vLLM's reply carries no prompt_token_ids"
            if endpoint == _CHAT_ENDPOINT or k == 0:
                if seen != expected:
                    return f"attempt {k + 1}: {_first_difference(expected, seen)}"
            elif seen[: len(expected)] != expected or seen[len(expected):] != outputs[: len(seen) - len(expected)]:
                return f"attempt {k + 1}: resumed prompt is not the prompt plus the tokens generated so far"
        return None


def _first_difference(ours: list[int], theirs: list[int]) -> str:
    n = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    return (f"vLLM's prompt has {len(theirs)} ids, ours {len(ours)}; first difference at position {n} "
            f"(ours {ours[n:n + 4]}, vLLM's {theirs[n:n + 4]})")


_RECORD: contextvars.ContextVar[ProofRecord | None] = contextvars.ContextVar("cua_vllm_proof", default=None)


@contextmanager
def proving(tools: list | None = None, chat_template_kwargs: dict | None = None) -> Iterator[ProofRecord]:
    """Record vLLM's prompt ids for the ``agenerate`` calls made inside; send ``tools`` to its template."""
    extras: dict[str, Any] = {}
    if tools:
        extras.update(tools=tools, tool_choice="none")
    if chat_template_kwargs:
        extras["chat_template_kwargs"] = dict(chat_template_kwargs)
    record = ProofRecord(chat_extras=extras)
    token = _RECORD.set(record)
    try:
        yield record
    finally:
        _RECORD.reset(token)


# Sampling that AReaL's payload leaves out. vLLM fills what a request omits from the checkpoint's
# generation_config.json (its --generation-config auto), so a checkpoint with repetition_penalty 1.05 would
# silently change the behaviour policy the trainer recomputes. Sent with every request, neutral.
NEUTRAL_SAMPLING = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "min_p": 0.0}


class ProvingBackend:
    """AReaL's ``VLLMBackend`` with the proof and pinned sampling (``NEUTRAL_SAMPLING``) added; every other
    method is the wrapped backend's."""

    def __init__(self, inner: Any):
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def build_generation_request(self, req, with_lora: bool, version: int):
        http = self._inner.build_generation_request(req, with_lora, version)
        for key, value in NEUTRAL_SAMPLING.items():
            http.payload.setdefault(key, value)
        record = _RECORD.get()
        if record is not None:
            http.payload["return_token_ids"] = True
            if http.endpoint == _CHAT_ENDPOINT:
                http.payload.update(record.chat_extras)
            record.endpoints.append(http.endpoint)
        return http

    def parse_generation_response(self, response: dict[str, Any]):
        record = _RECORD.get()
        if record is not None:
            # chat completions carry the ids at the top level, text completions in the choice
            choices = response.get("choices") or [{}]
            ids = response.get("prompt_token_ids") or (choices[0] or {}).get("prompt_token_ids")
            record.prompts.append([int(t) for t in ids] if isinstance(ids, list) else None)
        return self._inner.parse_generation_response(response)


def install(engine: Any) -> bool:
    """Wrap the vLLM backend inside ``engine`` (AReaL's ``RemotevLLMEngine`` or its ``RemoteInfEngine``)
    once; True when the engine now proves prompts. Engines without a vLLM backend are left alone."""
    inner = getattr(engine, "_engine", engine)
    backend = getattr(inner, "backend", None)
    if isinstance(backend, ProvingBackend):
        return True
    if backend is None or type(backend).__name__ != "VLLMBackend":
        return False
    inner.backend = ProvingBackend(backend)
    return True
