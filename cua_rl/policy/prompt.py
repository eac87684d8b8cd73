"""OpenAI chat messages -> the exact prompt the policy sees: processor ids with expanded image tokens,
``pixel_values``/``image_grid_thw``, ``mm_token_type_ids``, and the message copy vLLM needs.

Why the processor and not the tokenizer: a VLM's processor replaces each image placeholder by as many
image tokens as the image's patch grid needs. AReaL's own proxy tokenises with the plain tokenizer (one
placeholder per image), so its training rows do not match what the model saw (docs/policy-and-training.md).

Why images are prepared one by one (``prepare_image``): an agent resends its last few screenshots every turn,
so an endpoint that ran the processor over the whole prompt would decode, shrink and patchify each
screenshot up to ``max_screenshots_in_history`` times. A prepared image (shrunk, its ``pixel_values`` and
grid) is computed once per episode and the prompt is assembled from the pieces: the template's text with
each placeholder expanded to its grid's token count, then the tokenizer. That is what the processor's own
call does; ``split_matches_whole`` checks it once per processor against the whole call (ids and tensors
equal) and falls back to the whole call where a processor differs.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image

from .images import BadImage, DecodedImage, fit_pixels, image_url_of

logger = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class PreparedImage:
    """One image ready for prompts: ``decoded`` is shrunk to the endpoint's pixel bounds (the bytes the engine
    gets); ``pixel_values``/``grid_thw`` are the processor's for this image alone (None: the processor runs
    over the whole prompt instead, see ``split_matches_whole``)."""

    decoded: DecodedImage
    pixel_values: torch.Tensor | None = None
    grid_thw: torch.Tensor | None = None


# Fast tokenizers are not safe to call from several threads at once ("Already borrowed"); image work is.
_TEXT_LOCK = threading.Lock()
# processor -> per-image preparation proved equal to its whole call (weak: a freed processor's id may be reused)
_SPLIT_OK: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def prepare_image(processor, decoded: DecodedImage, min_pixels: int | None, max_pixels: int | None) -> PreparedImage:
    """Resize one image at most once, straight onto the processor's patch grid within the policy's pixel bounds
    and the processor's own (so neither our processor nor the inference server's resamples it again), and, where
    the processor allows it, run its image processor on it alone. CPU-bound and thread-safe: call it from a
    worker thread."""
    fitted = fit_for(processor, decoded, min_pixels, max_pixels)
    if processor is None or not split_matches_whole(processor):
        return PreparedImage(fitted)
    return _image_tensors(processor, fitted)


def fit_for(processor, decoded: DecodedImage, min_pixels: int | None, max_pixels: int | None) -> DecodedImage:
    """The image the engine is sent for ``decoded``: resampled at most once, onto ``processor``'s grid, within
    the tighter of the policy's bounds and the processor's (``images.fit_pixels``)."""
    factor, low, high = image_grid(processor)
    return fit_pixels(decoded, max(min_pixels or 0, low) or None, min(max_pixels or math.inf, high), factor)


def image_grid(processor) -> tuple[int | None, int, float]:
    """(grid factor, min pixels, max pixels) of a Qwen-VL image processor: patch size x merge size, and its
    ``size`` bounds (``shortest_edge``/``longest_edge`` are pixel counts there, or ``min_pixels``/``max_pixels``
    on older processors); (None, 0, inf) for a processor without that contract."""
    ip = getattr(processor, "image_processor", None)
    patch, merge = getattr(ip, "patch_size", None), getattr(ip, "merge_size", None)
    if not (isinstance(patch, int) and isinstance(merge, int)):
        return None, 0, math.inf
    size = getattr(ip, "size", None) or {}
    low = size.get("shortest_edge") or getattr(ip, "min_pixels", None) or 0
    high = size.get("longest_edge") or getattr(ip, "max_pixels", None) or math.inf
    return patch * merge, int(low), high


def _image_tensors(processor, fitted: DecodedImage) -> PreparedImage:
    out = processor.image_processor(images=[fitted.image], return_tensors="pt")
    return PreparedImage(fitted, out["pixel_values"], out["image_grid_thw"])


def _splittable(processor) -> bool:
    """Does the processor follow the Qwen-VL contract the split path relies on (one placeholder per image,
    expanded to grid t*h*w / merge_size**2 tokens)?"""
    image_processor = getattr(processor, "image_processor", None)
    return (isinstance(getattr(processor, "image_token", None), str)
            and isinstance(getattr(image_processor, "merge_size", None), int) and callable(image_processor))


def split_matches_whole(processor) -> bool:
    """Once per processor: assemble a two-image prompt from per-image pieces and from the processor's whole
    call; use the pieces only if ids and tensors are equal."""
    known = _SPLIT_OK.get(processor)
    if known is not None:
        return known
    ok = False
    if _splittable(processor):
        try:
            ok = _split_equals_whole(processor)
        except Exception as exc:  # any surprise means: do not trust the split path for this processor
            logger.warning("per-image processing check failed for %s (%s: %s)", type(processor).__name__,
                           type(exc).__name__, exc)
    if not ok:
        logger.warning("%s: screenshots are processed with the whole prompt on every turn (the per-image "
                       "pieces did not reproduce its output)", type(processor).__name__)
    _SPLIT_OK[processor] = ok
    return ok


def _split_equals_whole(processor) -> bool:
    pictures = []
    for i, size in enumerate(((96, 64), (64, 128))):  # two shapes: different grids, no batching by shape
        img = Image.new("RGB", size, (40 * i, 120, 200))
        img.paste((250, 30 * i, 10), (8, 8, size[0] // 2, size[1] // 2))
        pictures.append(_image_tensors(processor, DecodedImage("", img, "check")))
    parsed = ParsedMessages(for_template=[{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}]}],
        for_vllm=[], image_urls=["", ""])
    split = _assemble(processor, processor.tokenizer, parsed, pictures, None)
    whole = _assemble(processor, processor.tokenizer, parsed, [PreparedImage(p.decoded) for p in pictures], None)
    return (split.input_ids == whole.input_ids and split.mm_token_type_ids == whole.mm_token_type_ids
            and split.multi_modal_input.keys() == whole.multi_modal_input.keys()
            and all(torch.equal(split.multi_modal_input[k], whole.multi_modal_input[k])
                    for k in split.multi_modal_input))


def expand_image_tokens(text: str, image_token: str, grids: list[torch.Tensor], merge_size: int) -> str:
    """Each image placeholder in ``text`` -> as many placeholders as its image has merged patches."""
    pieces = text.split(image_token)
    if len(pieces) - 1 != len(grids):
        raise BadRequest(f"chat template produced {len(pieces) - 1} image placeholders for {len(grids)} images")
    out = [pieces[0]]
    for grid, rest in zip(grids, pieces[1:]):
        out.append(image_token * (int(grid.prod()) // merge_size ** 2))
        out.append(rest)
    return "".join(out)


def _drop_nulls(d: dict) -> dict:
    # Clients echo assistant messages back with tool_calls=None, name=None ...; templates choke on them.
    return {k: v for k, v in d.items() if v is not None}


def _template_tool_calls(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant message of the history as chat templates take it: each tool call's ``arguments`` as an
    object, not the JSON string OpenAI clients send back (vLLM converts them the same way before templating,
    so the prompt we train on stays the one vLLM builds)."""
    calls = message.get("tool_calls")
    if message.get("role") != "assistant" or not isinstance(calls, list):
        return message
    converted = []
    for i, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict):
            raise BadRequest(f"tool_calls[{i}] has no 'function' object")
        args = fn.get("arguments")
        if not args:
            args = {}
        elif not isinstance(args, (dict, list)):
            try:
                args = json.loads(args)
            except (TypeError, ValueError) as exc:
                raise BadRequest(f"tool_calls[{i}].function.arguments is not JSON: {exc}") from exc
        converted.append({**call, "function": {**fn, "arguments": args}})
    return {**message, "tool_calls": converted}


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
        try:
            templated = _template_tool_calls(msg)
        except BadRequest as exc:
            raise BadRequest(f"messages[{i}].{exc}") from exc
        content = msg.get("content")
        if content is None or isinstance(content, str):
            for_template.append(copy.deepcopy(templated))
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
        for_template.append({**templated, "content": tpl_parts})
        for_vllm.append({**msg, "content": vllm_parts})
    return ParsedMessages(for_template=for_template, for_vllm=for_vllm, image_urls=urls)


