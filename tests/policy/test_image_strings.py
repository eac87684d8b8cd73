"""Image strings that look like paths are never read from disk (issue 59 item 12).

An OpenAI chat request carries each image as a string. The policy endpoint decodes every image itself, from a
``data:`` URL (or fetches an http(s) URL where that is allowed), into a PIL image before the processor sees it;
any other string (an absolute or relative path, a ``file:`` URL, raw base64 without the ``data:`` prefix, which
a JPEG's ``/9j/...`` makes look like a path: the case AReaL upstream fixed) is refused with a 400 that says
what is accepted, and no file is opened. transformers' processors take a string image as a path or a URL
(``load_image``); ours never get one.

Through the real endpoint (HTTP, the tiny model's real processor) with ``EngineDouble`` (the documented stand-in
for AReaL's engine). Every way of opening a file this process has (``open``, ``os.open``, PIL's ``Image.open``,
transformers' ``load_image``) is watched; a real PNG with a unique name is the target the strings point at.
"""

import base64
import builtins
import io
import os
import uuid

import httpx
import pytest
from areal.api.cli_args import GenerationHyperparameters
from PIL import Image

from cua_rl.policy import EndpointSettings, PolicyEndpoint, close_loop_servers
from tests.doubles.policy_helpers import EngineDouble


@pytest.fixture
def opened(monkeypatch):
    """Every path this process opens while the test runs (the calls go through unchanged)."""
    import PIL.Image
    import transformers.image_utils

    seen: list[str] = []

    def watch(fn):
        def watched(target, *args, **kwargs):
            if isinstance(target, (str, bytes, os.PathLike)):
                seen.append(os.fsdecode(target) if not isinstance(target, str) else target)
            return fn(target, *args, **kwargs)
        return watched

    monkeypatch.setattr(builtins, "open", watch(builtins.open))
    monkeypatch.setattr(io, "open", watch(io.open))
    monkeypatch.setattr(os, "open", watch(os.open))
    monkeypatch.setattr(PIL.Image, "open", watch(PIL.Image.open))
    monkeypatch.setattr(transformers.image_utils, "load_image", watch(transformers.image_utils.load_image))
    return seen


def _jpeg_b64() -> str:
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (10, 200, 30)).save(buf, format="JPEG")
    return base64.b64encode(buf.getvalue()).decode()


async def test_right_data_12_path_like_image_strings_are_refused_and_nothing_is_opened(processor, tmp_path,
                                                                                        opened, monkeypatch):
    marker = f"marker-{uuid.uuid4().hex}"
    target = tmp_path / f"{marker}.png"
    Image.new("RGB", (32, 32), (255, 0, 0)).save(target)
    opened.clear()   # the test's own write of the target
    monkeypatch.chdir(tmp_path / "..")
    jpeg = _jpeg_b64()
    assert jpeg.startswith("/9j/")   # raw base64 of a JPEG reads like an absolute path
    strings = [str(target), f"file://{target}", f"{tmp_path.name}/{marker}.png", f"../{tmp_path.parent.name}/"
               f"{tmp_path.name}/{marker}.png", "/etc/passwd", "file:///etc/passwd", "../x.png", "x.png",
               f"FILE://{target}", f"data:{target}", jpeg]
    endpoint = PolicyEndpoint(EngineDouble(processor.tokenizer), processor, processor.tokenizer,
                              GenerationHyperparameters(max_new_tokens=8, max_tokens=4096),
                              EndpointSettings(model_name="tiny"))
    answers = []
    try:
        ep = await endpoint.open_episode()
        async with httpx.AsyncClient(timeout=60) as client:
            for s in strings:
                for part in ({"type": "image_url", "image_url": {"url": s}}, {"type": "image", "image": s},
                             {"type": "input_image", "image_url": s}):
                    body = {"model": "tiny", "messages": [{"role": "user", "content": [
                        {"type": "text", "text": "what is on the screen?"}, part]}]}
                    r = await client.post(ep.base_url + "/chat/completions", json=body,
                                          headers={"Authorization": f"Bearer {ep.key}"})
                    answers.append((s[:40], part["type"], r.status_code, r.json()["error"]["message"]))
        assert ep.turns == [] and endpoint.engine.requests == []
    finally:
        await endpoint.aclose()
        await close_loop_servers()
    assert [a for a in answers if a[2] != 400] == [], answers
    read = [p for p in opened if marker in p or "passwd" in p or p.endswith("x.png") or p.startswith("/9j/")]
    assert read == [], f"opened: {read}"
    for s, kind, _, message in answers:
        # the refusal says what is accepted, and does not echo a long string back
        assert "data:" in message and len(message) < 400, (s, kind, message)
