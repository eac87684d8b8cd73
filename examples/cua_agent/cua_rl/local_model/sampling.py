"""Sampling parameters and the per-step sampler of the CPU server.

Logprob convention (matches AReaL's trainer, ``areal/utils/functional/vocab_parallel.py``):
the reported logprob of a sampled token is ``log_softmax(logits / T)[token]`` over the FULL vocabulary,
with ``T`` the request temperature (``T = 1`` for greedy requests). top_k / top_p only shape which token
is drawn, never the reported logprob, exactly like the trainer's recomputation which knows nothing of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


class BadRequest(ValueError):
    """A request the server refuses with HTTP 400 and a message."""


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1                       # <= 0: no top-k (vLLM uses -1; AReaL's gconfig default is 0)
    stop_token_ids: list[int] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    logprobs: int | None = None           # None: no logprobs; N >= 0: sampled token plus N alternatives
    prompt_logprobs: int | None = None
    seed: int | None = None

    @classmethod
    def from_request(cls, body: dict, *, chat: bool) -> "SamplingParams":
        def num(name, default, kind):
            value = body.get(name, default)
            if value is None:
                return default
            try:
                return kind(value)
            except (TypeError, ValueError):
                raise BadRequest(f"'{name}' must be a {kind.__name__}, got {value!r}") from None

        # Chat requests may omit the limit (generate up to the context length: -1); completions default to 16.
        key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
        max_tokens = -1 if chat and body.get(key) is None else num(key, 16, int)
        stop = body.get("stop") or []
        if isinstance(stop, str):
            stop = [stop]
        if chat:
            logprobs = num("top_logprobs", 0, int) if body.get("logprobs") else None
        else:
            logprobs = None if body.get("logprobs") is None else num("logprobs", 0, int)
        params = cls(
            max_tokens=max_tokens,
            temperature=num("temperature", 1.0, float),
            top_p=num("top_p", 1.0, float),
            top_k=num("top_k", -1, int),
            stop_token_ids=[int(t) for t in (body.get("stop_token_ids") or [])],
            stop=[str(s) for s in stop],
            ignore_eos=bool(body.get("ignore_eos", False)),
            skip_special_tokens=bool(body.get("skip_special_tokens", True)),
            logprobs=logprobs,
            prompt_logprobs=None if body.get("prompt_logprobs") is None else num("prompt_logprobs", 0, int),
            seed=None if body.get("seed") is None else num("seed", 0, int),
        )
        if int(body.get("n", 1) or 1) != 1:
            raise BadRequest("only n=1 is supported")
        if body.get("use_beam_search"):
            raise BadRequest("beam search is not supported")
        if body.get("stream"):
            raise BadRequest("streaming is not supported by the CPU server")
        if params.temperature < 0:
            raise BadRequest("temperature must be >= 0")
        if not 0 < params.top_p <= 1:
            raise BadRequest("top_p must be in (0, 1]")
        if params.logprobs is not None and not 0 <= params.logprobs <= 20:
            raise BadRequest("logprobs must be between 0 and 20")
        return params

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def scaled_logprobs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """The trainer's distribution: log_softmax(logits / T) in float32 (T = 1 when greedy)."""
    t = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits.float() / t, dim=-1)


def sample_token(logp: torch.Tensor, params: SamplingParams, gen: torch.Generator,
                 never: torch.Tensor | None = None) -> int:
    """Draw the next token from ``logp`` (already temperature-scaled) after top-k / top-p filtering.

    ``never``: ids that are never drawn (input-only vision placeholders: a random tiny model would
    otherwise emit <|image_pad|>, which breaks the trainer's image-feature count). Like top-k, this shapes
    only the draw; the reported logprob stays the full-vocabulary one the trainer recomputes.
    """
    filtered = logp.clone()
    if never is not None and never.numel():
        filtered[never] = float("-inf")
    if params.greedy:
        return int(torch.argmax(filtered))
    if params.top_k and params.top_k > 0 and params.top_k < filtered.numel():
        kth = torch.topk(filtered, params.top_k).values[-1]
        filtered[filtered < kth] = float("-inf")
    if params.top_p < 1.0:
        sorted_lp, order = torch.sort(filtered, descending=True)
        probs = torch.softmax(sorted_lp, dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the first token is always kept).
        drop = torch.cumsum(probs, dim=-1) - probs >= params.top_p
        filtered[order[drop]] = float("-inf")
    probs = torch.softmax(filtered, dim=-1)
    return int(torch.multinomial(probs, 1, generator=gen))
