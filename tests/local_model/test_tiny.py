"""The tiny checkpoint: deterministic, loads with the Auto classes, renders our template, small images."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file
from transformers import AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

from cua_rl.local_model import build_tiny
from lm_helpers import screenshot


def test_build_is_deterministic_and_seeded(tiny_dir, tmp_path):
    again = build_tiny(tmp_path / "again", seed=0)
    other = build_tiny(tmp_path / "other", seed=1)
    a, b, c = (load_file(str(d / "model.safetensors")) for d in (tiny_dir, again, other))
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)
    assert (tiny_dir / "tokenizer.json").read_text() == (again / "tokenizer.json").read_text()
    size = sum(p.stat().st_size for p in tiny_dir.iterdir())
    assert size < 5_000_000, size


def test_loads_like_a_released_checkpoint(tiny_dir):
    proc = AutoProcessor.from_pretrained(tiny_dir)
    model = AutoModelForImageTextToText.from_pretrained(tiny_dir)
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    assert type(proc).__name__ == "Qwen3VLProcessor"
    assert type(model).__name__ == "Qwen3VLForConditionalGeneration"
    assert model.config.model_type == "qwen3_vl"
    assert model.dtype == torch.float32
    cfg = model.config
    for token, attr in [("<|image_pad|>", "image_token_id"), ("<|vision_start|>", "vision_start_token_id"),
                        ("<|vision_end|>", "vision_end_token_id")]:
        assert tok.convert_tokens_to_ids(token) == getattr(cfg, attr)
    assert tok.eos_token == "<|im_end|>"
    assert len(tok) == cfg.text_config.vocab_size
    text = 'Click {"name": "computer_use", "arguments": {"action": "left_click"}} <tool_call>'
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.convert_tokens_to_ids("<tool_call>") in ids     # one token, kept in decoded text
    assert tok.decode(ids, skip_special_tokens=True) == text


def test_chat_template_renders_turns_images_and_tool_calls(tiny_dir):
    proc = AutoProcessor.from_pretrained(tiny_dir)
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Open the menu."}]},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
            "name": "computer_use", "arguments": json.dumps({"action": "left_click", "coordinate": [1, 2]})}}]},
        {"role": "tool", "content": "ok"},
    ]
    text = proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Open the menu.<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "computer_use", "arguments": '
        '{"action": "left_click", "coordinate": [1, 2]}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")
    tools = [{"type": "function", "function": {"name": "computer_use", "parameters": {}}}]
    with_tools = proc.apply_chat_template(msgs[:2], tools=tools, add_generation_prompt=False, tokenize=False)
    assert with_tools.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert with_tools.count("<|im_start|>system") == 1 and '"name": "computer_use"' in with_tools


def test_screenshot_becomes_few_image_tokens(tiny_dir):
    proc = AutoProcessor.from_pretrained(tiny_dir)
    text = proc.apply_chat_template([{"role": "user", "content": [{"type": "image"}]}], tokenize=False)
    out = proc(images=[screenshot()], text=[text], return_tensors="pt")
    grid = out["image_grid_thw"][0].tolist()
    n_image_tokens = int((out["input_ids"][0] == proc.image_token_id).sum())
    assert grid[0] == 1 and n_image_tokens == grid[1] * grid[2] // 4
    assert 16 <= n_image_tokens <= 100, n_image_tokens
    assert out["pixel_values"].shape[0] == grid[1] * grid[2]
