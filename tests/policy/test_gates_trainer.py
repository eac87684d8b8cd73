"""Trainer gates on rows produced by *our* pipeline (policy endpoint -> trajectory), with AReaL's real
FSDPPPOActor (CPU, gloo) and the real CPU inference server:

1. trainer-recomputed logprobs agree with the inference logprobs the endpoint recorded (median/max printed),
   for every row of a multi-row group batch (this needs local_model's packed sdpa on the CPU);
2. one PPO step on those rows changes the weights; AReaL's disk weight update reaches the server, whose
   next answers (through the endpoint) carry the new policy version and agree with the updated trainer.
"""

import asyncio
import json
import uuid

import httpx
import torch
from areal.api import FinetuneSpec, WeightUpdateMeta
from areal.api.cli_args import (
    GenerationHyperparameters,
    InferenceEngineConfig,
    MicroBatchSpec,
    OptimizerConfig,
    PPOActorConfig,
)
from areal.engine import FSDPPPOActor
from areal.engine.vllm_remote import RemotevLLMEngine
from policy_helpers import png_data_url

from cua_rl.local_model import ModelServerProcess
from cua_rl.local_model.packed_attention import enable_packed_sdpa
from cua_rl.policy import EndpointSettings, PolicyEndpoint, close_loop_servers
from cua_rl.trajectory import EpisodeOutcome, group_batch

TEMPERATURE = 0.9


async def _episodes(engine, processor, n_episodes=2):
    """Two-turn episodes driven through the endpoint over HTTP, like an agent: screenshot, answer,
    next screenshot with the history. Returns the outcomes (turns recorded by the endpoint)."""
    policy = PolicyEndpoint(engine, processor, processor.tokenizer,
                            GenerationHyperparameters(max_new_tokens=16, temperature=TEMPERATURE),
                            EndpointSettings(max_screenshots_in_history=2))
    outcomes = []
    try:
        async with httpx.AsyncClient(timeout=300) as http:
            for e in range(n_episodes):
                ep = await policy.open_episode()
                hdr = {"Authorization": f"Bearer {ep.key}"}
                msgs = [{"role": "system", "content": "You operate a computer."},
                        {"role": "user", "content": [{"type": "text", "text": "Save the file."},
                                                     {"type": "image_url", "image_url": {"url": png_data_url((40 * e, 90, 200))}}]}]
                for turn in range(2):
                    r = await http.post(ep.base_url + "/chat/completions", json={"messages": msgs}, headers=hdr)
                    assert r.status_code == 200, r.text
                    msgs.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
                    msgs.append({"role": "user", "content": [{"type": "image_url", "image_url": {
                        "url": png_data_url((200, 40 * e + 20 * turn, 30))}}]})
                policy.close_episode(ep)
                outcomes.append(EpisodeOutcome(turns=ep.turns, reward=float(e % 2)))
    finally:
        await close_loop_servers()
    return outcomes


def _diffs(batch, logp) -> torch.Tensor:
    """|trainer - inference| per generated token (the trainer's logp[i] scores token i+1)."""
    mask = batch["loss_mask"].bool()
    return (torch.roll(logp, 1, dims=-1)[mask] - batch["logprobs"][mask]).abs()


def test_recomputed_logprobs_agree_and_a_ppo_step_reaches_the_server(tiny_model_dir, processor, tmp_path, dist_env):
    enable_packed_sdpa()  # AReaL packs the group's rows into one micro-batch; see local_model/packed_attention.py
    exp, trial = "cua-gates", uuid.uuid4().hex[:8]
    with ModelServerProcess(tiny_model_dir, threads=1, log_path=tmp_path / "serve.log") as srv:
        rollout = RemotevLLMEngine(InferenceEngineConfig(backend="vllm:d1", experiment_name=exp, trial_name=trial,
                                                         setup_timeout=60, request_timeout=300))
        rollout.initialize(addr=[srv.addr])
        actor = FSDPPPOActor(PPOActorConfig(
            experiment_name=exp, trial_name=trial, path=tiny_model_dir, backend="fsdp:d1", attn_impl="sdpa",
            dtype="float32", temperature=TEMPERATURE, weight_update_mode="disk", ppo_n_minibatches=1,
            recompute_logprob=True, use_decoupled_loss=True, mb_spec=MicroBatchSpec(),
            optimizer=OptimizerConfig(lr=5e-2, warmup_steps_proportion=0.0, weight_decay=0.0)))
        try:
            actor.create_process_group()
            actor.initialize(addr=None, ft_spec=FinetuneSpec(total_train_epochs=1, dataset_size=2,
                                                            train_batch_size=2))
            outcomes = asyncio.run(_episodes(rollout, processor))
            batch = group_batch(outcomes)
            assert batch["input_ids"].shape[0] == 4 and all(len(t.multi_modal_input["image_grid_thw"]) in (1, 2)
                                                           for o in outcomes for t in o.turns)
            (logp,) = actor.compute_logp([batch])
            d0 = _diffs(batch, logp)
            stats = {"tokens": int(d0.numel()), "median_abs_diff": float(d0.median()), "max_abs_diff": float(d0.max())}
            print("GATE trainer-vs-inference logprobs (v0):", json.dumps(stats))
            assert stats["median_abs_diff"] < 1e-3 and stats["max_abs_diff"] < 1e-2, stats

            before = {k: v.detach().clone() for k, v in actor.model.state_dict().items()}
            batch["prox_logp"] = logp
            actor.ppo_update(actor.compute_advantages([batch]))
            actor.step_lr_scheduler()
            changed = sum(not torch.equal(before[k], v) for k, v in actor.model.state_dict().items())
            print(f"GATE PPO step changed {changed}/{len(before)} parameter tensors")
            assert changed > 0

            meta = WeightUpdateMeta.from_disk(exp, trial, file_root=str(tmp_path / "fileroot"))
            actor.connect_engine(rollout, meta)
            actor.update_weights(meta.with_version(1))
            actor.set_version(1)
            rollout.set_version(1)
            assert httpx.get(srv.url + "/version").json()["version"] == 1

            outcomes1 = asyncio.run(_episodes(rollout, processor))
            assert all(t.versions == {1} for o in outcomes1 for t in o.turns)
            batch1 = group_batch(outcomes1)
            (logp1,) = actor.compute_logp([batch1])
            d1 = _diffs(batch1, logp1)
            stats1 = {"tokens": int(d1.numel()), "median_abs_diff": float(d1.median()), "max_abs_diff": float(d1.max())}
            print("GATE trainer-vs-inference logprobs (v1, after the update):", json.dumps(stats1))
            assert stats1["median_abs_diff"] < 1e-3 and stats1["max_abs_diff"] < 1e-2, stats1
        finally:
            rollout.destroy()
            actor.destroy()
