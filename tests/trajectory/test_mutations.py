"""The learning bench's mutations (cua_rl/trajectory/mutations.py, ``trajectory.mutation``): each switches on
the defect it names, checked here on constructed batches through AReaL's own actor code and on the config, so a bench run that passes the gate with one on means the gate is blind to it, not that
the mutation did nothing. The runs themselves (``python bench/learning_bench.py --recipe multiturn
--mutations all``) are the bench's; docs/learning.md has what they scored."""

import pytest
import torch

import credit_cases
from credit_cases import GROUPS, episode_pulls
from cua_rl.run.launch import ConfigError, load_config
from cua_rl.trajectory import group_batch, mutations


def _batch():
    return group_batch(GROUPS[0])


def test_negated_advantages_push_the_success_down_through_the_actor(actor_config, shipped, monkeypatch):
    batch = _batch()
    flipped = mutations.mutate(batch, "negate_advantages")
    assert torch.equal(flipped["rewards"], -batch["rewards"]) and torch.equal(flipped["loss_mask"], batch["loss_mask"])
    monkeypatch.setattr(credit_cases, "group_batch",
                        lambda g, **kw: mutations.mutate(group_batch(g, **kw), "negate_advantages"))
    success, *failures = episode_pulls(actor_config, shipped.trajectory)[0]
    assert success < 0 and all(f > 0 for f in failures)


def test_the_shifted_loss_mask_trains_one_token_late_and_never_the_padding():
    batch = _batch()
    shifted = mutations.mutate(batch, "shift_loss_mask")["loss_mask"]
    mask, attention = batch["loss_mask"], batch["attention_mask"]
    assert not torch.equal(shifted, mask)
    for row in range(mask.shape[0]):
        first = int(mask[row].nonzero()[0])
        assert shifted[row, first] == 0 and shifted[row, first + 1] == 1       # the first sampled token untrained
        n = int(attention[row].sum())
        expected = torch.cat([torch.zeros(1, dtype=mask.dtype), mask[row, :-1]])[:n]
        assert torch.equal(shifted[row, :n], expected) and int(shifted[row, n:].sum()) == 0


def test_the_other_mutations_leave_the_rows_alone():
    batch = _batch()
    for name in ("", "batch_recentring"):
        assert mutations.mutate(batch, name) is batch


def test_the_config_names_its_mutations_and_batch_recentring_switches_issue_33a_back_on(tmp_path, monkeypatch):
    monkeypatch.setenv("CUA_RL_FILEROOT", str(tmp_path))
    config = "examples/cua_agent/config.multiturn.yaml"
    assert load_config(config, []).actor.adv_norm.mean_level is None
    with pytest.raises(ConfigError, match="actor.adv_norm.mean_level must be null"):
        load_config(config, ["actor.adv_norm.mean_level=batch"])
    assert load_config(config, ["trajectory.mutation=batch_recentring"]).actor.adv_norm.mean_level == "batch"
    with pytest.raises(ConfigError, match="trajectory.mutation must be one of"):
        load_config(config, ["trajectory.mutation=flip"])
