"""Tree groups' credit through AReaL's own actor code (``PPOActor._compute_advantages``), on a constructed tree
(cua_rl/trajectory/tree.py; docs/learning.md "Tree groups"), with the multi-turn recipe's actor and trajectory
(concat rows, equal group weights).

Two roots of one task instance; each played 2 turns (the shared prefix), then was forked at turn 3 into its own
continuation and two forked ones. Root A: its own continuation succeeds (1 turn), the forked ones fail (3 turns
and 1 turn). Root B: all three continuations fail. What the rows must say:
- one row per segment: the prefix's turns are trained once, in the prefix's row, and sit loss-masked at the start
  of each continuation's row (the row is the whole path: its prompt continues the prefix exactly);
- the prefix's value is the mean of its leaves (A 1/3, B 0), its advantage root against root;
- a continuation's advantage is its reward against its siblings' mean (its own root's three continuations only):
  B's continuations get nothing, though another root succeeded; A's success pulls as hard as its two failing
  siblings together, and the two failures pull alike whatever their lengths (equal weights per segment).
The same leaves trained as a plain GRPO group (each leaf a whole episode) break each of these: shown at the end,
so the test can fail.
"""

import pytest
import torch
from areal.trainer.ppo.actor import PPOActor

from cua_rl.policy.records import Turn
from cua_rl.run.launch import load_config
from cua_rl.trajectory import EpisodeOutcome, group_batch
from cua_rl.trajectory.tree import Segment, tree_rows, tree_trained_tokens, tree_values, value_of

OUTPUT = 6            # tokens per reply
_next_token = iter(range(1000, 100000))


def _chain(n: int, before: list[Turn] = ()) -> list[Turn]:
    """``n`` turns continuing ``before``: each prompt is the previous prompt and reply plus a new screen."""
    turns, path = [], (list(before[-1].prompt_ids) + list(before[-1].output_ids)) if before else [1, 2, 3]
    for _ in range(n):
        prompt = path + [next(_next_token) for _ in range(4)]
        output = [next(_next_token) for _ in range(OUTPUT)]
        turns.append(Turn(prompt_ids=prompt, output_ids=output, output_logprobs=[-0.5] * OUTPUT,
                          output_versions=[0] * OUTPUT))
        path = prompt + output
    return turns


def _root(rewards_and_turns: list[tuple[float, int]]) -> Segment:
    prefix = _chain(2)
    children = [Segment(turns=_chain(n, prefix), context=prefix, reward=r, first_turn=3) for r, n in rewards_and_turns]
    return Segment(turns=prefix, children=children)


ROOTS = [_root([(1.0, 1), (0.0, 3), (0.0, 1)]), _root([(0.0, 2), (0.0, 2), (0.0, 2)])]


@pytest.fixture(scope="module")
def multiturn(tmp_path_factory):
    import os

    os.environ.setdefault("CUA_RL_FILEROOT", str(tmp_path_factory.mktemp("fileroot")))
    return load_config("examples/cua_agent/config.multiturn.yaml", [])


def _advantaged(config, batch):
    return PPOActor(config.actor, engine=None)._compute_advantages(batch)


def _pulls(out) -> list[float]:
    """Each row's summed advantage over its trained tokens."""
    return (out["advantages"] * out["loss_mask"]).sum(-1).tolist()


def test_a_tree_trains_its_prefix_once_and_each_continuation_against_its_siblings(multiturn):
    t = multiturn.trajectory
    assert t.export_style == "concat" and t.group_weight == "equal"
    values = tree_values(ROOTS, **t.value_options())
    batch = tree_rows(ROOTS, values, **t.row_options(), compact_images=False)
    [a, b] = ROOTS
    assert [value_of(a), value_of(b)] == [pytest.approx(1 / 3), 0.0]       # the mean of each prefix's leaves
    segments = [a, *a.children, b, *b.children]                           # the rows' order (depth first)
    assert batch["input_ids"].shape[0] == len(segments) == 8              # one row per segment

    # each turn trained once: the prefix in its own row, masked out of its continuations' rows
    mask = batch["loss_mask"]
    assert int(mask.sum()) == tree_trained_tokens(ROOTS) == OUTPUT * (2 + 5 + 2 + 6)
    for i, seg in enumerate(segments):
        ids = batch["input_ids"][i]
        path = [*seg.path[-1].prompt_ids, *seg.path[-1].output_ids]
        assert ids[:len(path)].tolist() == path                           # the whole path: the prompt continues it
        for turn in seg.context:                                          # the prefix's replies: context only
            start = len(turn.prompt_ids)
            assert ids[start:start + OUTPUT].tolist() == turn.output_ids and mask[i, start:start + OUTPUT].sum() == 0
        for turn in seg.turns:                                            # its own replies: trained
            start = len(turn.prompt_ids)
            assert mask[i, start:start + OUTPUT].tolist() == [1] * OUTPUT

    out = _advantaged(multiturn, batch)
    pa, a_own, a1, a2, pb, *b_cont = _pulls(out)
    assert pa > 0 and pb == pytest.approx(-pa, rel=1e-4)                  # root against root: A's prefix did better
    assert b_cont == [0.0, 0.0, 0.0], "B's continuations are compared with their own siblings only"
    assert a_own > 0 and a1 < 0 and a1 == pytest.approx(a2, rel=1e-4)     # 3-turn and 1-turn failures pull alike
    assert a_own == pytest.approx(-(a1 + a2), rel=1e-4)                   # the success pulls as hard as both
    # every token of a segment carries its segment's advantage (the prefix's too, in its own row only)
    adv = out["advantages"] * out["loss_mask"]
    for i in range(8):
        trained = adv[i][out["loss_mask"][i].bool()]
        assert torch.allclose(trained, trained[0].expand_as(trained)), f"row {i} mixes advantages"


def test_the_same_leaves_as_a_plain_grpo_group_break_it(multiturn):
    """The six leaves as whole episodes (what a GRPO group of the same executions trains): the prefixes' tokens
    are trained once per leaf (3x), and B's continuations are pushed down by A's success in another root."""
    t = multiturn.trajectory
    leaves = [EpisodeOutcome(turns=c.path, reward=c.reward) for root in ROOTS for c in root.children]
    batch = group_batch(leaves, **t.group_options(), compact_images=False)
    prefix_tokens = OUTPUT * 2 * 2
    assert int(batch["loss_mask"].sum()) == tree_trained_tokens(ROOTS) + 2 * prefix_tokens
    pulls = _pulls(_advantaged(multiturn, batch))
    assert all(p < 0 for p in pulls[3:]), pulls
