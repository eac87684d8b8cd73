"""Turn records -> AReaL rows and GRPO groups (pure tensor logic; no services needed)."""

from dataclasses import replace

import pytest
import torch
from areal.utils.data import concat_padded_tensors

from cua_rl.policy.records import Turn
from cua_rl.trajectory import (
    EpisodeOutcome,
    ScreenshotSwap,
    concat_row,
    episode_rows,
    episode_weights,
    group_batch,
    is_prefix_chain,
    normalise_group,
    rows_of,
    shuffle_rewards,
    turn_rewards,
    turn_row,
)


def _turn(prompt, out, version=0, images=0, mm=True):
    mmi = None
    if images:
        mmi = {"pixel_values": torch.arange(images * 8, dtype=torch.float32).reshape(images * 2, 4),
               "image_grid_thw": torch.tensor([[1, 1, 2]] * images)}
    return Turn(prompt_ids=list(prompt), output_ids=list(out),
                output_logprobs=[-0.1 * (i + 1) for i in range(len(out))],
                output_versions=[version] * len(out),
                prompt_mm_token_type_ids=[0] * len(prompt) if mm else None,
                multi_modal_input=mmi, n_images=images)


def test_turn_row_masks_prompt_and_keeps_engine_values():
    t = _turn([1, 2, 3], [7, 8], version=3, images=1)
    row = turn_row(t, 0.5)
    assert row["input_ids"].tolist() == [[1, 2, 3, 7, 8]]
    assert row["loss_mask"].tolist() == [[0, 0, 0, 1, 1]]
    assert row["logprobs"][0, 3:].tolist() == pytest.approx([-0.1, -0.2])
    assert row["logprobs"][0, :3].tolist() == [0.0, 0.0, 0.0]
    assert row["versions"].tolist() == [[-1, -1, -1, 3, 3]]
    assert row["mm_token_type_ids"].shape == (1, 5)
    assert row["rewards"].tolist() == [0.5]
    assert row["multi_modal_input"][0]["pixel_values"] is t.multi_modal_input["pixel_values"]
    assert row["input_ids"].dtype == torch.long and row["attention_mask"].dtype == torch.bool


def test_text_only_row_has_same_keys_and_empty_mm_dict():
    row = turn_row(_turn([1, 2], [3]), 1.0)
    assert row["multi_modal_input"] == [{}]
    img = turn_row(_turn([1, 2], [3], images=1), 1.0)
    assert set(row) == set(img)
    merged = concat_padded_tensors([row, img])
    assert len(merged["multi_modal_input"]) == 2 and merged["input_ids"].shape == (2, 3)


def test_turn_rejects_misaligned_lengths():
    with pytest.raises(ValueError):
        Turn(prompt_ids=[1], output_ids=[2, 3], output_logprobs=[-1.0], output_versions=[0, 0])


def test_prefix_chain_concat_trains_every_completion_once():
    t1 = _turn([1, 2], [3, 4], version=0)
    t2 = _turn([1, 2, 3, 4, 5], [6], version=1)
    assert is_prefix_chain([t1, t2])
    row = concat_row([t1, t2], 1.0)
    assert row["input_ids"].tolist() == [[1, 2, 3, 4, 5, 6]]
    assert row["loss_mask"].tolist() == [[0, 0, 1, 1, 0, 1]]
    assert row["versions"].tolist() == [[-1, -1, 0, 0, -1, 1]]
    assert row["logprobs"][0].tolist() == pytest.approx([0, 0, -0.1, -0.2, 0, -0.1])
    assert rows_of([t1, t2], "concat") == 1 and rows_of([t1, t2], "individual") == 2 and rows_of([], "concat") == 0


def test_concat_falls_back_when_history_was_edited():
    t1 = _turn([1, 2], [3, 4])
    t2 = _turn([1, 9, 3, 4, 5], [6])  # the second prompt re-rendered an earlier token
    assert not is_prefix_chain([t1, t2])
    rows = episode_rows([t1, t2], 1.0, style="concat")
    assert len(rows) == 2 == rows_of([t1, t2], "concat")
    with pytest.raises(ValueError):
        concat_row([t1, t2], 1.0)


def test_turn_discount():
    assert turn_rewards(1.0, 3, 0.5) == [0.25, 0.5, 1.0]
    assert turn_rewards(0.8, 2) == [0.8, 0.8]
    with pytest.raises(ValueError):
        turn_rewards(1.0, 2, 0.0)
    rows = episode_rows([_turn([1], [2]), _turn([1, 2], [3])], 1.0, discount=0.9)
    assert [r["rewards"].item() for r in rows] == pytest.approx([0.9, 1.0])


def test_bad_style_is_an_error():
    with pytest.raises(ValueError):
        episode_rows([_turn([1], [2])], 1.0, style="tree")


