"""OpenAI chat messages -> the exact prompt the policy sees: processor ids with expanded image tokens,
``pixel_values``/``image_grid_thw``, ``mm_token_type_ids``, and the message copy vLLM needs.

Why the processor and not the tokenizer: a VLM's processor replaces each image placeholder by as many
image tokens as the image's patch grid needs. AReaL's own proxy tokenises with the plain tokenizer (one
placeholder per image), so its training rows do not match what the model saw (DESIGN.md §2).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from .images import BadImage, DecodedImage, image_url_of

_ROLES = {"system", "user", "assistant", "tool", "developer"}
_TEXT_PART_TYPES = {"text", "input_text", "output_text"}


class BadRequest(ValueError):
    """The request cannot be turned into a prompt; the message is safe to return to the client (HTTP 400)."""


@dataclass
class ParsedMessages:
    """Messages split for the two consumers; ``image_urls[i]`` belongs to the i-th image placeholder."""

    for_template: list[dict[str, Any]]  # image parts replaced by {"type": "image"}
    for_vllm: list[dict[str, Any]]  # image parts as image_url placeholders; AReaL's vLLM backend fills them
    image_urls: list[str]


@dataclass
class PromptInputs:
    """What one turn sends to the engine and later trains on."""

    input_ids: list[int]
    mm_token_type_ids: list[int] | None
    multi_modal_input: dict[str, torch.Tensor] | None  # {"pixel_values", "image_grid_thw"?}
    images: list[DecodedImage]
    for_vllm: list[dict[str, Any]]
    text: str


def _drop_nulls(d: dict) -> dict:
    # Clients echo assistant messages back with tool_calls=None, name=None ...; templates choke on them.
    return {k: v for k, v in d.items() if v is not None}


def parse_messages(messages: Any, keep_images: int | None = None) -> ParsedMessages:
    """Validate the OpenAI ``messages`` array and split it; raises ``BadRequest`` with the reason.

    ``keep_images``: keep only the last N image parts (older screenshots are dropped from the prompt;
    every kept image is trained on again in every later turn's row, so this bounds memory).
    """
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    total = sum(1 for m in messages if isinstance(m, dict) and isinstance(m.get("content"), list)
                for p in m["content"] if isinstance(p, dict) and p.get("type") in ("image_url", "image", "input_image"))
    skip = max(0, total - keep_images) if keep_images is not None else 0
    for_template: list[dict] = []
    for_vllm: list[dict] = []
    urls: list[str] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise BadRequest(f"messages[{i}] is not an object")
        msg = _drop_nulls(msg)
        if msg.get("role") not in _ROLES:
            raise BadRequest(f"messages[{i}].role must be one of {sorted(_ROLES)}, got {msg.get('role')!r}")
        content = msg.get("content")
        if content is None or isinstance(content, str):
            for_template.append(copy.deepcopy(msg))
            for_vllm.append(copy.deepcopy(msg))
            continue
        if not isinstance(content, list):
            raise BadRequest(f"messages[{i}].content must be a string or a list of parts")
        tpl_parts, vllm_parts = [], []
        for j, part in enumerate(content):
            if not isinstance(part, dict):
                raise BadRequest(f"messages[{i}].content[{j}] is not an object")
            try:
                url = image_url_of(part)
            except BadImage as exc:
                raise BadRequest(f"messages[{i}].content[{j}]: {exc}") from exc
            if url is not None and skip > 0:
                skip -= 1
                continue
            if url is not None:
                urls.append(url)
                tpl_parts.append({"type": "image"})
                vllm_parts.append({"type": "image_url", "image_url": {"url": "placeholder"}})
            elif part.get("type") in _TEXT_PART_TYPES and isinstance(part.get("text"), str):
                tpl_parts.append({"type": "text", "text": part["text"]})
                vllm_parts.append({"type": "text", "text": part["text"]})
            else:
                raise BadRequest(f"messages[{i}].content[{j}] has unsupported type {part.get('type')!r}")
        for_template.append({**msg, "content": tpl_parts})
        for_vllm.append({**msg, "content": vllm_parts})
    return ParsedMessages(for_template=for_template, for_vllm=for_vllm, image_urls=urls)


def build_prompt(processor, tokenizer, parsed: ParsedMessages, images: list[DecodedImage],
                 tools: list | None = None) -> PromptInputs:
    """Run the chat template and the processor exactly once; CPU-bound, call it off the event loop."""
    if len(images) != len(parsed.image_urls):
        raise BadRequest("internal: decoded image count differs from image parts")
    kwargs = {"tools": tools} if tools else {}
    templater = processor if processor is not None else tokenizer
    try:
        text = templater.apply_chat_template(parsed.for_template, add_generation_prompt=True,
                                             tokenize=False, **kwargs)
    except Exception as exc:  # jinja errors for odd role orders etc. are the client's to fix
        raise BadRequest(f"chat template failed: {exc}") from exc
    if processor is None:
        if images:
            raise BadRequest("this model has no image processor; remove the image parts")
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        return PromptInputs(list(ids), None, None, [], parsed.for_vllm, text)

    image_token = getattr(processor, "image_token", None)
    if image_token is not None and text.count(image_token) != len(images):
        raise BadRequest(f"chat template produced {text.count(image_token)} image placeholders "
                         f"for {len(images)} images")
    out = processor(images=[d.image for d in images] or None, text=[text], return_tensors="pt")
    ids = out["input_ids"][0].tolist()
    mm = out["mm_token_type_ids"][0].tolist() if "mm_token_type_ids" in out else None
    mmi = None
    if images:
        mmi = {"pixel_values": out["pixel_values"]}
        if "image_grid_thw" in out:
            mmi["image_grid_thw"] = out["image_grid_thw"]
    return PromptInputs(ids, mm, mmi, images, parsed.for_vllm, text)
