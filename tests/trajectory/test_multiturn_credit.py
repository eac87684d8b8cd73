"""Multi-turn credit through AReaL's own actor code (``PPOActor._compute_advantages``), on constructed batches:
the shape where failing episodes run to ``max_turns`` and a success ends early.

Four GRPO groups of four episodes, 40 output tokens a turn: group 0 has one 3-turn success and three 20-turn
failures, the other three groups fail throughout at 20 turns. With ``config.yaml``'s defaults:
- every token of an all-fail group has advantage 0 (a batch mean over tokens would be negative here and
  hand them a positive advantage: the first defect below);
- each episode pulls with its group advantage alone, whatever its length: the success pulls as hard as
  its three failing siblings together (a token-mean loss would let each 20-turn failure pull 20/3 times
  its share: the second defect).
Each defect switched back on is shown to break what the defaults hold, so this test can fail. (Equal
episode weights also zero the batch's token mean here, so the re-centring is shown with the old weighting.)
"""

from dataclasses import replace

import pytest
import torch
from areal.trainer.ppo.actor import PPOActor
from areal.utils.data import concat_padded_tensors

from credit_cases import GROUPS, OUTPUT, episode_of, episode_pulls
from cua_rl.run.launch import load_config
from cua_rl.trajectory import group_batch


def test_all_fail_groups_get_nothing_and_every_episode_weighs_the_same(actor_config, shipped):
    pulls = episode_pulls(actor_config, shipped.trajectory)
    for group in pulls[1:]:
        assert group == [0.0] * 4, pulls
    success, *failures = pulls[0]
    assert success > 0 and all(f < 0 for f in failures)
    assert failures == pytest.approx([failures[0]] * 3)
    assert success == pytest.approx(-sum(failures), rel=1e-4)   # the success pulls as hard as its 3 siblings


def test_batch_recentring_or_token_weighting_switched_back_on_breaks_it(actor_config, shipped):
    from dataclasses import replace

    # the old defaults: a batch mean over tokens, rows weighted by their tokens (the weighting alone would
    # balance each group's tokens and so zero the batch mean: the two are tested together)
    recentred = replace(actor_config, adv_norm=replace(actor_config.adv_norm, mean_level="batch"))
    pulls = episode_pulls(recentred, shipped.trajectory, equal_episode_weight=False)
    assert all(p > 0 for group in pulls[1:] for p in group), "a batch mean must push all-fail tokens up"
    success, *failures = episode_pulls(actor_config, shipped.trajectory, equal_episode_weight=False)[0]
    assert -failures[0] > 2 * success / 3, "token weighting must let each long failure outweigh its share"


# ---- issue 59, "right data on the GPU path": what AReaL's actor makes of the rows (items 1, 8, 10) -----------
def _advantaged(actor_config, batches):
    return PPOActor(actor_config, engine=None)._compute_advantages(concat_padded_tensors(batches))


def _group_pulls(out, sizes: list[int]) -> list[float]:
    """Each group's pull on the loss: the sum of |advantage| over its trained tokens (``sizes``: rows per group)."""
    per_row = (out["advantages"] * out["loss_mask"]).abs().sum(-1).tolist()
    pulls, row = [], 0
    for n in sizes:
        pulls.append(sum(per_row[row:row + n]))
        row += n
    return pulls


@pytest.mark.parametrize("n, carried", [(4, 22.875), (8, 43.62)])
def test_right_data_1_reward_clip_keeps_a_short_successs_weight(actor_config, n, carried):
    """AReaL clips ``rewards`` at +-``actor.reward_clip`` (its default 20) before anything else, and the
    equal-episode weights ride in ``rewards``. With AReaL's token weighting across groups
    (``trajectory.group_weight: tokens``, the learning recipes'), a 1-turn success among 20-turn failures carries
    22.9 at n=4 and 43.6 at n=8: config.yaml's actor must train it with exactly that, and the success must still
    pull as hard as its failing siblings together."""
    group = [episode_of(1, 1.0)] + [episode_of(20, 0.0)] * (n - 1)
    out = _advantaged(actor_config, [group_batch(group, group_weight="tokens")])
    success = out["returns"][0][out["loss_mask"][0].bool()]          # GAE before adv_norm: the reward trained
    assert success.tolist() == pytest.approx([carried] * OUTPUT, rel=1e-3)
    pulls = (out["advantages"] * out["loss_mask"]).sum(-1).tolist()
    assert pulls[0] == pytest.approx(-sum(pulls[1:]), rel=1e-4)


def test_right_data_1_a_clip_the_values_could_reach_is_refused(actor_config):
    from cua_rl.run.launch import ConfigError

    with pytest.raises(ConfigError, match=r"actor.reward_clip \(20\) could clip .* reaches 23040"):
        load_config("examples/cua_agent/config.yaml", ["++actor.reward_clip=20", "trajectory.group_weight=tokens"])


def test_right_data_8_reward_norm_is_refused_it_would_cut_across_episodes(actor_config):
    """A user who copies AReaL's GRPO example (``reward_norm: {mean_level: group, group_size: n}``) would
    normalise the workflow's values again in blocks of n rows; a row here is a turn, so the blocks cross
    episodes: shown on our rows with AReaL's own ``Normalization``, then refused at load."""
    from areal.utils.data import Normalization, NormConfig

    batch = group_batch(GROUPS[0])                                   # a 3-turn success, three 20-turn failures
    assert len(set(batch["rewards"][3:23].tolist())) == 1             # one episode, one value on all its rows
    again = Normalization(NormConfig(mean_level="group", std_level="group", group_size=4))(batch["rewards"])
    assert len(set(again[3:23].tolist())) > 1, "AReaL's group blocks no longer cut across episodes"
    from cua_rl.run.launch import ConfigError

    for norm in ("{mean_level:group,std_level:group,group_size:4}", "{mean_level:batch,std_level:batch}"):
        with pytest.raises(ConfigError, match="actor.reward_norm"):
            load_config("examples/cua_agent/config.yaml", [f"actor.reward_norm={norm}"])


