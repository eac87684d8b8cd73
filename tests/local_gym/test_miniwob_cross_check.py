"""Issue 85 item 6's cross-check (bench/miniwob_cross_check.py): how our agent's actions become the ``miniwob``
package's (a click on the 0-1000 grid of the 480x630 screen -> CLICK_COORDS in CSS pixels of the task area, on the
device pixel our gym presses), how the package's reward is scored as our gym scores it, and one real episode on the
package's own environment at device scale 3: the screenshot the policy sees is 480x630, and the qwen3-vl format's
click on the button's centre, through the adapter, ends the episode with reward 1."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest

from cua_rl.local_agent.formats import PromptContext, get_format
from tests.benches import bench_module

ROOT = Path(__file__).resolve().parents[2]


xcheck = bench_module("miniwob_cross_check")
CTX = PromptContext(instruction="-", screen=xcheck.SCREEN)


def _gym_action(action: str, coordinate=None, **args) -> dict:
    """The wire action our agent sends for a qwen3-vl tool call (the format's own parse)."""
    arguments = {"action": action, **({"coordinate": coordinate} if coordinate is not None else {}), **args}
    return get_format("qwen3-vl").to_action(arguments, CTX, None).gym_action


def test_a_grid_click_lands_on_the_css_pixel_of_the_device_pixel_our_gym_presses():
    # the centre: fraction 0.5 -> device pixel (240, 315) -> CSS (80, 105), the task area's centre
    assert xcheck.package_actions(_gym_action("left_click", [500, 500])) == [("CLICK_COORDS", {"coords": (80.0, 105.0)})]
    # the far edge: our gym clamps to the last device pixel (479, 629), a third of a CSS pixel inside the area
    assert xcheck.package_actions(_gym_action("left_click", [1000, 1000])) == [
        ("CLICK_COORDS", {"coords": (479 / 3, 629 / 3)})]
    # the device pixel is truncated as our gym truncates it, not rounded: int(0.124 * 480) = int(59.52) = 59 -> 59 / 3
    assert xcheck.css_point(0.124, 0.0) == (59 / 3, 0.0)
    assert xcheck.package_actions(_gym_action("double_click", [0, 0]))[0][0] == "DBLCLICK_COORDS"
    assert xcheck.package_actions(_gym_action("type", text="hi")) == [("TYPE_TEXT", {"text": "hi"})]
    assert xcheck.package_actions(_gym_action("key", keys=["ctrl", "a"])) == [("PRESS_KEY", {"key": "C-a"})]
    assert xcheck.package_actions(_gym_action("key", keys=["enter"]), ("x", "<Enter>")) == [
        ("PRESS_KEY", {"key": 1})]
    # what the package cannot do is said, not approximated
    for unmappable in (_gym_action("right_click", [10, 10]), _gym_action("triple_click", [10, 10])):
        with pytest.raises(xcheck.Unmappable):
            xcheck.package_actions(unmappable)
    with pytest.raises(xcheck.Unmappable, match="no key"):
        xcheck.package_actions(_gym_action("key", keys=["f5"]), ("<Enter>",))


def test_the_packages_reward_is_scored_as_our_gym_scores_the_page():
    assert xcheck.reference_reward({"raw_reward": 1.0, "done": True}) == 1.0
    assert xcheck.reference_reward({"raw_reward": -1.0, "done": True}) == 0.0     # a wrong answer: clipped
    assert xcheck.reference_reward({"raw_reward": 0.6, "done": True}) == 0.6      # a partial reward kept
    assert xcheck.reference_reward({"raw_reward": None, "done": False}) == 0.0    # never done
    eps = [{"task": "a", "seed": 1, "ours": 1.0, "reference": 1.0, "unmapped": None, "reference_raw": 1.0,
            "reference_reason": None},
           {"task": "a", "seed": 2, "ours": 0.0, "reference": 1.0, "unmapped": None, "reference_raw": 1.0,
            "reference_reason": None},
           {"task": "b", "seed": 1, "ours": 0.0, "reference": 0.0, "unmapped": "no package action", "reference_raw": None,
            "reference_reason": None}]
    got = xcheck.compare(eps)
    assert (got["agree"], got["of"]) == (1, 2) and got["per_task"]["a"]["agree"] == 1
    assert [d["seed"] for d in got["differ"]] == [2] and got["left_out"][0]["task"] == "b"


@pytest.mark.timeout(120)
def test_a_grid_click_on_the_button_solves_a_real_reference_episode_at_scale_3():
    from PIL import Image

    env = xcheck.reference_env("click-test")
    try:
        xcheck.lift_page_timer(env, 3600)
        obs, _ = env.reset(seed=xcheck.HELDOUT_FIRST)
        assert obs["utterance"] == "Click the button."
        gym = xcheck.ReferenceGym(env)
        png = asyncio.run(gym.screenshot("x"))
        assert Image.open(io.BytesIO(png)).size == xcheck.SCREEN and gym.scales == {3}
        # the button's centre in CSS pixels, as the model would point at it on the 0-1000 grid of 480x630
        left, top, w, h = env.instance.driver.execute_script(
            "const r = document.querySelector('#subbtn').getBoundingClientRect(); "
            "return [r.left, r.top, r.width, r.height];")
        grid = [round((left + w / 2) / xcheck.TASK_CSS_SIZE[0] * 1000),
                round((top + h / 2) / xcheck.TASK_CSS_SIZE[1] * 1000)]
        assert asyncio.run(gym.act("x", _gym_action("left_click", grid))) == {"ok": True}
        assert gym.done_info is not None and gym.done_info["raw_reward"] == 1.0
        assert xcheck.reference_reward(gym.done_info) == 1.0
        # once done, later actions are not played (the package refuses them; ours land on the DONE cover)
        assert asyncio.run(gym.act("x", _gym_action("left_click", [0, 0]))) == {"ok": True}
        assert gym.done_info["raw_reward"] == 1.0
    finally:
        env.close()


def test_the_transformers_engine_scores_the_prompt_the_processor_built(tiny_model_dir):
    """The endpoint sends the engine prompt ids and the prepared screenshots (as it sends vLLM); the engine's first
    greedy token and its logprob are the model's on the processor's own tensors, its 3D rotary positions included
    (``mm_token_type_ids``: without them Qwen3-VL's generate put every image token at a text position)."""
    import torch
    from areal.api.cli_args import GenerationHyperparameters
    from areal.api.io_struct import ModelRequest
    from areal.utils.hf_utils import load_hf_processor_and_tokenizer
    from transformers import AutoModelForImageTextToText

    from cua_rl.policy.endpoint import EndpointSettings, prompt_from_messages
    from tests.doubles.policy_helpers import png_data_url

    processor, tokenizer = load_hf_processor_and_tokenizer(tiny_model_dir)
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ctx = PromptContext(instruction="Click the button.", screen=xcheck.SCREEN)
    messages = get_format("qwen3-vl").build_messages(ctx, [], png_data_url(size=xcheck.SCREEN), None)
    prompt = prompt_from_messages(processor, tokenizer, EndpointSettings(max_pixels=200704), messages)
    assert xcheck.mm_token_types(processor, prompt.input_ids) == prompt.mm_token_type_ids
    req = ModelRequest(rid="t", input_ids=list(prompt.input_ids), image_data=[d.b64 for d in prompt.images],
                       gconfig=GenerationHyperparameters(max_new_tokens=1, greedy=True, stop_token_ids=[0]),
                       tokenizer=tokenizer, processor=processor)
    got = xcheck.HFGreedyEngine(model, processor)._generate(req)
    ids = torch.tensor([prompt.input_ids])
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), **prompt.multi_modal_input,
                       mm_token_type_ids=torch.tensor([prompt.mm_token_type_ids])).logits[0, -1]
    expected = torch.log_softmax(logits.float(), -1)
    assert got.output_tokens == [int(expected.argmax())]
    assert abs(got.output_logprobs[0] - float(expected.max())) < 1e-4
