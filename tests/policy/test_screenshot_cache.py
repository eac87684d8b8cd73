"""Each distinct screenshot is prepared once per episode, and the prompt assembled from the prepared pieces is
the processor's own output: ids, image-token types and pixel tensors hash-equal to processing the whole prompt
from scratch, turn after turn, with episodes running concurrently on the endpoint's thread pool.

The engine is ``EngineDouble`` (the documented stand-in for AReaL's engine, tests/doubles/policy_helpers.py): only the
endpoint's prompt building is under test here; the gates against real vLLM prove the same ids end to end.
"""

import asyncio

import httpx
import pytest
from areal.api.cli_args import GenerationHyperparameters

from cua_rl.policy import EndpointSettings, PolicyEndpoint, close_loop_servers, tensor_sha256
from cua_rl.policy.images import decode_data_url
from cua_rl.policy.prompt import expand_image_tokens, fit_for, split_matches_whole
from tests.doubles.policy_helpers import EngineDouble, png_data_url

MAX_PIXELS = 40_000  # the larger screenshots below are shrunk, as the endpoint does on every turn


class CountingImageProcessor:
    """Counts calls into the processor's real image processor (which still does all the work)."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.inner(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.fixture
async def endpoint(processor):
    gconfig = GenerationHyperparameters(max_new_tokens=16, max_tokens=8192)
    ep = PolicyEndpoint(EngineDouble(processor.tokenizer), processor, processor.tokenizer, gconfig,
                        EndpointSettings(model_name="tiny", max_screenshots_in_history=3, max_pixels=MAX_PIXELS))
    yield ep
    await ep.aclose()
    await close_loop_servers()


def _screens(episode: int, n: int) -> list[str]:
    sizes = [(320, 200), (400, 250), (160, 100), (300, 300)]
    return [png_data_url(((37 * episode + 60 * i) % 256, 90, 200 - 40 * i), sizes[i % len(sizes)]) for i in range(n)]


def _messages(urls: list[str]) -> list[dict]:
    msgs = [{"role": "system", "content": "You operate a computer."}]
    for i, url in enumerate(urls):
        msgs.append({"role": "user", "content": [{"type": "text", "text": f"turn {i}"},
                                                 {"type": "image_url", "image_url": {"url": url}}]})
        if i < len(urls) - 1:
            msgs.append({"role": "assistant", "content": f"clicked {i}"})
    return msgs


def _from_scratch(processor, urls: list[str], keep: int):
    """The whole processor call on the same resized screenshots, with the oldest beyond the history cut as
    text: what the endpoint's prompt must equal."""
    tpl = [{"role": "system", "content": "You operate a computer."}]
    images = []
    for i, url in enumerate(urls):
        if i >= len(urls) - keep:
            images.append(fit_for(processor, decode_data_url(url, EndpointSettings().image_limits), None, MAX_PIXELS).image)
            part = {"type": "image"}
        else:
            part = None
        content = [{"type": "text", "text": f"turn {i}"}] + ([part] if part else [])
        tpl.append({"role": "user", "content": content})
        if i < len(urls) - 1:
            tpl.append({"role": "assistant", "content": f"clicked {i}"})
    text = processor.apply_chat_template(tpl, add_generation_prompt=True, tokenize=False)
    return processor(images=images, text=[text], return_tensors="pt")


async def _episode(endpoint, urls: list[str]):
    ep = await endpoint.open_episode()
    async with httpx.AsyncClient(timeout=60) as c:
        for turn in range(1, len(urls) + 1):
            r = await c.post(ep.base_url + "/chat/completions", json={"model": "tiny", "messages": _messages(urls[:turn])},
                             headers={"Authorization": f"Bearer {ep.key}"})
            assert r.status_code == 200, r.text
    return ep


def _assert_equal(turn, ref):
    assert turn.prompt_ids == ref["input_ids"][0].tolist()
    assert turn.prompt_mm_token_type_ids == ref["mm_token_type_ids"][0].tolist()
    for key in ("pixel_values", "image_grid_thw"):
        assert tensor_sha256(turn.multi_modal_input[key]) == tensor_sha256(ref[key]), key


def test_the_tiny_processor_takes_the_per_image_path(processor):
    assert split_matches_whole(processor)  # otherwise every test below would check only the fallback


async def test_turns_equal_processing_from_scratch_and_each_screenshot_is_prepared_once(endpoint, processor):
    counting = CountingImageProcessor(processor.image_processor)
    processor.image_processor = counting
    try:
        urls = _screens(0, 5)
        ep = await _episode(endpoint, urls)
    finally:
        processor.image_processor = counting.inner
    assert len(ep.turns) == 5
    for n, turn in enumerate(ep.turns, start=1):
        _assert_equal(turn, _from_scratch(processor, urls[:n], keep=3))
    # 5 distinct screenshots, each sent up to 3 times: the image processor ran once per screenshot
    assert counting.calls == 5
    # the cache holds the last request's screenshots only, and nothing once the episode is closed
    assert len(ep.images) == 3
    endpoint.close_episode(ep)
    assert ep.images == {}


async def test_concurrent_episodes_on_the_thread_pool_match_sequential_processing(endpoint, processor):
    eps = await asyncio.gather(*(_episode(endpoint, _screens(e, 3)) for e in range(8)))
    for e, ep in enumerate(eps):
        urls = _screens(e, 3)
        for n, turn in enumerate(ep.turns, start=1):
            _assert_equal(turn, _from_scratch(processor, urls[:n], keep=3))


def test_expand_refuses_a_placeholder_count_that_does_not_match():
    import torch

    from cua_rl.policy.prompt import BadRequest

    grid = torch.tensor([1, 4, 4])
    assert expand_image_tokens("a<i>b", "<i>", [grid], 2) == "a<i><i><i><i>b"
    with pytest.raises(BadRequest):
        expand_image_tokens("a<i>b<i>", "<i>", [grid], 2)
