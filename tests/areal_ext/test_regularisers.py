"""The entropy term (cua_rl/areal_ext/entropy_bonus.py) through AReaL's own loss function, and the KL penalty's
reference model that the config gives a run (``reference_model``). The run that trains with both and shows their
statistics: tests/e2e/test_health_stop.py (the weight-update run)."""

import types

import pytest
import torch
from areal.trainer.ppo import actor as areal_actor
from areal.utils import stats_tracker
from areal.utils.functional import gather_logprobs_entropy

from cua_rl.areal_ext import entropy_bonus
from cua_rl.run.launch import ConfigError, load_config

TOKENS, VOCAB = 12, 7


def _step(loss_fn, logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, lr: float = 5.0):
    """One loss and SGD step on ``logits`` (the 'model'); the loss and the masked mean entropy before the step."""
    logits = logits.clone().requires_grad_(True)
    logprobs, entropy = gather_logprobs_entropy(logits, labels)
    data = {"logprobs": logprobs.detach().clone(), "advantages": torch.zeros(TOKENS), "loss_mask": mask,
            "prox_logp": logprobs.detach().clone()}
    with stats_tracker.scope("update"):
        loss = loss_fn(logprobs, entropy, data, eps_clip=0.2, eps_clip_higher=None, c_clip=None)
    loss.backward()
    with torch.no_grad():
        after = logits - lr * logits.grad
    return loss.detach(), after


def _entropy(logits, labels, mask) -> float:
    _, entropy = gather_logprobs_entropy(logits, labels)
    return float((entropy * mask).sum() / mask.sum())


def test_the_entropy_term_raises_the_entropy_of_trained_tokens_only_and_is_in_the_statistics():
    torch.manual_seed(0)
    logits = torch.randn(TOKENS, VOCAB) * 3
    labels = torch.randint(0, VOCAB, (TOKENS,))
    mask = torch.tensor([0, 0, 0] + [1] * 6 + [0, 0, 0], dtype=torch.bool)
    coef = 0.2
    stats_tracker.export()   # start from empty statistics

    # zero advantages: AReaL's loss alone has no gradient (the negative case)
    plain_loss, plain_after = _step(areal_actor.grpo_loss_fn, logits, labels, mask)
    assert torch.allclose(plain_after, logits) and "update/entropy_bonus/avg" not in stats_tracker.export()

    bonus_loss, after = _step(entropy_bonus.with_entropy_bonus(areal_actor.grpo_loss_fn, coef), logits, labels, mask)
    before = _entropy(logits, labels, mask)
    assert float(bonus_loss - plain_loss) == pytest.approx(-coef * before, rel=1e-5)
    assert _entropy(after, labels, mask) > before + 1e-3
    assert torch.allclose(after[~mask], logits[~mask]), "untrained tokens moved"
    assert stats_tracker.export()["update/entropy_bonus/avg"] == pytest.approx(coef * before, rel=1e-5)


def test_enable_wraps_arealls_loss_once_from_the_environment_and_refuses_bad_values(monkeypatch):
    original = areal_actor.grpo_loss_fn
    monkeypatch.setattr(areal_actor, "grpo_loss_fn", original)   # restored after the test
    assert entropy_bonus.enable({}) is False and areal_actor.grpo_loss_fn is original
    assert entropy_bonus.enable({entropy_bonus.ENV: "0.0"}) is False and areal_actor.grpo_loss_fn is original
    assert entropy_bonus.enable({entropy_bonus.ENV: "0.01"}) is True
    wrapped = areal_actor.grpo_loss_fn
    assert wrapped is not original and wrapped.__wrapped__ is original
    entropy_bonus.enable({entropy_bonus.ENV: "0.01"})
    assert areal_actor.grpo_loss_fn is wrapped, "wrapped twice"
    for bad in ("-1", "nan", "lots"):
        with pytest.raises(ValueError, match=entropy_bonus.ENV):
            entropy_bonus.coefficient({entropy_bonus.ENV: bad})


