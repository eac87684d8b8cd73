"""OpenAI chat messages -> the model's prompt (chat template + processor), as vLLM's chat endpoint does.

The same function is the reference for anyone who must reproduce the server's prompt ids offline
(e.g. the policy endpoint that records training rows): identical messages and images give identical ids.
"""

from __future__ import annotations

import base64
import binascii
import io
from dataclasses import dataclass
from typing import Any

from PIL import Image

from .engine import Prompt
from .sampling import BadRequest

IMAGE_PART_TYPES = ("image_url", "image", "input_image")


def decode_image(ref: Any) -> Image.Image:
    """An image part's payload (data URL, bare base64, or {"url": ...}) -> RGB PIL image."""
    if isinstance(ref, dict):
        ref = ref.get("url") or ref.get("image_url")
    if not isinstance(ref, str) or not ref:
        raise BadRequest("image part without a data URL")
    if ref.startswith("data:"):
        header, _, ref = ref.partition(",")
        if ";base64" not in header:
            raise BadRequest("only base64 data URLs are supported for images")
    elif ref.startswith(("http://", "https://", "file:")):
        raise BadRequest("image URLs are not fetched by the CPU server; send a base64 data URL")
    try:
        raw = base64.b64decode(ref, validate=False)
        img = Image.open(io.BytesIO(raw))
        img.load()
    except (binascii.Error, OSError, ValueError) as exc:
        raise BadRequest(f"image could not be decoded: {exc}") from None
    return img.convert("RGB")


@dataclass
class ChatPrompt:
    text: str
    images: list[Image.Image]


def render_chat(processor, messages: list[dict], *, tools: list | None = None,
                add_generation_prompt: bool = True) -> ChatPrompt:
    """Apply the model's chat template; image parts become {"type": "image"} and are decoded in order."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    images: list[Image.Image] = []
    rendered: list[dict] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or "role" not in msg:
            raise BadRequest(f"messages[{i}] must be an object with a 'role'")
        content = msg.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind in IMAGE_PART_TYPES:
                    images.append(decode_image(part.get(kind) or part.get("image_url") or part.get("image")))
                    parts.append({"type": "image"})
                elif kind == "text":
                    parts.append({"type": "text", "text": str(part.get("text", ""))})
                else:
                    raise BadRequest(f"messages[{i}] has an unsupported content part {kind!r}")
            content = parts
        elif content is not None and not isinstance(content, str):
            raise BadRequest(f"messages[{i}].content must be a string or a list of parts")
        rendered.append({**msg, "content": content})
    text = processor.apply_chat_template(rendered, tools=tools, add_generation_prompt=add_generation_prompt,
                                         tokenize=False)
    return ChatPrompt(text=text, images=images)


def chat_to_prompt(processor, messages: list[dict], *, tools: list | None = None,
                   add_generation_prompt: bool = True) -> Prompt:
    chat = render_chat(processor, messages, tools=tools, add_generation_prompt=add_generation_prompt)
    out = processor(images=chat.images or None, text=[chat.text], return_tensors="pt")
    return Prompt(
        input_ids=out["input_ids"][0].tolist(),
        pixel_values=out.get("pixel_values"),
        image_grid_thw=out.get("image_grid_thw"),
    )