def test_right_data_10_a_short_and_a_long_tasks_groups_pull_alike(actor_config, shipped):
    """Under AReaL's global token-mean loss a group pulls in proportion to its mean trained tokens: a 20-turn
    task's group 10x a 2-turn task's in one batch. config.yaml's ``trajectory`` (``group_weight: equal``) makes
    the two pull the same through AReaL's actor; ``tokens`` keeps AReaL's weighting (10x)."""
    trajectory = shipped.trajectory
    short = [episode_of(2, 1.0)] + [episode_of(2, 0.0)] * 3
    long = [episode_of(20, 1.0)] + [episode_of(20, 0.0)] * 3
    sizes = [2 * 4, 20 * 4]
    ours = _group_pulls(_advantaged(actor_config, [group_batch(g, **trajectory.group_options())
                                                      for g in (short, long)]), sizes)
    assert ours[1] == pytest.approx(ours[0], rel=1e-4), ours
    tokens = _group_pulls(_advantaged(actor_config, [group_batch(g, **{**trajectory.group_options(),
                                                                        "group_weight": "tokens"})
                                                     for g in (short, long)]), sizes)
    assert tokens[1] == pytest.approx(10 * tokens[0], rel=1e-4), tokens


# ---- issue 83 item 1: a KL penalty keeps its weight against the task whatever group_weight is -----------------
KL_CTL, KL_PER_TOKEN = 0.05, 0.01   # the review's figures: kl_ctl 0.05, 0.01 nats per token against the reference


def _task_and_kl(actor, trajectory, group) -> tuple[list[float], list[float]]:
    """Each episode's return summed over its trained tokens (GAE before adv_norm: what the update follows), as
    AReaL's actor computes it with a reference ``KL_PER_TOKEN`` nats below the behaviour policy on every token
    (``ref_logp``, AReaL's name): (the task's part, the KL penalty's part), per episode."""
    def returns(with_kl: bool) -> list[float]:
        batch = group_batch(group, **trajectory.group_options())
        behaviour = torch.roll(batch["logprobs"], shifts=-1, dims=-1)   # AReaL's old_logp, aligned as ref_logp is
        batch["ref_logp"] = behaviour - (KL_PER_TOKEN if with_kl else 0.0)
        out = PPOActor(replace(actor, kl_ctl=KL_CTL), engine=None)._compute_advantages(batch)
        per_row = (out["returns"] * out["loss_mask"]).sum(-1).tolist()
        sums, row = [], 0
        for episode in group:
            sums.append(sum(per_row[row:row + len(episode.turns)]))
            row += len(episode.turns)
        return sums

    task, total = returns(False), returns(True)
    return task, [t - k for t, k in zip(total, task)]


@pytest.mark.parametrize("recipe", ["config.yaml", "config.1gpu.yaml", "config.multiturn.yaml", "config.learn.yaml"])
def test_right_credit_1_a_kl_penalty_weighs_against_the_task_as_under_token_weights(shipped, recipe):
    """AReaL adds ``-kl_ctl * KL`` to every token's reward with one scalar, while ``group_weight: equal`` divides
    each row's reward by its group's mean trained tokens (~1e-3 at 20 turns): the KL then outweighed the task
    (16.7x in the review) and turned a success's pull negative. So a KL penalty with ``equal`` is refused at load,
    naming both settings; every recipe a KL penalty loads on trains a success up, with the KL a small part of it
    (its share under AReaL's own weighting, ``tokens``)."""
    from cua_rl.run.launch import RECIPES, ConfigError

    group = [episode_of(20, 1.0)] + [episode_of(20, 0.0)] * 3
    task, kl = _task_and_kl(shipped.actor, replace(shipped.trajectory, group_weight="equal"), group)
    assert task[0] > 0 and task[0] + kl[0] < 0, "the defect this refusal is for: the KL flips a success under equal"
    overrides = [f"actor.kl_ctl={KL_CTL}"]
    config = None
    try:
        config = load_config(str(RECIPES / recipe), overrides)
    except ConfigError as refused:
        assert "actor.kl_ctl" in str(refused) and "trajectory.group_weight" in str(refused), str(refused)
        config = load_config(str(RECIPES / recipe), overrides + ["trajectory.group_weight=tokens"])
    task, kl = _task_and_kl(config.actor, config.trajectory, group)
    assert task[0] + kl[0] > 0, (f"{recipe} with actor.kl_ctl={KL_CTL} (group_weight "
                                 f"{config.trajectory.group_weight}) trains the success down: task {task[0]:.4g}, "
                                 f"KL {kl[0]:.4g}")
    assert all(t + k < 0 for t, k in zip(task[1:], kl[1:])), (task, kl)
    assert abs(kl[0]) < 0.05 * task[0], f"the KL is {abs(kl[0]) / task[0]:.3g}x the success's task part"
    assert config.actor.kl_ctl == KL_CTL and config.trajectory.group_weight == "tokens", recipe
