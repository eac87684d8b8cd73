"""The policy endpoint refuses every request of its malformed-request corpus with a clear 4xx (OpenAI's
error shape), records no turn and sends nothing to the engine for any of them, still takes a request with
several full-HD screenshots, and stays healthy (issue 16). The engine is ``EngineDouble`` (tests/doubles):
only the endpoint's input handling is under test here."""

from __future__ import annotations

import base64
import io
import os
import struct
import zlib

import httpx
import pytest
from areal.api.cli_args import GenerationHyperparameters
from PIL import Image

from bad_input_corpus import Case, check_refused, json_bytes, nested, send
from cua_rl.http.serve import free_port
from cua_rl.policy import EndpointSettings, PolicyEndpoint, close_loop_servers
from tests.doubles.policy_helpers import EngineDouble, png_data_url

CHAT = "/v1/chat/completions"
JSON = {"Content-Type": "application/json"}


def png_header(width: int, height: int) -> bytes:
    """A PNG that declares ``width`` x ``height`` but carries almost no data (a decompression-bomb probe)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def b64_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def user(*parts) -> dict:
    return {"role": "user", "content": list(parts)}


def image(url) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def chat(name, says="", status=400, **body):
    return Case(name, "POST", CHAT, json=body, status=status, says=says)


TRUNCATED = base64.b64decode(png_data_url().split(",", 1)[1])[:60]
CASES = [
    # transport, auth, routes
    Case("no key", "POST", CHAT, json={"messages": [{"role": "user", "content": "hi"}]},
         headers={"Authorization": None}, status=401, says="API key"),
    Case("wrong key", "POST", CHAT, json={"messages": [{"role": "user", "content": "hi"}]},
         headers={"Authorization": "Bearer cua-wrong"}, status=401, says="API key"),
    Case("wrong x-api-key", "POST", CHAT, json={"messages": [{"role": "user", "content": "hi"}]},
         headers={"Authorization": None, "x-api-key": "cua-%2F..%2F"}, status=401),
    Case("GET on completions", "GET", CHAT, status=405),
    Case("unknown route", "POST", "/v1/completions", json={"prompt": "hi"}, status=404),
    Case("path trick", "POST", "/v1/..%2Fv1%2Fchat%2Fcompletions", json={}, status=404),
    # the body as a whole
    Case("non-JSON body", "POST", CHAT, content=b"messages=hi", status=400, says="not valid JSON"),
    Case("empty body", "POST", CHAT, content=b"", status=400, says="not valid JSON"),
    Case("array body", "POST", CHAT, json=[{"role": "user", "content": "hi"}], status=400, says="JSON object"),
    Case("string body", "POST", CHAT, json="hi", status=400, says="JSON object"),
    Case("bad UTF-8", "POST", CHAT, content=b'{"messages": "\xff\xfe"}', headers=JSON, status=400, says="JSON"),
    Case("form body", "POST", CHAT, content=b"model=m&messages=hi",
         headers={"Content-Type": "application/x-www-form-urlencoded"}, status=400, says="JSON"),
    Case("deep JSON", "POST", CHAT, content=nested(100_000), headers=JSON, status=400, says="deep"),
    Case("deep JSON in tools", "POST", CHAT, content=b'{"messages": [{"role": "user", "content": "hi"}], "tools": '
         + nested(200) + b"}", headers=JSON, status=400, says="deep"),
    Case("huge body", "POST", CHAT, content=b'{"messages": "' + b"x" * (65 * 1024 * 1024) + b'"}', headers=JSON,
         status=413, says="limit"),
    # messages
    chat("messages missing", "non-empty", model="m"),
    chat("messages a string", "non-empty", messages="hi"),
    chat("messages empty", "non-empty", messages=[]),
    chat("message not object", "not an object", messages=["hi"]),
    chat("role unknown", "role", messages=[{"role": "robot", "content": "x"}]),
    chat("role missing", "role", messages=[{"content": "x"}]),
    chat("content a number", "content", messages=[{"role": "user", "content": 42}]),
    chat("content an object", "content", messages=[{"role": "user", "content": {"text": "x"}}]),
    chat("part not object", "not an object", messages=[user("hello")]),
    chat("part type audio", "unsupported", messages=[user({"type": "audio", "audio": "x"})]),
    chat("text part not text", "unsupported", messages=[user({"type": "text", "text": 7})]),
    chat("bad tool_calls", "template", messages=[{"role": "user", "content": "hi"},
                                                 {"role": "assistant", "content": "", "tool_calls": "x"}]),
    chat("prompt too long", "tokens", messages=[{"role": "user", "content": "word " * 20_000}]),
    chat("n 2", "n must be 1", messages=[{"role": "user", "content": "hi"}], n=2),
    chat("n negative", "n must be 1", messages=[{"role": "user", "content": "hi"}], n=-1),
    chat("tools not a list", "tools", messages=[{"role": "user", "content": "hi"}], tools="computer_use"),
    # images
    chat("image_url without url", "no URL", messages=[user({"type": "image_url", "image_url": {}})]),
    chat("image_url a number", "no URL", messages=[user({"type": "image_url", "image_url": 5})]),
    chat("data URL not base64", "not base64", messages=[user(image("data:image/png,abcd"))]),
    chat("bad base64", "base64", messages=[user(image("data:image/png;base64,!!!!"))]),
    chat("base64 of text", "decodable", messages=[user(image(b64_url(b"not an image at all")))]),
    chat("truncated PNG", "decodable", messages=[user(image(b64_url(TRUNCATED)))]),
    chat("pixel bomb", "pixels", messages=[user(image(b64_url(png_header(30_000, 30_000))))]),
    chat("over 8K pixels", "pixels", messages=[user(image(b64_url(png_header(10_000, 5_000))))]),
    chat("file URL", "never read", messages=[user(image("file:///etc/passwd"))]),
    chat("a path", "never read", messages=[user(image("/etc/passwd"))]),
    chat("ftp URL", "data: URL", messages=[user(image("ftp://127.0.0.1/shot.png"))]),
    chat("http URL closed port", "refused unless", messages=[user(image(f"http://127.0.0.1:{free_port()}/shot.png"))]),
    chat("65 images", "limit", messages=[user(*[image(png_data_url(size=(8, 8), text_box=False))] * 65)]),
]


@pytest.fixture
async def policy(processor):
    engine = EngineDouble(processor.tokenizer)
    gconfig = GenerationHyperparameters(max_new_tokens=8, max_tokens=4096)
    endpoint = PolicyEndpoint(engine, processor, processor.tokenizer, gconfig,
                              EndpointSettings(model_name="tiny", max_pixels=256 * 256,
                                               max_screenshots_in_history=None))  # no cut: the 65-image case
    ep = await endpoint.open_episode()
    yield endpoint, ep
    await endpoint.aclose()
    await close_loop_servers()


def root(ep) -> str:
    return ep.base_url.removesuffix("/v1")


def recorded(endpoint, ep) -> tuple:
    """What a refused request must leave alone (an over-long prompt is counted as the episode's context overflow,
    docs/protocols.md §3, and nothing else)."""
    totals = {k: v for k, v in endpoint.totals.items() if k != "context_overflows"}
    return len(ep.turns), ep.failed_turns, len(endpoint.engine.requests), totals


@pytest.mark.parametrize("case", CASES, ids=str)
async def test_policy_endpoint_refuses(policy, case):
    endpoint, ep = policy
    before = recorded(endpoint, ep)
    out = await send("policy endpoint", root(ep), case, {"key": ep.key},
                     {"Authorization": "Bearer {key}"})
    check_refused(case, out)
    assert '"error"' in out.text or case.status in (404, 405), out.text[:200]
    assert recorded(endpoint, ep) == before, f"{case.name} recorded a turn or reached the engine"


def full_hd_noise_png() -> str:
    """A 1920x1080 screenshot of incompressible pixels: the largest a full-HD PNG gets (about 6.2 MB)."""
    img = Image.frombytes("RGB", (1920, 1080), os.urandom(1920 * 1080 * 3))
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=1)
    return b64_url(buf.getvalue())


async def test_policy_endpoint_takes_full_hd_screenshots_and_stays_healthy(policy):
    endpoint, ep = policy
    assert len(CASES) >= 30
    shots = [full_hd_noise_png()] * 4
    body = json_bytes({"messages": [user({"type": "text", "text": "what changed?"}, *map(image, shots))]})
    assert len(body) > 30 * 1024 * 1024  # four worst-case full-HD screenshots as base64
    async with httpx.AsyncClient(base_url=root(ep), timeout=120) as http:
        r = await http.post(CHAT, content=body, headers={**JSON, "Authorization": f"Bearer {ep.key}"})
        assert r.status_code == 200, r.text[:300]
        assert len(ep.turns) == 1 and ep.turns[0].n_images == 4
        assert (await http.get("/health")).json()["ok"] is True
