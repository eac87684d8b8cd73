"""A screenshot reaches the model resampled at most once, straight onto the processor's patch grid (issue 59
item 3: the images in a row are exactly the pixels vLLM saw, fit to the processor's grid so its resize is the
identity; docs/policy-and-training.md).

What was wrong: ``policy.max_pixels`` 1,003,520 (Qwen2-VL's 1280x28x28) shrank a 1280x800 screenshot to 1267x791,
and the processor then rounded that back up to its 32-pixel grid, 1280x800: two bicubic resamplings on every GPU
turn, in training rows and in what vLLM saw. The CPU recipe did the same (200,704, then the tiny processor's own
65,536 bound).

The tests run the real policy endpoint (HTTP, the real processor and prompt assembly) with ``EngineDouble`` (the
documented stand-in for AReaL's engine, which records the bytes each request forwards): the ``pixel_values`` of
the recorded training row must be the processor's output for the screenshot resampled once, by a single
bicubic resize from the agent's pixels onto the grid (or not at all), and the engine must get those very pixels.
"""

import base64
import io

import httpx
import numpy as np
import pytest
from areal.api.cli_args import GenerationHyperparameters
from PIL import Image
from transformers import Qwen2VLImageProcessor, Qwen2VLImageProcessorFast, Qwen3VLProcessor, Qwen3VLVideoProcessor

from cua_rl.policy import EndpointSettings, PolicyEndpoint, close_loop_servers, tensor_sha256
from cua_rl.policy.images import DecodedImage
from tests.doubles.policy_helpers import EngineDouble

# Qwen3-VL-2B-Instruct's image processor (its preprocessor_config.json): 16-pixel patches merged 2x2, so one
# visual token is a 32x32 cell; bounds 65,536 .. 16,777,216 pixels.
QWEN3_VL = dict(patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3,
                size={"shortest_edge": 65_536, "longest_edge": 16_777_216})


def _qwen3_vl_processor(tokenizer, chat_template: str) -> Qwen3VLProcessor:
    size = QWEN3_VL["size"]
    return Qwen3VLProcessor(image_processor=Qwen2VLImageProcessorFast(**QWEN3_VL), tokenizer=tokenizer,
                            video_processor=Qwen3VLVideoProcessor(size=size, patch_size=16, temporal_patch_size=2,
                                                                  merge_size=2),
                            chat_template=chat_template)


def _screenshot(width=1280, height=800) -> tuple[Image.Image, str]:
    """A desktop-sized screenshot with fine detail (so any resampling changes its pixels), as a PNG data URL."""
    rng = np.random.default_rng(7)
    img = Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return img, "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


async def _one_turn(processor, settings: EndpointSettings, url: str):
    """One chat turn through the real endpoint: (the recorded training row, the engine's request)."""
    engine = EngineDouble(processor.tokenizer)
    endpoint = PolicyEndpoint(engine, processor, processor.tokenizer,
                              GenerationHyperparameters(max_new_tokens=8, max_tokens=8192), settings)
    try:
        ep = await endpoint.open_episode()
        body = {"model": "policy", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "click the button"}, {"type": "image_url", "image_url": {"url": url}}]}]}
        async with httpx.AsyncClient(timeout=120) as client:
            r = await client.post(ep.base_url + "/chat/completions", json=body,
                                  headers={"Authorization": f"Bearer {ep.key}"})
        assert r.status_code == 200, r.text
        assert len(ep.turns) == 1 and len(engine.requests) == 1
        return ep.turns[0], engine.requests[0]
    finally:
        await endpoint.aclose()
        await close_loop_servers()