def test_normalise_group():
    assert normalise_group([1.0, 0.0]) == pytest.approx([0.7071, -0.7071], abs=1e-3)
    assert normalise_group([1.0, 0.0], scale_by_std=False) == [0.5, -0.5]
    assert normalise_group([0.3, 0.3, 0.3]) == [0.0, 0.0, 0.0]
    assert normalise_group([]) == []


def test_group_batch_copies_each_episodes_advantage_onto_its_rows():
    good = EpisodeOutcome(turns=[_turn([1, 2], [3], images=1), _turn([1, 2, 3, 4], [5, 6], images=2)], reward=1.0)
    bad = EpisodeOutcome(turns=[_turn([1, 2], [9], images=1)], reward=0.0)
    silent = EpisodeOutcome(turns=[], reward=0.0)  # evaluated, but the agent never called the model
    batch = group_batch([good, bad, silent], equal_episode_weight=False, group_weight="tokens")
    adv = normalise_group([1.0, 0.0, 0.0])
    assert batch["input_ids"].shape == (3, 6)
    assert batch["rewards"].tolist() == pytest.approx([adv[0], adv[0], adv[1]])
    assert len(batch["multi_modal_input"]) == 3
    assert batch["multi_modal_input"][1]["pixel_values"].shape[0] == 4
    # padding: attention mask zero beyond each row's length, loss mask never set on padding
    assert batch["attention_mask"][2].tolist() == [True] * 3 + [False] * 3
    assert batch["loss_mask"][2, 3:].sum() == 0


def test_every_episode_weighs_the_same_whatever_its_length():
    """Under a token-mean loss an episode pulls with (its value) x (its trained tokens): the weights make that
    product the same size for every episode of the group, and keep the group's total."""
    long_fail = EpisodeOutcome(turns=[_turn([1, 2], [9, 9, 9, 9])] * 5, reward=0.0)      # 20 output tokens
    short_win = EpisodeOutcome(turns=[_turn([1, 2], [3, 4])], reward=1.0)                # 2 output tokens
    weights = episode_weights([long_fail, short_win, EpisodeOutcome([], 0.0)])
    assert weights == pytest.approx([11 / 20, 11 / 2, 0.0])
    batch = group_batch([long_fail, short_win], group_weight="tokens")
    adv = normalise_group([0.0, 1.0])
    mask = batch["loss_mask"].float()
    pull = (batch["rewards"][:, None] * mask).sum(1)         # summed per row, then per episode
    fail_pull, win_pull = pull[:5].sum().item(), pull[5].item()
    assert fail_pull == pytest.approx(-win_pull) and win_pull == pytest.approx(adv[1] * 11)
    unweighted = group_batch([long_fail, short_win], equal_episode_weight=False, group_weight="tokens")
    pull = (unweighted["rewards"][:, None] * unweighted["loss_mask"].float()).sum(1)
    assert abs(pull[:5].sum().item()) == pytest.approx(10 * abs(pull[5].item()))   # 20 vs 2 tokens


def test_group_batch_raw_rewards_and_empty_groups():
    batch = group_batch([EpisodeOutcome([_turn([1], [2])], 0.25)], normalise=False, group_weight="tokens")
    assert batch["rewards"].tolist() == [0.25]
    assert group_batch([]) is None
    assert group_batch([EpisodeOutcome([], 1.0)]) is None


def test_shuffle_rewards_keeps_the_groups_rewards_and_loses_which_episode_earned_them():
    outcomes = [EpisodeOutcome([_turn([1], [2])], r, {"episode": i}) for i, r in enumerate([1.0, 0.0, 0.0, 0.0] * 4)]
    shuffled = shuffle_rewards(outcomes, "7:050:11:0")
    assert sorted(o.reward for o in shuffled) == sorted(o.reward for o in outcomes)
    assert [o.info["true_reward"] for o in shuffled] == [o.reward for o in outcomes]
    assert [o.turns for o in shuffled] == [o.turns for o in outcomes]
    assert [o.reward for o in shuffled] != [o.reward for o in outcomes]     # this key moves the rewards
    assert shuffle_rewards(outcomes, "7:050:11:0") == shuffled                # the same key, the same deal
    assert outcomes[0].reward == 1.0 and "true_reward" not in outcomes[0].info  # the input is untouched


def _shot(value: float, grid=(1, 2, 2)) -> dict:
    """One screenshot's processor output: 4 patches of 3 values, all ``value``."""
    return {"pixel_values": torch.full((4, 3), value), "image_grid_thw": torch.tensor([grid])}


def _two_shots(a: float, b: float) -> dict:
    return {"pixel_values": torch.cat([_shot(a)["pixel_values"], _shot(b)["pixel_values"]]),
            "image_grid_thw": torch.tensor([[1, 2, 2], [1, 2, 2]])}


