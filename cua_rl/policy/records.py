"""What the policy endpoint records: one ``Turn`` per answered chat completion, grouped by ``Episode``.

A turn holds exactly what the engine consumed and produced (prompt ids with expanded image tokens, output
ids, behaviour logprobs, per-token policy versions) and the image tensors the processor built for that
prompt, so the trajectory module never re-tokenises anything.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import torch


def tensor_sha256(t: torch.Tensor) -> str:
    """Hash of a tensor's dtype, shape and bytes (the gates compare training rows with processor output)."""
    t = t.detach().contiguous().cpu()
    h = hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


@dataclass
class Turn:
    prompt_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    output_versions: list[int]
    prompt_mm_token_type_ids: list[int] | None = None
    multi_modal_input: dict[str, torch.Tensor] | None = None  # pixel_values, image_grid_thw
    stop_reason: str = "stop"
    n_images: int = 0
    latency_s: float = 0.0
    # The newest prompt image exactly as forwarded to the engine (base64 file, a reference to the string the
    # endpoint already holds): the monitor stores it by hash as the screenshot the model saw this turn.
    image_b64: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        n = len(self.output_ids)
        if len(self.output_logprobs) != n or len(self.output_versions) != n:
            raise ValueError(f"turn has {n} output ids but {len(self.output_logprobs)} logprobs and "
                             f"{len(self.output_versions)} versions")
        if self.prompt_mm_token_type_ids is not None and len(self.prompt_mm_token_type_ids) != len(self.prompt_ids):
            raise ValueError("prompt_mm_token_type_ids must align with prompt_ids")

    @property
    def versions(self) -> set[int]:
        return set(self.output_versions)


@dataclass
class Episode:
    """One agent run's view of the endpoint. ``key`` is the bearer secret: never log it (use ``id``)."""

    id: str
    key: str = field(repr=False)
    base_url: str
    model: str
    turns: list[Turn] = field(default_factory=list)
    failed_turns: int = 0  # engine/infra failures answered with 5xx (bad client input is not counted)
    dropped_straddles: int = 0  # vLLM outputs that spanned a weight update and were regenerated
    vision_token_outputs: int = 0  # outputs with image/video placeholder tokens, regenerated
    verified_turns: int = 0  # recorded turns whose prompt ids vLLM confirmed (vllm_proof)
    prompt_mismatches: int = 0  # turns refused because the engine used other prompt ids
    in_flight: int = 0  # generations still running (a run that ends with one pending was cut short by us)
    undelivered_turns: int = 0  # answers the agent never received (it stopped waiting): never recorded
    answer_lost: bool = False  # the latest answer was not delivered (nothing later replaced it yet)
    # A prompt outgrew gconfig.max_tokens: the policy's episode ended there (OVERFLOW in endpoint.py); every
    # later request of the episode gets the same refusal. The reason, or "" while it has not happened.
    overflow: str = ""
    ignored_params: set[str] = field(default_factory=set)
    closed: bool = False
    # Content hash -> PreparedImage of the screenshots in the latest request: each distinct screenshot is
    # decoded, shrunk and patchified once per episode (the agent resends its recent history every turn).
    images: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # Called with (turn number, Turn) as each turn is recorded (the monitor's live view); must not block.
    on_turn: Any = field(default=None, repr=False, compare=False)
    # A hold on one of this episode's model calls (``PolicyEndpoint.hold``: a tree group forks the desktop
    # while the call waits), or None.
    hold: Any = field(default=None, repr=False, compare=False)
