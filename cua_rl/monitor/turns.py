"""What the viewer needs of one recorded turn, taken from the policy endpoint's ``Turn`` and the agent's step.

Why both sources: the endpoint's ``Turn`` is the ground truth of what the model saw and produced (the
image bytes forwarded to the engine, output token ids and behaviour logprobs, latency, the pixel tensor
we train on), while the agent's step says what was done with it (the parsed action, thinking, invalid
replies). Turn ``i`` of an episode is the agent's step ``i + 1``: every step makes exactly one model call.

Everything here runs off the rollout's critical path (the reporter calls it in a worker thread, for each
turn as it is recorded and again for the whole episode once it is evaluated): base64 decoding, hashing and token decoding cost milliseconds per turn.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TurnView:
    """One turn, ready to become monitor records (``screenshot`` bytes are uploaded once by hash)."""

    turn: int
    text: str | None
    thinking: str | None
    actions: list[dict]                 # [{"name", "args", "call_id", "action"}]; action = the gym action
    tokens: dict[str, Any]
    latency_s: float
    screenshot: bytes | None = field(default=None, repr=False)
    image_sha256: str | None = None
    invalid: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)


def _decode_tokens(tokenizer, ids: list[int]) -> list[str] | None:
    if tokenizer is None or not ids:
        return None
    try:
        return tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False)
    except Exception:  # noqa: BLE001 - a display nicety; ids and logprobs are still recorded
        return None


def _text_of(tokenizer, ids: list[int], step: dict) -> str | None:
    message = step.get("messages") or []
    for m in reversed(message):
        if isinstance(m, dict) and m.get("role") == "assistant" and isinstance(m.get("content"), str):
            return m["content"]
    if tokenizer is not None and ids:
        try:
            return tokenizer.decode(ids, skip_special_tokens=True)
        except Exception:  # noqa: BLE001
            return None
    return step.get("text")


def _actions(step: dict) -> list[dict]:
    out = []
    for entry in step.get("actions") or []:
        if not isinstance(entry, dict):
            continue
        gym = entry.get("gymAction") if isinstance(entry.get("gymAction"), dict) else None
        out.append({"name": str(entry.get("name") or (gym or {}).get("type") or "action"),
                    "args": entry.get("args") if isinstance(entry.get("args"), dict) else None,
                    "call_id": entry.get("callId"), "action": gym,
                    "error": entry.get("rawFeedback")})
    return out


def pixel_sha256(turn) -> str | None:
    """Hash of the pixel tensor the trainer trains on for this turn (``policy.records.tensor_sha256``)."""
    mmi = getattr(turn, "multi_modal_input", None) or {}
    if "pixel_values" not in mmi:
        return None
    from ..policy.records import tensor_sha256

    return tensor_sha256(mmi["pixel_values"])


def turn_views(turns: list, steps: list[dict], tokenizer=None, *, trainer_logprobs: list | None = None,
               first: int = 1) -> list[TurnView]:
    """Views of an episode's turns (endpoint ``Turn`` objects) matched with the agent's steps by order;
    ``first`` is the number of ``turns[0]`` (a live turn is sent alone, before the agent's steps exist)."""
    views = []
    for i, turn in enumerate(turns):
        step = steps[i] if i < len(steps) and isinstance(steps[i], dict) else {}
        ids = list(turn.output_ids)
        tokens: dict[str, Any] = {"ids": ids, "logprobs": [round(float(x), 5) for x in turn.output_logprobs],
                                  "versions": sorted(set(turn.output_versions)),
                                  "pieces": _decode_tokens(tokenizer, ids), "prompt_tokens": len(turn.prompt_ids),
                                  "stop_reason": turn.stop_reason}
        if trainer_logprobs and i < len(trainer_logprobs) and trainer_logprobs[i] is not None:
            tokens["trainer_logprobs"] = [round(float(x), 5) for x in trainer_logprobs[i]]
        shot = getattr(turn, "image_b64", None)
        data = base64.b64decode(shot) if shot else None
        timing = step.get("timing") if isinstance(step.get("timing"), dict) else {}
        views.append(TurnView(
            turn=first + i, text=_text_of(tokenizer, ids, step), thinking=step.get("thinking"), actions=_actions(step),
            tokens=tokens, latency_s=float(turn.latency_s), screenshot=data,
            image_sha256=hashlib.sha256(data).hexdigest() if data else None, invalid=step.get("invalid"),
            metrics={"latency_s": round(float(turn.latency_s), 4), "n_images": turn.n_images,
                     "pixel_sha256": pixel_sha256(turn), "stage_timings_ms": timing or None}))
    return views


def turn_advantages(advantage: float, num_turns: int, discount: float = 1.0) -> list[float]:
    """Per-turn advantages as the training rows get them (``trajectory.rows.turn_rewards``)."""
    from ..trajectory.rows import turn_rewards

    return list(turn_rewards(advantage, num_turns, discount))
