"""Warm start by SFT (cua_rl.sft), with real desktops and AReaL's real FSDP SFT engine on the tiny model:

1. demonstrations recorded from the curriculum's scripted solutions score 1.0 and are the agent's own
   prompts (qwen3-vl system prompt, screenshots, history with the earlier replies, final terminate);
2. a demonstration turn's row has exactly the prompt ids, image tensors and ``mm_token_type_ids`` that the
   policy endpoint records when an agent sends the same messages over HTTP (one prompt definition), with
   the loss on the reply tokens only;
3. a few SFT steps lower the loss on those rows and the checkpoint loads with AutoModelForImageTextToText.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
import torch
from areal.api.cli_args import GenerationHyperparameters

from cua_rl.local_gym import load_tasks, start_gym_server
from cua_rl.policy import EndpointSettings, PolicyEndpoint, close_loop_servers, tensor_sha256
from cua_rl.sft import demo_rows, qwen3_vl_reply, record_demos, reply_ids, train_rows
from tests.doubles.policy_helpers import EngineDouble  # the endpoint's engine test double

pytestmark = pytest.mark.desktop
SETTINGS = EndpointSettings(max_screenshots_in_history=2, max_pixels=200704)   # config.cpu.yaml's policy


@pytest.fixture(scope="module")
def demos():
    tasks = [load_tasks().get(n) for n in ("050", "051", "052")]
    with start_gym_server(port=0, max_executions=4, pool_size=0) as gym:
        return asyncio.run(record_demos(gym.url, gym.gym_id, tasks, [0, 1], history_images=3))


def test_demonstrations_are_solved_agent_prompts(demos):
    assert len(demos) == 6 and all(d.reward == 1.0 for d in demos)
    type_word = next(d for d in demos if d.task_id.startswith("052"))
    assert len(type_word.turns) == 4             # click, type, Enter, terminate
    first, last = type_word.turns[0], type_word.turns[-1]
    assert first.messages[0]["role"] == "system" and "computer_use" in first.messages[0]["content"]
    assert f"Task: {type_word.instruction}" == first.messages[1]["content"][0]["text"]
    assert '"left_click"' in first.reply and last.reply == qwen3_vl_reply(None)
    # history: the last turn replays the two previous screenshots with the replies that followed them
    assert [m["role"] for m in last.messages] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert last.messages[2]["content"] == type_word.turns[1].reply


async def _endpoint_turn(processor, messages):
    """What the policy endpoint records for ``messages`` sent over HTTP like an agent does."""
    engine = EngineDouble(processor.tokenizer)
    policy = PolicyEndpoint(engine, processor, processor.tokenizer,
                            GenerationHyperparameters(max_new_tokens=16, max_tokens=8192), SETTINGS)
    try:
        ep = await policy.open_episode()
        async with httpx.AsyncClient(timeout=120) as http:
            r = await http.post(ep.base_url + "/chat/completions", json={"messages": messages},
                                headers={"Authorization": f"Bearer {ep.key}"})
        assert r.status_code == 200, r.text
        policy.close_episode(ep)
        return ep.turns[0]
    finally:
        await policy.aclose()
        await close_loop_servers()


def test_demo_row_prompt_is_the_policy_endpoint_prompt(demos, processor):
    demo = next(d for d in demos if d.task_id.startswith("052"))
    turn = demo.turns[-1]                               # three screenshots sent, two kept by the endpoint
    row = demo_rows(processor, processor.tokenizer, SETTINGS, demo)[-1]
    recorded = asyncio.run(_endpoint_turn(processor, turn.messages))
    p, out = len(recorded.prompt_ids), reply_ids(processor.tokenizer, turn.reply)
    assert row["input_ids"][0, :p].tolist() == recorded.prompt_ids
    assert row["input_ids"][0, p:].tolist() == out
    assert row["loss_mask"][0].tolist() == [0] * p + [1] * len(out)
    assert row["mm_token_type_ids"][0, :p].tolist() == recorded.prompt_mm_token_type_ids
    mmi = row["multi_modal_input"][0]
    assert recorded.n_images == 2 and mmi["image_grid_thw"].shape[0] == 2
    for key in ("pixel_values", "image_grid_thw"):
        assert tensor_sha256(mmi[key]) == tensor_sha256(recorded.multi_modal_input[key])


def test_sft_lowers_the_loss_and_the_checkpoint_loads(demos, processor, tiny_model_dir, tmp_path, dist_env):
    from transformers import AutoModelForImageTextToText

    rows = [r for d in demos[:3] for r in demo_rows(processor, processor.tokenizer, SETTINGS, d)]
    result = train_rows(rows, tiny_model_dir, str(tmp_path / "sft"), steps=3, rows_per_step=4, lr=1e-3)
    print("SFT", json.dumps({k: v for k, v in result.__dict__.items() if k != "checkpoint"}))
    assert result.loss_after < 0.7 * result.loss_before, result
    model = AutoModelForImageTextToText.from_pretrained(result.checkpoint, dtype=torch.float32)
    original = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32)
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, original.state_dict()[k])]
    assert changed, "the checkpoint holds the original weights"
    assert (Path(result.checkpoint) / "preprocessor_config.json").exists() or \
        (Path(result.checkpoint) / "processor_config.json").exists()


def test_an_imperfect_demonstrator_keeps_its_wrong_demonstrations():
    """``sft.demo_error_rate``: demonstrations chosen by seed play another key (key-colour) and are kept,
    scored 0 by the gym; the others score 1.0; the choice is the same every time."""
    from cua_rl.local_gym.curriculum import make_instance
    from cua_rl.sft.demos import demo_actions

    seeds = list(range(8))
    planned = [demo_actions(make_instance("key-colour", s), 0.5) for s in seeds]
    assert planned == [demo_actions(make_instance("key-colour", s), 0.5) for s in seeds]
    assert 0 < sum(wrong for _, wrong in planned) < len(seeds)
    assert all(not wrong for _, wrong in (demo_actions(make_instance("key-colour", s), 0.0) for s in seeds))
    with start_gym_server(port=0, max_executions=4, pool_size=0) as gym:
        demos = asyncio.run(record_demos(gym.url, gym.gym_id, [load_tasks().get("053")], seeds,
                                         history_images=3, error_rate=0.5))
    assert [d.seed for d in demos] == seeds                      # wrong ones are kept, not filtered out
    for demo, (actions, wrong) in zip(demos, planned):
        assert demo.erroneous == wrong and demo.reward == (0.0 if wrong else 1.0)
        right = make_instance("key-colour", demo.seed).solution[0]["keys"][0]
        pressed = json.loads(demo.turns[0].reply.split("\n")[1])["arguments"]["keys"]
        assert pressed == actions[0]["keys"] and (pressed != [right]) == wrong


def test_a_play_longer_than_the_turn_limit_is_cut_and_never_terminates():
    """``demo_turns``: a play longer than ``max_turns`` stops there without a terminate turn (the agent would stop
    it there); a play that fits ends with terminate (None), the key-sequence slip too: its demonstrator stops at
    the black screen after the wrong key."""
    from cua_rl.local_gym.curriculum import make_instance, wrong_solutions
    from cua_rl.sft.demos import demo_turns

    inst = make_instance("key-sequence", 1)
    (slip,) = wrong_solutions(inst)
    assert len(slip) <= 3 and demo_turns(slip, 6) == [*slip, None]
    long = inst.solution * 3
    assert demo_turns(long, 6) == list(long[:6])
    assert demo_turns(inst.solution, 6) == [*inst.solution, None]
    assert demo_turns(inst.solution, None) == [*inst.solution, None]
    key = make_instance("key-colour", 0).solution
    assert demo_turns(key, 1) == [*key, None]      # fits: keeps the terminate turn its warm start was built with
