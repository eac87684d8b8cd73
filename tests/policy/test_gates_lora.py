"""The trainer-vs-vLLM logprob gate with LoRA on (issue 37 item 2), with AReaL's real FSDPPPOActor (PEFT adapters
on the language model's projections, as ``actor.use_lora`` wires them: cua_rl/deploy.py ``wire_lora``) and real
vLLM serving the adapters it is sent (``--enable-lora``, AReaL's disk update through ``/v1/load_lora_adapter``):

1. the initial adapter (LoRA's B is zero: the base model), saved and given to vLLM at start as ``policy-v0``, as
   AReaL's trainer does; two-turn episodes through the policy endpoint sample with it and the trainer's
   recomputed logprobs agree;
2. one large PPO step on the adapter, saved and loaded as ``policy-v1``: vLLM's logprobs agree with the
   updated trainer token by token, and the base weights alone no longer explain them (the adapter is applied,
   not ignored: what an adapter on modules vLLM leaves alone, e.g. the vision tower, would look like);
3. the negative case, a stale adapter: the trainer takes a second step, and the server keeps serving the
   adapter it had (v1's files loaded under the name ``policy-v2``, while AReaL labels the tokens v2: what a
   server that acknowledged the update and kept its adapter does). The trainer's on-policy gap, as the
   health check ``sampler_logprob_gap`` computes it, is far above its threshold, and the weight probe (the
   health check ``weights_unchanged``, which with LoRA on reads the served version's adapter) reads the
   adapter as unchanged, while it read the real update to v1 as a change.
"""

import asyncio
import uuid

import httpx
import pytest
import torch
from areal.api import FinetuneSpec, SaveLoadMeta, WeightUpdateMeta
from areal.api.cli_args import (
    InferenceEngineConfig,
    MicroBatchSpec,
    OptimizerConfig,
    PPOActorConfig,
)
from areal.engine import FSDPPPOActor
from areal.engine.vllm_remote import RemotevLLMEngine

import trainer_gates as gates
from cua_rl.areal_ext import compact_images, lora_vlm
from cua_rl.areal_ext.packed_attention import enable_packed_sdpa
from cua_rl.areal_ext.trainer_logprobs import sampler_gap
from cua_rl.deploy import LORA_MODULES
from cua_rl.local_model.vllm_server import VLLMServer
from cua_rl.trainer.health import BY_NAME
from cua_rl.trainer.weight_probe import WeightProbe, adapter_probe
from cua_rl.trajectory import group_batch

pytestmark = pytest.mark.timeout(900)

NAME, RANK, TEMPERATURE = "policy", 8, 1.0


def _loaded_adapters(server: VLLMServer) -> set[str]:
    models = httpx.get(server.url + "/v1/models", timeout=30).json()["data"]
    return {m["id"] for m in models if m.get("parent")}