def _decoded(b64: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB")


async def test_right_data_3_a_training_rows_pixels_are_the_screenshot_resampled_once(processor):
    """config.yaml's old bound (1,003,520) on Qwen3-VL's grid: 1280x800 is 1,024,000 pixels, over it, so it is
    resized once, straight to 1248x768 (39x24 cells: the largest grid size within the bound at the aspect ratio
    the processor's rule keeps); the processor keeps that size and the engine gets the same pixels."""
    qwen = _qwen3_vl_processor(processor.tokenizer, processor.chat_template)
    shot, url = _screenshot()
    turn, request = await _one_turn(qwen, EndpointSettings(max_pixels=1_003_520), url)
    once = shot.resize((1248, 768), Image.Resampling.BICUBIC)   # the single resample, from the agent's pixels
    sent = _decoded(request.image_data[0])
    assert sent.size == once.size and np.array_equal(np.asarray(sent), np.asarray(once)), \
        f"the engine got {sent.size}, not the screenshot resampled once onto the grid"
    ref = qwen.image_processor(images=[once], return_tensors="pt")
    assert turn.multi_modal_input["image_grid_thw"].tolist() == ref["image_grid_thw"].tolist() == [[1, 48, 78]]
    assert tensor_sha256(turn.multi_modal_input["pixel_values"]) == tensor_sha256(ref["pixel_values"])
    unresized = qwen.image_processor(images=[once], do_resize=False, return_tensors="pt")
    assert tensor_sha256(ref["pixel_values"]) == tensor_sha256(unresized["pixel_values"]), \
        "the processor resampled an image already on its grid"


async def test_right_data_3_a_1280x800_screenshot_is_not_resampled_at_the_default_bound(processor):
    """The default bound (1,024,000 = 40x25 cells of 32 pixels): a 1280x800 screenshot is sent as the agent sent
    it (its own bytes) and trained on as the processor makes it of those pixels, with no resize at all."""
    qwen = _qwen3_vl_processor(processor.tokenizer, processor.chat_template)
    shot, url = _screenshot()
    turn, request = await _one_turn(qwen, EndpointSettings(), url)
    assert request.image_data[0] == url.split(",", 1)[1], "the agent's bytes were re-encoded"
    ref = qwen.image_processor(images=[shot], do_resize=False, return_tensors="pt")
    assert turn.multi_modal_input["image_grid_thw"].tolist() == [[1, 50, 80]]
    assert tensor_sha256(turn.multi_modal_input["pixel_values"]) == tensor_sha256(ref["pixel_values"])


async def test_right_data_3_the_processors_own_bound_is_met_in_one_resample(processor):
    """The CPU recipe: policy.max_pixels 200,704 but the tiny model's processor allows at most 65,536 pixels. The
    screenshot goes straight to its grid size within the tighter bound (one resample), not first to 200,704 and
    then again to 65,536 by the processor."""
    shot, url = _screenshot()
    turn, request = await _one_turn(processor, EndpointSettings(max_pixels=200_704), url)
    sent = _decoded(request.image_data[0])
    w, h = sent.size
    assert w % 32 == 0 and h % 32 == 0 and w * h <= 65_536, sent.size
    once = shot.resize((w, h), Image.Resampling.BICUBIC)
    assert np.array_equal(np.asarray(sent), np.asarray(once)), "the engine's image is not one resample of the agent's"
    ref = processor.image_processor(images=[once], do_resize=False, return_tensors="pt")
    assert turn.multi_modal_input["image_grid_thw"].tolist() == [[1, h // 16, w // 16]]
    assert tensor_sha256(turn.multi_modal_input["pixel_values"]) == tensor_sha256(ref["pixel_values"])


@pytest.mark.parametrize("cls", [Qwen2VLImageProcessor, Qwen2VLImageProcessorFast])
@pytest.mark.parametrize("patch", [16, 14], ids=["qwen3-vl-32px", "qwen2.5-vl-28px"])
def test_one_resampling_onto_either_grid_and_either_processor_class(cls, patch):
    """The rule for Qwen3-VL's 32-pixel and Qwen2.5-VL's 28-pixel grids, with the slow (PIL) and fast (torch)
    processor classes: an image out of bounds goes onto the grid within them and the processor keeps it as it is;
    one within the bounds whose grid rounding stays within them keeps the agent's bytes."""
    from types import SimpleNamespace

    from cua_rl.policy.prompt import fit_for, image_grid

    ip = cls(patch_size=patch, merge_size=2, size={"shortest_edge": 56 * 56, "longest_edge": 16384 * 28 * 28})
    processor = SimpleNamespace(image_processor=ip)
    img, url = _screenshot()
    shot = DecodedImage(url.split(",", 1)[1], img, "data")
    assert image_grid(processor)[0] == 2 * patch
    for max_pixels in (1_003_520, 200_704):
        sent = fit_for(processor, shot, None, max_pixels)
        w, h = sent.image.size
        assert w % (2 * patch) == 0 and h % (2 * patch) == 0 and w * h <= max_pixels, (max_pixels, w, h)
        assert np.array_equal(np.asarray(_decoded(sent.b64)), np.asarray(sent.image))   # the bytes are these pixels
        out = ip(images=[sent.image], return_tensors="pt")
        assert out["image_grid_thw"].tolist() == [[1, h // patch, w // patch]]
        kept = ip(images=[sent.image], do_resize=False, return_tensors="pt")
        assert tensor_sha256(out["pixel_values"]) == tensor_sha256(kept["pixel_values"])
    if patch == 16:   # 1280x800 is 40x25 cells of 32 pixels: within the default bound, never resampled
        assert fit_for(processor, shot, None, EndpointSettings().max_pixels) is shot