def test_screenshot_swap_trains_each_group_on_screens_other_groups_showed():
    """The screenshots-shuffled control: tokens, actions and rewards stay; every screenshot becomes one an
    earlier group showed (the first group keeps its own); one screenshot maps to one stand-in in a group."""
    def episode(shots: list[dict], reward: float) -> EpisodeOutcome:
        turns = [replace(_turn([1, 2], [3]), multi_modal_input=mmi, n_images=len(mmi["image_grid_thw"]))
                 for mmi in shots]
        return EpisodeOutcome(turns, reward)

    def pixels(outcomes: list[EpisodeOutcome]) -> list:
        return [t.multi_modal_input and t.multi_modal_input["pixel_values"].tolist() for o in outcomes for t in o.turns]

    swap = ScreenshotSwap(seed=3)
    first = [episode([_shot(1.0), _two_shots(1.0, 2.0)], 1.0), episode([_shot(1.0)], 0.0)]
    assert pixels(swap(first)) == pixels(first)                   # nothing earlier to show: unchanged
    second = [episode([_shot(5.0), _two_shots(5.0, 6.0)], 0.0), episode([_shot(5.0)], 1.0)]
    out = swap(second)
    assert [o.reward for o in out] == [0.0, 1.0] and [len(o.turns) for o in out] == [2, 1]
    assert [t.prompt_ids + t.output_ids for o in out for t in o.turns] == [[1, 2, 3]] * 3
    values = [t.multi_modal_input["pixel_values"].view(-1, 4, 3)[:, 0, 0].tolist() for o in out for t in o.turns]
    assert all(v in (1.0, 2.0) for shots in values for v in shots), values   # only the first group's screens
    assert values[0][0] == values[1][0] == values[2][0]           # screenshot 5.0 -> one stand-in everywhere
    assert second[0].turns[0].multi_modal_input["pixel_values"][0, 0] == 5.0   # the input is untouched
    # a grid no earlier group showed keeps its own screenshot
    odd = [episode([_shot(9.0, grid=(1, 1, 4))], 1.0)]
    assert swap(odd)[0].turns[0].multi_modal_input["pixel_values"][0, 0] == 9.0
    # a text-only turn passes through
    plain = [EpisodeOutcome([_turn([1], [2])], 1.0)]
    assert swap(plain) == plain and pixels(plain) == [None]


def test_rows_name_each_output_tokens_monitor_turn_and_the_trainer_side_reads_them_back():
    """``monitor_turn`` marks every output token with its turn's key (individual and concat rows alike); the
    trainer side maps recomputed logprobs back to (rollout, turn), reading logp[t - 1] for token t."""
    from cua_rl.areal_ext.trainer_logprobs import records_of, turn_logprobs
    from cua_rl.trajectory.rows import new_rollout_uuid, turn_key, turn_of_key

    a = new_rollout_uuid()
    assert turn_of_key(turn_key(a, 7)) == (a, 7) and turn_key(a, 0) == 0 and turn_key("0" * 32, 1) == 0
    t1, t2 = _turn([1, 2], [5, 6]), _turn([1, 2, 5, 6, 9], [7])
    chain = [t1, t2]
    outcomes = [EpisodeOutcome(turns=chain, reward=1.0, monitor_uuid=a), EpisodeOutcome(turns=[t1], reward=0.0)]
    for style in ("individual", "concat"):
        batch = group_batch(outcomes, style=style)
        keys = batch["monitor_turn"]
        assert keys.shape == batch["input_ids"].shape
        assert bool(((keys > 0) <= batch["loss_mask"].bool()).all())   # only output tokens carry a key
        # a fake "trainer": logp[t] = 100 * row + t, so token t must come back as 100 * row + t - 1
        rows, length = keys.shape
        logp = torch.arange(length, dtype=torch.float32).repeat(rows, 1) + 100 * torch.arange(rows)[:, None]
        got = turn_logprobs([batch], [logp])
        assert set(got) == {turn_key(a, 1), turn_key(a, 2)}              # the unreported episode sends nothing
        if style == "individual":
            assert got[turn_key(a, 1)] == [1.0, 2.0] and got[turn_key(a, 2)] == [104.0]
        else:
            assert got[turn_key(a, 1)] == [1.0, 2.0] and got[turn_key(a, 2)] == [4.0]
        records = {r.client_id: r.fields for r in records_of(got, version=3)}
        assert records == {f"{a}:turn:1": {"trainer_logprobs": got[turn_key(a, 1)], "trainer_version": 3},
                           f"{a}:turn:2": {"trainer_logprobs": got[turn_key(a, 2)], "trainer_version": 3}}
    assert "monitor_turn" not in group_batch([EpisodeOutcome(turns=[t1], reward=1.0)])