def test_lora_adapters_served_by_vllm_agree_with_the_trainer_and_a_stale_one_shows(tiny_model_dir, processor,
                                                                                   tmp_path, dist_env, monkeypatch):
    monkeypatch.setenv(lora_vlm.ENV, "1")
    lora_vlm.enable()      # what cua_rl.areal_ext.worker does in a run with LoRA on
    enable_packed_sdpa()
    compact_images.enable()
    exp, trial = "cua-gates-lora", uuid.uuid4().hex[:8]
    rollout = RemotevLLMEngine(InferenceEngineConfig(backend="vllm:d1", experiment_name=exp, trial_name=trial,
                                                     setup_timeout=60, request_timeout=300, use_lora=True,
                                                     lora_name=NAME))
    actor = FSDPPPOActor(PPOActorConfig(
        experiment_name=exp, trial_name=trial, path=tiny_model_dir, backend="fsdp:d1", attn_impl="sdpa",
        dtype="float32", temperature=TEMPERATURE, weight_update_mode="disk", ppo_n_minibatches=1,
        recompute_logprob=True, use_decoupled_loss=True, mb_spec=MicroBatchSpec(), kl_ctl=gates.NO_KL,
        use_lora=True, lora_rank=RANK, lora_alpha=16, target_modules=list(LORA_MODULES[:4]),
        optimizer=OptimizerConfig(lr=5e-2, warmup_steps_proportion=0.0, weight_decay=0.0)))
    server = None
    try:
        actor.create_process_group()
        actor.initialize(addr=None, ft_spec=FinetuneSpec(total_train_epochs=1, dataset_size=2, train_batch_size=2))
        initial = str(tmp_path / "initial_lora")
        actor.save(SaveLoadMeta(path=initial, weight_format="hf", with_optim=False, tokenizer=processor.tokenizer,
                                processor=processor, base_model_path=tiny_model_dir))
        server = VLLMServer(tiny_model_dir, log_path=tmp_path / "vllm.log", max_lora_rank=RANK,
                            lora_modules=[f"{NAME}-v0={initial}"])
        rollout.initialize(addr=[server.addr])
        assert f"{NAME}-v0" in _loaded_adapters(server)
        meta = WeightUpdateMeta.from_disk(exp, trial, file_root=str(tmp_path / "fileroot"), use_lora=True,
                                          lora_name=NAME, base_model_name=tiny_model_dir,
                                          clear_checkpoint_after_load=False)   # the negative case reuses v1's files
        actor.connect_engine(rollout, meta)
        probe = WeightProbe(lambda: [server.addr], adapter_probe(NAME, rollout.get_version))
        probe.baseline()

        outcomes0 = asyncio.run(_lora_episodes(rollout, processor))
        stats0, logp0, batch0 = gates.gate(actor, outcomes0, TEMPERATURE, "LoRA v0 (B = 0)")
        assert stats0["median_abs_diff"] < 1e-3 and stats0["max_abs_diff"] < 1e-2, stats0

        trainable = {k: v.detach().clone() for k, v in actor.model.named_parameters() if v.requires_grad}
        assert trainable and all("lora_" in k for k in trainable), sorted(trainable)[:4]
        batch0["prox_logp"] = logp0
        actor.ppo_update(actor.compute_advantages([batch0]))
        actor.step_lr_scheduler()
        moved = sum(not torch.equal(v, dict(actor.model.named_parameters())[k]) for k, v in trainable.items())
        print(f"GATE LoRA step moved {moved}/{len(trainable)} adapter tensors (B; A's gradient is 0 while B is)")
        assert moved > 0

        actor.update_weights(meta.with_version(1))     # in AReaL's order (rl_trainer): update, then the versions
        actor.set_version(1)
        rollout.set_version(1)
        assert f"{NAME}-v1" in _loaded_adapters(server)
        assert probe.after_update(real=True) == (0, 1)     # the new adapter is served
        outcomes1 = asyncio.run(_lora_episodes(rollout, processor))
        assert all(t.versions == {1} for o in outcomes1 for t in o.turns)
        stats1, _, _ = gates.gate(actor, outcomes1, TEMPERATURE, "LoRA v1 after the update")
        assert stats1["median_abs_diff"] < 1e-3 and stats1["max_abs_diff"] < 1e-2, stats1

        # vLLM applied the adapter: the base weights alone do not explain its v1 logprobs
        turn = outcomes1[0].turns[0]
        base = (gates.hf_logprobs(tiny_model_dir, turn, TEMPERATURE) - torch.tensor(turn.output_logprobs)).abs()
        print(f"GATE vLLM's v1 adapter vs the base weights: median |diff| {float(base.median()):.2e}")
        assert float(base.median()) > 1e-3

        # the negative case: a second step, and the server keeps the v1 adapter under the name of v2
        batch1 = group_batch(outcomes1, group_weight="tokens")
        (batch1["prox_logp"],) = actor.compute_logp([batch1])
        actor.ppo_update(actor.compute_advantages([batch1]))
        actor.step_lr_scheduler()
        r = httpx.post(server.url + "/v1/load_lora_adapter",
                       json={"lora_name": f"{NAME}-v2", "lora_path": meta.with_version(1).path}, timeout=120)
        assert r.status_code == 200, r.text
        actor.set_version(2)
        rollout.set_version(2)
        assert probe.after_update(real=True) == (1, 1)     # the probe names the stale adapter unchanged
        outcomes2 = asyncio.run(_lora_episodes(rollout, processor))
        batch2 = group_batch(outcomes2)
        total, count = sampler_gap([batch2], actor.compute_logp([batch2]), version=2)
        print(f"GATE on-policy sampler gap with v1's adapter served as v2: {total / count:.3f} "
              f"(threshold {BY_NAME['sampler_logprob_gap'].threshold})")
        assert count > 0 and total / count > 100 * BY_NAME["sampler_logprob_gap"].threshold
    finally:
        rollout.destroy()
        actor.destroy()
        if server is not None:
            server.stop()


async def _lora_episodes(rollout, processor):
    """The gate's two-turn episodes, sampled with the adapter the rollout engine's version names."""
    return await gates.play_episodes(rollout, processor, TEMPERATURE, lora_name=NAME)
