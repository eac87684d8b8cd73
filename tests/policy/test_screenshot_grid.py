"""A screenshot reaches the model resampled at most once, straight onto the processor's patch grid.

Before: ``policy.max_pixels`` 1,003,520 (Qwen2-VL's 1280x28x28) shrank a 1280x800 screenshot to 1267x791,
and the processor then rounded it to its grid: two resamplings, and pixels the prompt proof (ids) never
checked. Now, for Qwen3-VL's 32-pixel grid (16-pixel patches merged 2x2) and Qwen2.5-VL's 28-pixel grid:
an image over the bounds is resized once, onto the grid and within the bounds; the processor keeps its
size (its grid is the image's own, and its pixel values equal those of the same image with resizing off), so the
``pixel_values`` a row trains on are what the processor makes of the bytes the engine gets (vLLM runs the
same Hugging Face processor on them); and a screenshot within the bounds is sent as the agent sent it.
"""

import base64
import io
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image
from transformers import Qwen2VLImageProcessor, Qwen2VLImageProcessorFast

from cua_rl.policy import EndpointSettings, tensor_sha256
from cua_rl.policy.images import DecodedImage
from cua_rl.policy.prompt import fit_for, image_grid


def _screenshot(width=1280, height=800) -> DecodedImage:
    img = Image.fromarray(np.random.default_rng(0).integers(0, 255, (height, width, 3), dtype=np.uint8))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return DecodedImage(base64.b64encode(buf.getvalue()).decode("ascii"), img, "data")


@pytest.mark.parametrize("cls", [Qwen2VLImageProcessor, Qwen2VLImageProcessorFast])
@pytest.mark.parametrize("patch", [16, 14], ids=["qwen3-vl-32px", "qwen2.5-vl-28px"])
def test_one_resampling_onto_the_processor_grid(cls, patch):
    ip = cls(patch_size=patch, merge_size=2, size={"shortest_edge": 56 * 56, "longest_edge": 16384 * 28 * 28})
    processor, shot = SimpleNamespace(image_processor=ip), _screenshot()
    assert image_grid(processor)[0] == 2 * patch
    for max_pixels in (1_003_520, 200_704):   # a 1280x800 screenshot is over these bounds
        sent = fit_for(processor, shot, None, max_pixels)
        w, h = sent.image.size
        assert w % (2 * patch) == 0 and h % (2 * patch) == 0 and w * h <= max_pixels, (max_pixels, w, h)
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(base64.b64decode(sent.b64))).convert("RGB")),
                              np.asarray(sent.image))   # the bytes sent are these pixels
        out = ip(images=[sent.image], return_tensors="pt")
        assert out["image_grid_thw"].tolist() == [[1, h // patch, w // patch]]
        kept = ip(images=[sent.image], do_resize=False, return_tensors="pt")
        assert tensor_sha256(out["pixel_values"]) == tensor_sha256(kept["pixel_values"])
    # within the default bounds: the agent's own bytes are sent (1280x800 is 40x25 cells of Qwen3-VL's 32
    # pixels, 1000 visual tokens, never resampled; on Qwen2.5-VL's grid the processor's one resize fits it)
    assert fit_for(processor, shot, None, EndpointSettings().max_pixels) is shot
    odd = _screenshot(1000, 700)
    assert fit_for(processor, odd, None, EndpointSettings().max_pixels) is odd


def test_the_processors_own_bounds_are_kept(processor):
    """The tiny model's processor allows at most 65,536 pixels: the screenshot goes straight there (one
    resampling), not first to ``max_pixels`` and then again to the processor's bound."""
    factor, low, high = image_grid(processor)
    sent = fit_for(processor, _screenshot(), None, 200_704)
    w, h = sent.image.size
    assert factor == 32 and w % factor == 0 and h % factor == 0 and low <= w * h <= high
    out = processor.image_processor(images=[sent.image], return_tensors="pt")
    assert out["image_grid_thw"].tolist() == [[1, h // 16, w // 16]]
