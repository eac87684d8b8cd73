"""The training round trip on the CPU with AReaL's real pieces and our real server:

rollout (AReaL RemotevLLMEngine -> cua-model serve, screenshot prompts) -> FSDPPPOActor (gloo) recomputes
logprobs (must agree with the server's) -> PPO step -> weight update through AReaL's disk path (save,
name_resolve, /areal_update_weights) -> the server reports the new version, its outputs change, and its
logprobs agree with the updated trainer.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import os
import uuid

import torch
from areal.api import FinetuneSpec, ModelRequest, WeightUpdateMeta
from areal.api.cli_args import (
    GenerationHyperparameters,
    InferenceEngineConfig,
    MicroBatchSpec,
    OptimizerConfig,
    PPOActorConfig,
)
from areal.engine import FSDPPPOActor
from areal.engine.vllm_remote import RemotevLLMEngine
from lm_helpers import png_b64, screenshot
from PIL import Image
from transformers import AutoProcessor

from cua_rl.local_model import ModelServerProcess, enable_packed_sdpa

logger = logging.getLogger(__name__)
TEMPERATURE = 0.9
G = 4


def _row(processor, b64: str, resp, reward: float) -> dict:
    """One training row, built like areal.workflow.vision_rlvr.VisionRLVRWorkflow."""
    pil = Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB")
    text = processor.apply_chat_template(_tok_msgs(), add_generation_prompt=True, tokenize=False)
    pi = processor(images=[pil], text=[text], return_tensors="pt")
    assert pi["input_ids"][0].tolist() == resp.input_tokens
    seq = resp.input_tokens + resp.output_tokens
    p, n = resp.input_len, resp.output_len
    return {
        "input_ids": torch.tensor([seq]),
        "mm_token_type_ids": torch.tensor([pi["mm_token_type_ids"][0].tolist() + [0] * n]),
        "loss_mask": torch.tensor([[0] * p + [1] * n], dtype=torch.int32),
        "logprobs": torch.tensor([[0.0] * p + resp.output_logprobs], dtype=torch.float32),
        "versions": torch.tensor([[-1] * p + resp.output_versions], dtype=torch.int32),
        "attention_mask": torch.ones(1, len(seq), dtype=torch.bool),
        "rewards": torch.tensor([reward], dtype=torch.float32),
        "multi_modal_input": [{"pixel_values": pi["pixel_values"], "image_grid_thw": pi["image_grid_thw"]}],
    }


def _tok_msgs():
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Click the OK button."}]}]


def _vllm_msgs():
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": ""}},
                                         {"type": "text", "text": "Click the OK button."}]}]


def _diffs(rows, logps) -> torch.Tensor:
    """|trainer - server| per generated token (trainer logp[i] scores token i+1)."""
    out = []
    for row, lp in zip(rows, logps):
        mask = row["loss_mask"][0].bool()
        server = row["logprobs"][0][mask]
        trainer = torch.roll(lp.reshape(-1), 1)[mask]
        out.append((trainer - server).abs())
    return torch.cat(out)


async def _rollout(engine, processor, b64s, seed_tag: str):
    g = GenerationHyperparameters(max_new_tokens=24, temperature=TEMPERATURE, n_samples=1)
    ids = []
    for b64 in b64s:
        pil = Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB")
        text = processor.apply_chat_template(_tok_msgs(), add_generation_prompt=True, tokenize=False)
        ids.append(processor(images=[pil], text=[text], return_tensors="pt")["input_ids"][0].tolist())
    reqs = [ModelRequest(rid=f"{seed_tag}-{i}", input_ids=ids[i], image_data=[b64s[i]],
                         vision_msg_vllm=[_vllm_msgs()], gconfig=g.new(n_samples=1),
                         tokenizer=processor.tokenizer, processor=processor) for i in range(len(b64s))]
    return await asyncio.gather(*[engine.agenerate(r) for r in reqs])


def test_ppo_step_then_disk_update_reaches_the_server(tiny_dir, tmp_path, dist_env):
    exp, trial = "lm-ppo", uuid.uuid4().hex[:8]
    enable_packed_sdpa()   # AReaL packs micro-batches; plain sdpa on CPU would let rows attend to each other
    processor = AutoProcessor.from_pretrained(tiny_dir)
    b64s = [png_b64(screenshot(seed=i % 2)) for i in range(G)]
    with ModelServerProcess(tiny_dir, threads=1, log_path=tmp_path / "serve.log") as srv:
        rollout = RemotevLLMEngine(InferenceEngineConfig(
            backend="vllm:d1", experiment_name=exp, trial_name=trial, setup_timeout=60, request_timeout=300))
        rollout.initialize(addr=[srv.addr])
        actor = FSDPPPOActor(PPOActorConfig(
            experiment_name=exp, trial_name=trial, path=str(tiny_dir), backend="fsdp:d1", attn_impl="sdpa",
            dtype="float32", temperature=TEMPERATURE, weight_update_mode="disk", ppo_n_minibatches=1,
            recompute_logprob=True, use_decoupled_loss=True, mb_spec=MicroBatchSpec(),
            optimizer=OptimizerConfig(lr=5e-2, warmup_steps_proportion=0.0, weight_decay=0.0)))
        try:
            actor.create_process_group()
            actor.initialize(addr=None, ft_spec=FinetuneSpec(total_train_epochs=1, dataset_size=G,
                                                            train_batch_size=G))
            resps = asyncio.run(_rollout(rollout, processor, b64s, "v0"))
            rows = [_row(processor, b64, r, reward=float(i % 2)) for i, (b64, r) in enumerate(zip(b64s, resps))]

            # 1. trainer-recomputed logprobs vs the server's
            logps = actor.compute_logp(rows)
            d0 = _diffs(rows, logps)
            stats = {"tokens": int(d0.numel()), "median_abs_diff": float(d0.median()),
                     "max_abs_diff": float(d0.max())}
            print("LOGPROB_AGREEMENT_V0", json.dumps(stats))
            assert stats["median_abs_diff"] < 1e-3 and stats["max_abs_diff"] < 1e-2, stats

            # 2. one PPO step
            for row, lp in zip(rows, logps):
                row["prox_logp"] = lp
            adv = actor.compute_advantages(rows)
            actor.ppo_update(adv)
            actor.step_lr_scheduler()

            # 3. AReaL's disk weight update (pause, save HF, name_resolve, /areal_update_weights, continue)
            meta = WeightUpdateMeta.from_disk(exp, trial, file_root=str(tmp_path / "fileroot"))
            actor.connect_engine(rollout, meta)
            actor.update_weights(meta.with_version(1))
            actor.set_version(1)
            rollout.set_version(1)
            import httpx
            info = httpx.get(srv.url + "/version").json()
            assert info["version"] == 1 and info["weights_path"].endswith("weight_update_v1")

            # 4. the server's outputs changed, and it now agrees with the updated trainer
            score = httpx.post(srv.url + "/v1/chat/completions", json={
                "messages": [{"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64s[0]}"}},
                    {"type": "text", "text": "Click the OK button."}]}],
                "max_tokens": 24, "temperature": TEMPERATURE, "seed": 1, "logprobs": True}, timeout=120).json()
            assert score["version"] == 1
            resps1 = asyncio.run(_rollout(rollout, processor, b64s, "v1"))
            assert all(set(r.output_versions) == {1} for r in resps1)
            rows1 = [_row(processor, b64, r, 0.0) for b64, r in zip(b64s, resps1)]
            new_logps = actor.compute_logp(rows1)
            d1 = _diffs(rows1, new_logps)
            stats1 = {"tokens": int(d1.numel()), "median_abs_diff": float(d1.median()),
                      "max_abs_diff": float(d1.max())}
            print("LOGPROB_AGREEMENT_V1", json.dumps(stats1))
            assert stats1["median_abs_diff"] < 1e-3, stats1
            # the old sequences now score differently on the trainer side: the update moved the policy
            moved = _diffs(rows, actor.compute_logp(rows))
            assert float(moved.max()) > 1e-3
        finally:
            rollout.destroy()
            actor.destroy()
    assert not os.path.exists(meta.with_version(1).path)   # AReaL clears the checkpoint after the load