def build_prompt(processor, tokenizer, parsed: ParsedMessages, images: list[PreparedImage],
                 tools: list | None = None) -> PromptInputs:
    """Run the chat template and assemble the prompt from prepared images; CPU-bound, call it off the event
    loop (thread-safe)."""
    if len(images) != len(parsed.image_urls):
        raise BadRequest("internal: decoded image count differs from image parts")
    return _assemble(processor, tokenizer, parsed, images, tools)


def _assemble(processor, tokenizer, parsed: ParsedMessages, images: list[PreparedImage], tools) -> PromptInputs:
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
        with _TEXT_LOCK:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        return PromptInputs(list(ids), None, None, [], parsed.for_vllm, text)

    image_token = getattr(processor, "image_token", None)
    if image_token is not None and text.count(image_token) != len(images):
        raise BadRequest(f"chat template produced {text.count(image_token)} image placeholders "
                         f"for {len(images)} images")
    mmi = None
    if images and all(p.pixel_values is not None for p in images):
        grids = [p.grid_thw for p in images]
        expanded = expand_image_tokens(text, image_token, [g[0] for g in grids], processor.image_processor.merge_size)
        with _TEXT_LOCK:
            out = processor(text=[expanded], return_tensors="pt")
        mmi = {"pixel_values": torch.cat([p.pixel_values for p in images]), "image_grid_thw": torch.cat(grids)}
    else:
        with _TEXT_LOCK:
            out = processor(images=[p.decoded.image for p in images] or None, text=[text], return_tensors="pt")
        if images:
            mmi = {"pixel_values": out["pixel_values"]}
            if "image_grid_thw" in out:
                mmi["image_grid_thw"] = out["image_grid_thw"]
    ids = out["input_ids"][0].tolist()
    mm = out["mm_token_type_ids"][0].tolist() if "mm_token_type_ids" in out else None
    return PromptInputs(ids, mm, mmi, [p.decoded for p in images], parsed.for_vllm, text)
