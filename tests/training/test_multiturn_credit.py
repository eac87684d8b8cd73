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

import pytest
import torch
from areal.trainer.ppo.actor import PPOActor
from areal.utils.data import concat_padded_tensors

from cua_rl.run.launch import load_config
from cua_rl.policy.records import Turn
from cua_rl.trajectory import EpisodeOutcome, group_batch

PROMPT, OUTPUT = 10, 40


def _episode(turns: int, reward: float) -> EpisodeOutcome:
    turn = Turn(prompt_ids=[1] * PROMPT, output_ids=[2] * OUTPUT, output_logprobs=[-0.5] * OUTPUT,
                output_versions=[0] * OUTPUT)
    return EpisodeOutcome(turns=[turn] * turns, reward=reward)


GROUPS = [[_episode(3, 1.0)] + [_episode(20, 0.0)] * 3] + [[_episode(20, 0.0)] * 4] * 3


def _pulls(actor_config, equal_episode_weight: bool = True) -> list[list[float]]:
    """Each episode's summed advantage over its trained tokens, as AReaL's actor computes it, per group."""
    batches = [group_batch(g, equal_episode_weight=equal_episode_weight) for g in GROUPS]
    data = concat_padded_tensors(batches)
    out = PPOActor(actor_config, engine=None)._compute_advantages(data)
    per_row = (out["advantages"] * out["loss_mask"]).sum(-1).tolist()
    pulls, row = [], 0
    for group in GROUPS:
        pulls.append([])
        for episode in group:
            pulls[-1].append(sum(per_row[row:row + len(episode.turns)]))
            row += len(episode.turns)
    return pulls


@pytest.fixture(scope="module")
def actor_config(tmp_path_factory):
    import os

    os.environ.setdefault("CUA_RL_FILEROOT", str(tmp_path_factory.mktemp("fileroot")))
    return load_config("examples/cua_agent/config.yaml", []).actor


def test_all_fail_groups_get_nothing_and_every_episode_weighs_the_same(actor_config):
    pulls = _pulls(actor_config)
    for group in pulls[1:]:
        assert group == [0.0] * 4, pulls
    success, *failures = pulls[0]
    assert success > 0 and all(f < 0 for f in failures)
    assert failures == pytest.approx([failures[0]] * 3)
    assert success == pytest.approx(-sum(failures), rel=1e-4)   # the success pulls as hard as its 3 siblings


def test_batch_recentring_or_token_weighting_switched_back_on_breaks_it(actor_config):
    from dataclasses import replace

    # the old defaults: a batch mean over tokens, rows weighted by their tokens (the weighting alone would
    # balance each group's tokens and so zero the batch mean: the two are tested together)
    recentred = replace(actor_config, adv_norm=replace(actor_config.adv_norm, mean_level="batch"))
    pulls = _pulls(recentred, equal_episode_weight=False)
    assert all(p > 0 for group in pulls[1:] for p in group), "a batch mean must push all-fail tokens up"
    success, *failures = _pulls(actor_config, equal_episode_weight=False)[0]
    assert -failures[0] > 2 * success / 3, "token weighting must let each long failure outweigh its share"
