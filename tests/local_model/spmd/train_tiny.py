"""One GRPO step of AReaL's own PPOTrainer in SPMD mode, rollouts from `cua-model serve`.

Run by tests/local_model/test_spmd_launch.py with the launch environment of docs/cpu-backend.md:
AREAL_SPMD_MODE=1 AREAL_LLM_SERVER_ADDRS=host:port RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR/PORT.
Uses AReaL's VisionRLVRWorkflow (processor ids + images, chat path to the server) unchanged.
"""

from __future__ import annotations

import json
import sys

from PIL import Image, ImageDraw

def reward(prompt, completions, prompt_ids, completion_ids, **kw) -> float:
    return float(completion_ids[0] % 2)   # any deterministic, non-constant signal will do

def _screen(seed: int) -> Image.Image:
    img = Image.new("RGB", (1280, 800), (30 + 60 * seed, 90, 160))
    ImageDraw.Draw(img).rectangle([100 + 40 * seed, 100, 500, 300], fill=(240, 240, 240))
    return img

def main(argv: list[str]) -> None:
    from areal.api.cli_args import GRPOConfig, load_expr_config
    from areal.trainer import PPOTrainer
    from transformers import AutoProcessor

    from cua_rl.local_model import enable_packed_sdpa

    enable_packed_sdpa()
    config, _ = load_expr_config(argv, GRPOConfig)
    processor = AutoProcessor.from_pretrained(config.actor.path)
    rows = []
    for seed in range(2):
        chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Click OK."}]}]
        rows.append({
            "images": [_screen(seed)],
            "messages": processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False),
            "messages_chat": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": ""}},
                                                          {"type": "text", "text": "Click OK."}]}],
        })
    with PPOTrainer(config, train_dataset=rows) as trainer:
        trainer.train(
            workflow="areal.workflow.vision_rlvr.VisionRLVRWorkflow",
            workflow_kwargs=dict(reward_fn=reward, gconfig=config.gconfig, tokenizer=config.tokenizer_path,
                                 processor=config.tokenizer_path, enable_thinking=False),
        )
        print("SPMD_DONE", json.dumps({"actor_version": trainer.actor.get_version(),
                                       "rollout_version": trainer.rollout.get_version()}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
