"""The run's health checks (cua_rl/trainer/health.py) on step statistics shaped as AReaL exports them:
a healthy step trips nothing, each garbage case trips its invariant with the default action, consecutive-step
rules and overrides hold, and the watch between steps stops a run whose every episode is lost. The statistics
of a healthy step are those of a real CPU run's step (the learning gate's), plus the workflow's indicators."""

import time

import pytest

from cua_rl.trainer.health import BY_NAME, INVARIANTS, STOP_MARK, Health, HealthConfig, StallWatch, log_stop

HEALTHY = {"rollout/reward": 0.875, "rollout/task_success": 0.875, "rollout/num_turns": 1.0,
           "rollout/no_policy_turn": 0.0, "rollout/at_max_turns": 1.0, "rollout/unproved_vllm_turns": 0.0,
           "rollout/episode_lost": 0.0, "rollout/zero_reward_variance": 0.5,
           "rollout/truncated_turns": 0.0, "ppo_actor/update/version_stats/sample_staleness_theta_max": 1.0,
           "sampler_logprob_gap": 0.0012}


def _health(**config) -> Health:
    return Health(HealthConfig(**config), max_turns=1, max_head_offpolicyness=1)


def _names(findings) -> dict[str, str]:
    return {f.invariant.name: f.action for f in findings}


def test_a_healthy_step_trips_nothing_and_lands_in_the_statistics():
    health, stats = _health(), dict(HEALTHY)
    for step in range(1, 6):
        assert health.observe(step, stats) == []
    assert stats["health/no_policy_turn_share"] == 0.0 and stats["health/anomalies"] == 0.0
    assert "health/at_max_turns_share" not in stats   # one-turn episodes always end at max_turns


@pytest.mark.parametrize("key,value,name", [
    ("rollout/no_policy_turn", 1.0, "no_policy_turn_share"),
    ("rollout/unproved_vllm_turns", 1.0, "unproved_vllm_turns"),
])
def test_garbage_stops_at_its_first_step(key, value, name):
    findings = _health().observe(1, {**HEALTHY, key: value})
    assert _names(findings) == {name: "stop"}
    line = findings[0].line()
    assert line.startswith(f"[cua-rl] health step 1: {name} ") and "Likely cause:" in line and "Check:" in line


def test_lost_episodes_stop_only_on_two_steps_in_a_row():
    health = _health()
    assert health.observe(1, {**HEALTHY, "rollout/episode_lost": 0.75}) == []      # one bad step: a restart
    assert health.observe(2, dict(HEALTHY)) == []
    assert health.observe(3, {**HEALTHY, "rollout/episode_lost": 0.75}) == []
    assert _names(health.observe(4, {**HEALTHY, "rollout/episode_lost": 0.6})) == {"infra_lost_share": "stop"}


def test_a_sampler_that_serves_other_weights_is_warned_about():
    # the values of a provoked run whose vLLM ignored every update (bench/health_bench.py stale_weights)
    health = _health()
    assert health.observe(3, {**HEALTHY, "sampler_logprob_gap": 0.0083}) == []
    assert _names(health.observe(4, {**HEALTHY, "sampler_logprob_gap": 0.055})) == {"sampler_logprob_gap": "warn"}


def test_the_sampler_gap_compares_each_trained_token_with_the_engine_logprob_it_was_sampled_with():
    import torch

    from cua_rl.areal_ext.trainer_logprobs import sampler_gap

    # 2 prompt tokens, 3 output tokens; the engine's logprobs sit at each token's position, AReaL's logp[t]
    # scores token t + 1 (so the trainer's value of token j is logp[j - 1])
    row = {"loss_mask": torch.tensor([[0, 0, 1, 1, 1]]), "logprobs": torch.tensor([[0.0, 0.0, -1.0, -2.0, -0.5]])}
    same = torch.tensor([[0.0, -1.0, -2.0, -0.5, 0.0]])
    assert sampler_gap([row], [same]) == (0.0, 3)
    total, count = sampler_gap([row], [same - 0.3])
    assert count == 3 and abs(total / count - 0.3) < 1e-6
    shifted = torch.roll(same, 1, dims=-1)   # off by one token: the gap shows it
    assert sampler_gap([row], [shifted])[0] / 3 > 0.5
    assert sampler_gap([{"loss_mask": row["loss_mask"]}], [same]) == (0.0, 0)   # no engine logprobs: skipped
    # only tokens sampled at the trainer's version count: older ones also differ by the updates since
    mixed = {**row, "versions": torch.tensor([[-1, -1, 2, 3, 3]])}
    total, count = sampler_gap([mixed], [same - 0.3], version=3)
    assert count == 2 and abs(total / count - 0.3) < 1e-6
    assert sampler_gap([mixed], [same], version=4) == (0.0, 0)