def test_a_kl_penalty_gets_the_actors_starting_weights_as_its_reference(tmp_path, monkeypatch):
    monkeypatch.setenv("CUA_RL_FILEROOT", str(tmp_path))
    config_file = "examples/cua_agent/config.cpu.yaml"
    plain = load_config(config_file, [])
    assert plain.ref is None and plain.entropy_bonus == 0.0
    config = load_config(config_file, ["actor.kl_ctl=0.05", "trajectory.group_weight=tokens", "entropy_bonus=0.01"])
    ref, actor = config.ref, config.actor
    assert (ref.path, ref.backend, ref.dtype, ref.attn_impl) == (actor.path, actor.backend, actor.dtype, actor.attn_impl)
    assert [s.cmd for s in ref.scheduling_spec] == [s.cmd for s in actor.scheduling_spec] == \
        ["python3 -m cua_rl.areal_ext.worker"]
    # in the actor's own (patched) workers, not a fork running AReaL's stock worker (issue 59 item 4)
    strategy = ref.scheduling_strategy
    assert (strategy.type, strategy.target, strategy.fork) == ("colocation", "actor", False)
    assert ref.optimizer is None and actor.optimizer is not None and config.entropy_bonus == 0.01
    for bad, match in (("entropy_bonus=-0.1", "entropy_bonus must be"), ("actor.kl_ctl=-1", "kl_ctl must be")):
        with pytest.raises(ConfigError, match=match):
            load_config(config_file, [bad])


def test_use_lora_is_one_switch_and_keeps_adapters_off_the_vision_tower(tmp_path, monkeypatch):
    """``actor.use_lora`` wires the rollout side, vLLM's adapter support and the adapter's name (AReaL asks for
    each in its own section); modules vLLM would leave unadapted (the vision tower's) are refused at load. The
    runs with LoRA on (adapters loaded into vLLM each step, the sampler gap): docs/policy-and-training.md."""
    from cua_rl.areal_ext import lora_vlm

    monkeypatch.setenv("CUA_RL_FILEROOT", str(tmp_path))
    config_file = "examples/cua_agent/config.cpu.yaml"
    plain = load_config(config_file, [])
    assert not (plain.actor.use_lora or plain.rollout.use_lora or plain.vllm.enable_lora)
    config = load_config(config_file, ["actor.use_lora=true", "actor.lora_rank=32"])
    assert config.actor.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert config.rollout.use_lora and config.vllm.enable_lora and config.vllm.max_lora_rank == 32
    assert config.rollout.lora_name == config.gconfig.lora_name == config.eval_gconfig.lora_name != ""
    with pytest.raises(ConfigError, match="vision tower"):
        load_config(config_file, ["actor.use_lora=true", "actor.target_modules=[q_proj,qkv]"])
    # the engine's M-RoPE call through PEFT's wrapper reaches the inner model (lora_vlm.py)
    import transformers

    outer = transformers.Qwen3VLForConditionalGeneration
    assert lora_vlm.enable({}) == [] and lora_vlm.enable({lora_vlm.ENV: "0"}) == []   # without LoRA: nothing
    lora_vlm.enable({lora_vlm.ENV: "1"})
    assert outer.compute_3d_position_ids is lora_vlm._delegate
    inner = type("Inner", (), {"compute_3d_position_ids": lambda self, **kw: ("inner", kw)})()
    assert lora_vlm._delegate(type("Outer", (), {"model": inner})(), input_ids=1) == ("inner", {"input_ids": 1})
    # the weight probe reads the adapter of the version served, not the base model an adapter leaves alone
    from cua_rl.trainer import trainer as train, weight_probe

    asked = []
    monkeypatch.setattr(weight_probe, "fingerprint", lambda addr, model=None: asked.append((addr, model)))
    trainer = types.SimpleNamespace(rollout=types.SimpleNamespace(get_version=lambda: 3))
    train.Trainer._probe_of(trainer, config)("h:1")
    assert train.Trainer._probe_of(trainer, plain) is train.fingerprint
    assert asked == [("h:1", f"{config.gconfig.lora_name}-v3")]


def test_a_train_engine_other_than_fsdp_is_refused(tmp_path, monkeypatch):
    """The rows' images are palette codes that only the FSDP engine's patch decodes (compact_images.py): another
    engine would read the codes as pixel values, so the config refuses it instead of training on them."""
    monkeypatch.setenv("CUA_RL_FILEROOT", str(tmp_path))
    assert load_config("examples/cua_agent/config.cpu.yaml", []).actor.backend.startswith("fsdp")
    with pytest.raises(ConfigError, match="FSDP engine"):
        load_config("examples/cua_agent/config.cpu.yaml", ["actor.backend=megatron:d1"])
