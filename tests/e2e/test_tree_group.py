"""Tree groups on the real embedded stack (cua_rl/workflow/tree.py): real gym (Xvfb desktops forked by its fork
route), our agent service continuing runs (``startFrom``), real vLLM behind AReaL's engine, the real policy
endpoint holding the branch turn's call. One double: the stock gbox-mini-agent (closed source), which lists no
``startFrom`` and must be refused.

What a tree must show: every root that reaches the branch turn is forked there; the continuation's first prompt is
the parent's prompt for that turn, token for token and pixel for pixel (the same screen and history); the tree's
rows train each turn once, a continuation's prefix loss-masked; the leaves are the group's episodes in the step's
counts; every desktop, forked ones included, is ended."""

import pytest

from cua_rl.http.serve import serve_app_in_thread
from cua_rl.policy import close_loop_servers, tensor_sha256
from cua_rl.runs import EPISODE_SHARE
from cua_rl.trajectory.tree import leaves, tree_rows, tree_rows_count, tree_values, walk
from cua_rl.workflow.tree import TreePlayer, TreeRefused, check_agent, segments
from cua_rl.workflow.worker import worker_state
from tests.doubles.agent_double import AgentState, build_agent_double
from tests.doubles.embedded_stack import make_workflow, stack  # noqa: F401  (stack: the fixture)

pytestmark = [pytest.mark.desktop]

TREE = dict(enabled=True, branch_turns=[2], branches=1)
ROW = {"task_id": "054", "instruction": "Press the key for the colour of each square as it appears.", "seed": 7}


def _limits():
    return dict(max_turns=3, max_task_time_seconds=120, max_turn_time_seconds=60)


async def test_a_tree_forks_each_root_at_its_branch_turn_and_trains_each_turn_once(stack):
    wf = make_workflow(stack, tree=TREE, limits=_limits(), trajectory=dict(export_style="concat"))
    endpoint = wf.policy_endpoint(stack["engine"])
    try:
        player = TreePlayer(wf.episode_setup, wf.tree, endpoint, {**ROW, "gym_base_url": stack["gym"].url},
                            stack["gym"].url, "desktop", lambda i: None, ROW["seed"])
        play = await player.play(2)
        assert all(r.evaluated for r in play.roots), [r.outcome for r in play.roots]
        reached = [r for r in play.roots if len(r.outcome.turns) >= 2]
        assert reached, "no root reached its second turn (the tiny model ended both at once)"
        assert play.forks == len(reached) and play.forks_failed == 0
        for root in reached:
            (turn, (kid,)), = root.branches
            assert turn == 2 and kid.first_turn == 2 and kid.evaluated, kid.outcome
            assert root.recorded_at_fork == {2: 1}   # forked while the parent's turn-2 call was held
            first, parents = kid.outcome.turns[0], root.outcome.turns[1]
            # the same prompt for the branch turn: history, instruction and screen
            assert first.prompt_ids == parents.prompt_ids
            assert tensor_sha256(first.multi_modal_input["pixel_values"]) == \
                tensor_sha256(parents.multi_modal_input["pixel_values"])
            assert kid.outcome.info["execution_id"] != root.outcome.info["execution_id"]
        assert not stack["gym"].manager.executions, "a desktop of the tree was left running"

        roots = segments(play)
        assert len(leaves(roots)) == len(play.kept()) == 2 + len(reached)
        for root, segment in zip(play.roots, roots):
            if root in reached:   # the shared prefix once, then the root's own continuation and the child's
                assert len(segment.turns) == 1 and len(segment.children) == 2
                assert [len(c.context) for c in segment.children] == [1, 1]
                assert segment.children[1].first_turn == 1   # the child's rollout numbers its own turns from 1
        values = tree_values(roots)
        batch = tree_rows(roots, values, style="concat")
        assert batch["input_ids"].shape[0] == tree_rows_count(roots, "concat")
        trained = sum(len(t.output_ids) for s in walk(roots) for t in s.turns)
        assert int(batch["loss_mask"].sum()) == trained   # each turn trained once; prefixes in context masked
    finally:
        await close_loop_servers()


async def test_the_workflow_returns_a_trees_rows_and_counts_its_leaves(stack):
    wf = make_workflow(stack, tree=TREE, limits=_limits(), trajectory=dict(export_style="concat"))
    try:
        before = worker_state("train").totals()
        batch = await wf.arun_episode(stack["engine"], dict(ROW))
        assert batch is not None
        after = worker_state("train").totals()
        forks = after.get("tree_forks", 0) - before.get("tree_forks", 0)
        leaves_played = after["episodes_evaluated"] - before.get("episodes_evaluated", 0)
        assert leaves_played == 2 + forks and forks >= 1
        assert round(float(batch[EPISODE_SHARE].sum())) == leaves_played   # the step counts leaves
        assert not stack["gym"].manager.executions
    finally:
        await close_loop_servers()


async def test_tree_groups_refuse_an_agent_that_cannot_continue_a_run(stack):
    await check_agent(stack["agent"].url)   # ours lists startFrom
    served = serve_app_in_thread(build_agent_double(AgentState()))   # the stock agent: no /health features
    try:
        with pytest.raises(TreeRefused, match="startFrom.*lists none"):
            await check_agent(served.url)
    finally:
        served.stop()