def test_warnings_and_their_thresholds():
    health = Health(HealthConfig(), max_turns=5, max_head_offpolicyness=1)
    stats = {**HEALTHY, "rollout/at_max_turns": 0.5, "rollout/truncated_turns": 0.75,
             "ppo_actor/update/version_stats/sample_staleness_theta_max": 3.0}
    assert _names(health.observe(1, stats)) == {"truncated_output_share": "warn", "staleness": "warn"}
    # all at max_turns and no reward contrast: warned from the third step in a row on
    stuck = {**HEALTHY, "rollout/at_max_turns": 1.0, "rollout/zero_reward_variance": 1.0}
    assert health.observe(2, dict(stuck)) == [] and health.observe(3, dict(stuck)) == []
    assert _names(health.observe(4, dict(stuck))) == {"at_max_turns_share": "warn",
                                                      "zero_variance_group_share": "warn"}


def test_success_stuck_at_zero_or_one_warns_after_ten_steps():
    health = _health()
    for step in range(1, 10):
        assert health.observe(step, {**HEALTHY, "rollout/task_success": float(step % 2)}) == []
    assert _names(health.observe(10, {**HEALTHY, "rollout/task_success": 0.0})) == {"success_stuck_steps": "warn"}
    assert health.observe(11, dict(HEALTHY)) == []   # 0.875: the streak ends


def test_on_anomaly_and_thresholds_override_the_defaults():
    stats = {**HEALTHY, "rollout/no_policy_turn": 1.0, "rollout/truncated_turns": 0.75}
    assert _names(_health(on_anomaly="warn").observe(1, dict(stats))) == {"no_policy_turn_share": "warn",
                                                                          "truncated_output_share": "warn"}
    assert _names(_health(on_anomaly="stop").observe(1, dict(stats))) == {"no_policy_turn_share": "stop",
                                                                          "truncated_output_share": "stop"}
    assert _names(_health(thresholds={"truncated_output_share": 0.9}).observe(1, dict(stats))) == \
        {"no_policy_turn_share": "stop"}


def test_an_agent_on_another_model_is_not_held_to_policy_turns():
    health = Health(HealthConfig(), max_turns=1, max_head_offpolicyness=1, policy_endpoint=False)
    assert health.observe(1, {**HEALTHY, "rollout/no_policy_turn": 1.0}) == []


def test_bad_settings_are_refused_at_load():
    with pytest.raises(ValueError, match="on_anomaly"):
        HealthConfig(on_anomaly="ignore")
    with pytest.raises(ValueError, match="unknown invariants"):
        HealthConfig(thresholds={"no_policy_turns": 0.1})
    assert len(BY_NAME) == len(INVARIANTS)


def test_the_watch_between_steps_stops_a_run_whose_every_episode_is_lost():
    counts = {"episodes_evaluated": 16, "episodes_lost": 0}
    stopped = []
    watch = StallWatch("/nonexistent", _health(), episodes_per_step=4, stall_s=0.0, on_stop=lambda: stopped.append(1),
                       read=lambda _logs: dict(counts))
    watch.step_done(3)
    counts.update(episodes_lost=7, episodes_lost_model_server=7)
    assert watch.check() is None                       # 7 < two steps' worth (8)
    counts.update(episodes_evaluated=17, episodes_lost=12, episodes_lost_model_server=12)
    assert watch.check() is None                       # an episode was evaluated: the run moves
    counts.update(episodes_lost=20, episodes_lost_model_server=20)
    finding = watch.check()
    assert finding is not None and finding.invariant.name == "infra_lost_share" and finding.action == "stop"
    assert finding.step == 4 and "8 episodes lost (model server 8)" in finding.note, finding.note
    slow = StallWatch("/nonexistent", _health(), episodes_per_step=4, stall_s=3600.0, read=lambda _logs: dict(counts))
    counts.update(episodes_lost=40, episodes_lost_model_server=40)
    assert slow.check() is None                        # lost, but not for long: a dead vLLM is the model watch's


