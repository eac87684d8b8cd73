"""A real CUAAgentWorkflow group on the embedded stack (real gym, agent service, vLLM on the CPU; the
``stack`` fixture of tests/doubles/embedded_stack.py) reporting to the Training Monitor test double
(tests/doubles/monitor_double.py) on loopback, the training record opened and closed by ``training_run`` as in train.py."""

import asyncio
import logging

import pytest

from cua_rl.monitor import token_from_env, training_run
from cua_rl.policy import close_loop_servers
from cua_rl.workflow import MonitorTarget
from tests.doubles import embedded_stack
from tests.doubles.embedded_stack import first_task, make_workflow

stack = embedded_stack.stack   # the module-scoped fixture: one stack for this module's tests

pytestmark = [pytest.mark.desktop]


async def _group(wf, stack):
    try:
        batch = await wf.arun_episode(stack["engine"], await first_task(stack))
        await wf.monitor_flush(30)
        return batch
    finally:
        await close_loop_servers()


def test_episodes_report_rollouts_and_validations(stack, monitor_server, monitor_state, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("PROJECT_TOKEN", monitor_state.token)
    base = monitor_server.url + monitor_state.prefix
    with training_run(base, "p1", "cua", "e2e", token=token_from_env()) as training_id:
        kwargs = dict(monitor=MonitorTarget(base_url=base, project_id="p1", training_id=training_id))
        assert monitor_state.token not in repr(kwargs)
        batch = asyncio.run(_group(make_workflow(stack, **kwargs), stack))
        # the agent service is unreachable: the group is dropped and both rollouts are marked failed (after a wait
        # for the service bounded by max_task_time_seconds: short here)
        broken = asyncio.run(_group(make_workflow(stack, agent_base_url="http://127.0.0.1:9",
                                                  max_task_time_seconds=4, **kwargs), stack))
    assert batch is not None and broken is None
    assert monitor_state.trainings[training_id]["status"] == "completed"

    rows = monitor_state.rows
    task_id = asyncio.run(first_task(stack))["task_id"]
    assert set(rows["tasks"]) == {task_id}                       # once per task (per reporter)
    assert set(rows["steps"]) == {f"step-{training_id}-0-0"}     # the engine's weight version 0
    rollouts = rows["rollouts"]
    # hex client ids that pack into a training row's monitor_turn key (trajectory.rows.new_rollout_uuid)
    assert len(rollouts) == 4 and all(len(cid) == 14 and int(cid, 16) > 0 for cid in rollouts)
    done = [r for r in rollouts.values() if r["status"] == "completed"]
    failed = [r for r in rollouts.values() if r["status"] == "failed"]
    assert len(done) == 2 and len(failed) == 2
    assert sorted(r["env_index"] for r in done) == [0, 1]
    for r in done:
        assert 0.0 <= r["reward"] <= 1.0 and r["num_turns"] >= 1 and isinstance(r["task_success"], bool)
        assert r["task_id"] == rows["tasks"][task_id]["id"] and r["step_id"] == rows["steps"][f"step-{training_id}-0-0"]["id"]
        validation = rows["validations"][f"{r['client_id']}:validation"]
        assert validation["rollout_id"] == r["id"] and validation["actual_result"].startswith(f"reward={r['reward']:.4f}")
    assert set(rows["validations"]) == {f"{r['client_id']}:validation" for r in done}
    assert all("end_time" in r and "error" in r["summary_json"] for r in failed)
    assert {h["authorization"] for h in monitor_state.requests} == {f"Bearer {monitor_state.token}"}
    assert monitor_state.token not in caplog.text


def test_no_token_means_no_monitor_traffic(stack, monitor_server, monitor_state, monkeypatch):
    monkeypatch.delenv("PROJECT_TOKEN", raising=False)
    monkeypatch.delenv("MONITOR_PROJECT_TOKEN", raising=False)
    wf = make_workflow(stack, monitor=MonitorTarget(base_url=monitor_server.url + monitor_state.prefix, project_id="",
                                                 training_id=1))
    assert asyncio.run(_group(wf, stack)) is not None
    assert monitor_state.requests == []


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_real_episodes_record_turns_in_our_monitor(stack, our_monitor, monkeypatch):
    """The same real group, reported to our own monitor: every model turn lands with the screenshot the model
    saw (a file named by its hash), the executed action, the output tokens and logprobs, and the group's
    advantages."""
    import hashlib

    import httpx

    monitor, token = our_monitor
    monkeypatch.setenv("PROJECT_TOKEN", token)
    with training_run(monitor.url, "p1", "cua", "e2e-ours", token=token) as training_id:
        wf = make_workflow(stack, monitor=MonitorTarget(base_url=monitor.url, project_id="p1", training_id=training_id))
        batch = asyncio.run(_group(wf, stack))
    assert batch is not None
    run = httpx.get(f"{monitor.url}/api/trainings/{training_id}").json()
    [step] = run["steps"]
    [group] = httpx.get(f"{monitor.url}/api/steps/{step['id']}").json()["groups"]
    assert len(group["members"]) == 2 and all(m["status"] == "completed" for m in group["members"])
    assert all(m["advantage"] is not None for m in group["members"])
    for member in group["members"]:
        rollout = httpx.get(f"{monitor.url}/api/rollouts/{member['id']}").json()
        assert len(rollout["turns"]) == rollout["num_turns"] >= 1
        assert rollout["current_turn"] == rollout["num_turns"]   # set only by the live turn records
        for turn in rollout["turns"]:
            blob = httpx.get(f"{monitor.url}/blobs/{turn['image_sha256']}")
            assert blob.status_code == 200 and hashlib.sha256(blob.content).hexdigest() == turn["image_sha256"]
            assert blob.content.startswith(b"\x89PNG")
            tokens = turn["tokens"]
            assert len(tokens["ids"]) == len(tokens["logprobs"]) == len(tokens["pieces"]) >= 1
            assert all(lp <= 0 for lp in tokens["logprobs"]) and turn["turn_time"] > 0
            assert turn["metrics"]["pixel_sha256"] and turn["text"] is not None
            assert turn["advantage"] == pytest.approx(member["advantage"])
        assert rollout["validations"] and rollout["validations"][0]["success"] == rollout["task_success"]


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_group_cancelled_in_flight_reports_its_rollouts_cancelled_not_failed(stack, our_monitor, monkeypatch):
    """AReaL cancels the episodes in flight when a run ends (the read-ahead of a step that never trains): their
    rollouts are "cancelled" in our monitor, not "failed" (the 16-step run of 2026-11-29 listed 16 of them as red
    failures), and their executions are still terminated."""
    import httpx

    monitor, token = our_monitor
    monkeypatch.setenv("PROJECT_TOKEN", token)

    async def cancelled_group(wf, training_id):
        task = asyncio.ensure_future(wf.arun_episode(stack["engine"], await first_task(stack)))
        async with httpx.AsyncClient() as client:
            for _ in range(600):   # until both episodes play: a model turn of each reported (executions made)
                await asyncio.sleep(0.1)
                listed = (await client.get(f"{monitor.url}/api/trainings/{training_id}/rollouts")).json()["rollouts"]
                if len(listed) == 2 and all(r.get("current_phase") == "agent" for r in listed):
                    break
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wf.monitor_flush(30)
        for _ in range(150):   # the terminates run shielded from the cancel
            if not stack["gym"].manager.executions:
                break
            await asyncio.sleep(0.1)

    with training_run(monitor.url, "p1", "cua", "e2e-cancel", token=token) as training_id:
        wf = make_workflow(stack, monitor=MonitorTarget(base_url=monitor.url, project_id="p1", training_id=training_id))
        try:
            asyncio.run(cancelled_group(wf, training_id))
        finally:
            asyncio.run(close_loop_servers())
    rollouts = httpx.get(f"{monitor.url}/api/trainings/{training_id}/rollouts").json()["rollouts"]
    # an episode of the tiny model may end (evaluated) between the check above and the cancel: completed then
    statuses = [r["status"] for r in rollouts]
    assert len(statuses) == 2 and "cancelled" in statuses and set(statuses) <= {"cancelled", "completed"}, rollouts
    assert not stack["gym"].manager.executions, "a cancelled episode left its execution running"


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_tree_pays_4_tree_paths_send_their_advantages(stack, our_monitor, monkeypatch):
    """Issue 90, defect 4 (the monitor's share; the counts are in tests/workflow/test_workflow_episode.py): a tree
    group's paths sent no advantage to the monitor. Now every path's rollout has one (its leaf segment's value) and
    each of its turns the value of the segment it trains in: a root's turn before the branch its value among the
    roots, the turns after it their value against the children forked there."""
    import httpx

    monitor, token = our_monitor
    monkeypatch.setenv("PROJECT_TOKEN", token)
    row = {"task_id": "054", "instruction": "Press the key for the colour of each square as it appears.", "seed": 7}

    async def tree_group(wf):
        try:
            batch = await wf.arun_episode(stack["engine"], dict(row))
            await wf.monitor_flush(30)
            return batch
        finally:
            await close_loop_servers()

    with training_run(monitor.url, "p1", "cua", "e2e-tree", token=token) as training_id:
        wf = make_workflow(stack, tree=dict(enabled=True, branch_turns=[2], branches=1),
                           limits=dict(max_turns=3, max_task_time_seconds=120, max_turn_time_seconds=60),
                           trajectory=dict(export_style="concat"),
                           monitor=MonitorTarget(base_url=monitor.url, project_id="p1", training_id=training_id))
        batch = asyncio.run(tree_group(wf))
    assert batch is not None
    [step] = httpx.get(f"{monitor.url}/api/trainings/{training_id}").json()["steps"]
    [group] = httpx.get(f"{monitor.url}/api/steps/{step['id']}").json()["groups"]
    members = group["members"]
    assert len(members) > 2, "no root was forked (the tiny model ended both at once)"
    assert all(m["status"] == "completed" and m["advantage"] is not None for m in members), \
        [(m["status"], m["advantage"], m.get("num_turns")) for m in members]
    for member in members:
        rollout = httpx.get(f"{monitor.url}/api/rollouts/{member['id']}").json()
        assert rollout["turns"] and all(t["advantage"] is not None for t in rollout["turns"]), rollout["turns"]
        assert rollout["turns"][-1]["advantage"] == pytest.approx(member["advantage"])   # the leaf's, undiscounted
