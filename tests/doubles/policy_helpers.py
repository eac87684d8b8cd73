"""Helpers shared by the policy tests (and the bad-input, SFT and endpoint-bench ones): screenshots as
data URLs and ``EngineDouble``, the documented test double of AReaL's inference engine."""

import base64
import io

from areal.api.io_struct import ModelResponse
from PIL import Image


def png_data_url(color=(200, 30, 30), size=(320, 200), text_box=True) -> str:
    img = Image.new("RGB", size, color)
    if text_box:  # some structure, so different screenshots give different pixel values
        for x in range(10, 60):
            for y in range(10, 30):
                img.putpixel((x, y), (255 - color[0], 255 - color[1], 255 - color[2]))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


class EngineDouble:
    """Test double of AReaL's inference engine (scripted outputs; records every ModelRequest)."""

    def __init__(self, tokenizer, text="click <tool_call>ok</tool_call>", versions=None):
        self.tok = tokenizer
        self.out = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        self.versions = list(versions or [])  # one entry per call: a version list, or None for all-0
        self.requests = []

    async def agenerate(self, req):
        self.requests.append(req)
        script = self.versions.pop(0) if self.versions else None
        vers = script if script is not None else [0] * len(self.out)
        return ModelResponse(input_tokens=list(req.input_ids), output_tokens=list(self.out),
                             output_logprobs=[-0.5] * len(self.out), output_versions=list(vers),
                             stop_reason="stop", tokenizer=req.tokenizer)
