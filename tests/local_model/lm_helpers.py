"""Helpers shared by the local_model tests (a unique module name: test dirs share sys.path)."""

from __future__ import annotations

import base64
import io

from PIL import Image, ImageDraw


def screenshot(width: int = 1280, height: int = 800, seed: int = 0) -> Image.Image:
    """A synthetic desktop-like screenshot (deterministic)."""
    img = Image.new("RGB", (width, height), (40 + seed * 30 % 200, 90, 160))
    draw = ImageDraw.Draw(img)
    draw.rectangle([100, 100, 500, 300], fill=(240, 240, 240))
    draw.rectangle([400 + seed * 10, 600, 600, 680], fill=(20, 160, 60))
    draw.text((120, 120), f"Dialog {seed}: press OK", fill=(0, 0, 0))
    return img


def png_b64(img: Image.Image) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def image_messages(b64: str, text: str = "Click the OK button.") -> list[dict]:
    return [
        {"role": "system", "content": "You operate a computer."},
        {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64}"}},
            {"type": "text", "text": text},
        ]},
    ]