def test_the_watch_between_steps_stops_a_run_in_which_nothing_ends():
    """A model server that hangs (vLLM's multimodal cache desync once hung its engine in CI: no request failed,
    no episode ended, and AReaL's pause for the weight update waited 600 s): no group ends at all. Evaluation
    groups count as progress too (``read_all``: every kind)."""
    train = {"episodes_evaluated": 16, "episodes_lost": 2}
    every = dict(train)
    watch = StallWatch("/nonexistent", _health(thresholds={"idle_seconds": 0.3}), episodes_per_step=4,
                       read=lambda _logs: dict(train), read_all=lambda _logs: dict(every))
    watch.step_done(5)
    assert watch.check() is None
    time.sleep(0.4)
    finding = watch.check()
    assert finding is not None and (finding.invariant.name, finding.action, finding.step) == ("idle_seconds", "stop", 6)
    assert finding.value > 0.3 and "no episode evaluated or lost for" in finding.note
    every["episodes_evaluated"] += 8                   # an evaluation group ended: the run moves
    assert watch.check() is None
    time.sleep(0.4)
    assert watch.check() is not None
    watch.step_done(6)                                 # a step ended: the clock starts again
    assert watch.check() is None
    assert _health().thresholds["idle_seconds"] == 1800.0


def test_the_summary_names_a_health_stop_as_the_cause(tmp_path, caplog):
    from cua_rl.run.summary import failure_cause

    finding = _health().observe(2, {**HEALTHY, "rollout/no_policy_turn": 1.0})[0]
    with caplog.at_level("ERROR"):
        log_stop(2, [finding])
    (tmp_path / "train.log").write_text(f"noise\n{finding.line()}\n{caplog.records[0].getMessage()}\nmore\n")
    cause = failure_cause(tmp_path / "train.log")
    assert STOP_MARK in caplog.text
    assert cause.startswith("a health check stopped the run: no_policy_turn_share 1 (threshold 0.5)"), cause


def test_a_step_of_rounding_noise_is_not_probed_for_unchanged_weights():
    """``weights_unchanged`` compares the canary only across real updates (cua_rl/trainer/weight_probe.py
    ``real_update``): with SGD the step is the learning rate times the clipped gradient norm, so the grad norm
    of 4.7e-8 a near-deterministic policy gave (a shuffled-reward control's step 14, 2026-11-29: a step of 2e-9
    the canary cannot show, which stopped that healthy run) is not one; the CPU recipe's usual step is; Adam's
    step is about the learning rate whatever the gradient, so any gradient counts; no step, no probe."""
    from cua_rl.trainer.weight_probe import MIN_SGD_STEP, real_update

    def step(grad, lr=0.05, ok=1.0):
        return {"ppo_actor/update/grad_norm": grad, "ppo_actor/update/lr": lr,
                "ppo_actor/update/update_successful": ok}

    assert not real_update(step(4.7e-8), "sgd", 0.5)
    assert real_update(step(0.2), "sgd", 0.5) and real_update(step(50.0), "sgd", 0.5)   # clipped to 0.5: still real
    assert real_update(step(4.7e-8), "adam", 1.0)
    assert not real_update(step(MIN_SGD_STEP / 0.05 / 2), "sgd", None)
    assert not real_update(step(0.0), "adam") and not real_update(step(0.2, lr=0.0), "sgd", 0.5)
    assert not real_update(step(0.2, ok=0.0), "sgd", 0.5) and not real_update(step(float("nan")), "adam")
