"""Our Training Monitor server over real storage (a SQLite file and a real PostgreSQL server, ``store_url``):
the unchanged client and reporter write a run; the viewer API reads it back; bad input changes nothing."""

import hashlib
import logging

import httpx
import pytest
from sqlalchemy import func, select

from cua_rl.monitor import EpisodeReporter, MonitorClient, rollout_record, step_record, training_run
from cua_rl.monitor.schema import TABLES, tokens
from sample_run import FAST, agent_steps, make_turn, screenshot_png, send_sample_run


def counts(store) -> dict:
    with store.engine.connect() as conn:
        return {k: conn.execute(select(func.count()).select_from(t)).scalar() for k, t in TABLES.items()}


def test_a_run_round_trips_through_client_store_and_viewer_api(our_monitor, caplog):
    caplog.set_level(logging.DEBUG)
    monitor, token = our_monitor
    assert monitor.store.revision() == "0001"                      # migrated by Alembic at open
    config = {"actor": {"path": "/m"}, "project_token": "tok-CONFIG-secret", "gconfig": {"n_samples": 2}}
    with training_run(monitor.url, "p1", "cua", "run0", token=token, config=config) as training_id:
        import asyncio

        rep = asyncio.run(send_sample_run(monitor.url, token, training_id, rewards=(1.0, 0.0)))
        assert rep.failures == 0 and rep.dropped == 0
    api = httpx.Client(base_url=monitor.url)
    runs = api.get("/api/trainings").json()
    assert [r["id"] for r in runs] == [training_id] and runs[0]["status"] == "completed"
    run = api.get(f"/api/trainings/{training_id}").json()
    assert run["config"]["project_token"] == "***" and run["config"]["gconfig"] == {"n_samples": 2}
    assert run["summary"]["completed"] == 2 and run["summary"]["reward_mean"] == 0.5
    assert run["curve"] == [{"step": 0, "reward_mean": 0.5, "success_rate": 0.5}]
    step = api.get(f"/api/steps/{run['steps'][0]['id']}").json()
    [group] = step["groups"]
    assert group["task"] == "Open the editor" and len(group["members"]) == 2
    advantages = sorted(m["advantage"] for m in group["members"])
    assert advantages[0] == pytest.approx(-advantages[1]) and advantages[1] > 0.5

    best = max(group["members"], key=lambda m: m["reward"])
    rollout = api.get(f"/api/rollouts/{best['id']}").json()
    assert rollout["task"]["task_id"] == "task-1" and rollout["training_id"] == training_id
    # both list the group by member (env_index); ids follow arrival order, which concurrent sends may swap
    assert [m["id"] for m in rollout["group"]] == [m["id"] for m in group["members"]]
    t1, t2 = rollout["turns"]
    assert (t1["turn"], t2["turn"]) == (1, 2) and t2["episode_done"] is True
    assert t1["actions"][0]["action"] == {"type": "click", "x": 0.25, "y": 0.5, "button": "left", "count": 1}
    assert t2["actions"][0]["action"]["type"] == "drag" and t1["text"] == "click(0.25, 0.5)"
    assert t1["tokens"]["pieces"][:2] == ["t100 ", "t101 "] and len(t1["tokens"]["logprobs"]) == 6
    assert t1["advantage"] == pytest.approx(best["advantage"]) and t1["reward"] == 1.0
    assert t1["turn_time"] == pytest.approx(0.25) and t1["metrics"]["n_images"] == 1
    png = screenshot_png("#3070c0", "r0 t1")
    assert t1["image_sha256"] == hashlib.sha256(png).hexdigest()
    blob = api.get(f"/blobs/{t1['image_sha256']}")
    assert blob.status_code == 200 and blob.content == png and blob.headers["content-type"] == "image/png"
    [validation] = rollout["validations"]
    assert validation["success"] is True and validation["details_json"]["genv_evaluation"]["score"] == 1.0
    # Pages: the client's UI link ({base}/{training_id}?project_id=...) and the viewer's routes.
    for path in ("/", f"/{training_id}?project_id=p1", f"/steps/{step['id']}", f"/rollouts/{best['id']}",
                 "/static/app.js"):
        assert api.get(path).status_code == 200, path
    # Screenshots live as files in the data directory, once per content, never in the database.
    assert len(list((monitor.blobs.root).rglob("*.png"))) == 4
    with monitor.store.engine.connect() as conn:
        stored = conn.execute(select(tokens.c.token_sha256)).scalars().all()
    assert token not in stored and hashlib.sha256(token.encode()).hexdigest() in stored
    assert token not in caplog.text and "tok-CONFIG-secret" not in caplog.text


async def test_upserts_keep_one_row_and_never_blank_columns(our_monitor):
    monitor, token = our_monitor
    async with MonitorClient(monitor.url, token, retry=FAST, raise_errors=True) as client:
        tid = await client.start_training({"run_name": "r", "status": "running"})
        sid = (await client.upsert(step_record(tid, 3))).id_of("steps", f"step-{tid}-3-0")
        first = await client.upsert(rollout_record("u1", step_id=sid, current_phase="env_creation", group_id="g"))
        again = await client.upsert(rollout_record("u1", status="completed", reward=0.5))
    assert first.id_of("rollouts", "u1") == again.id_of("rollouts", "u1")
    rollout = httpx.get(f"{monitor.url}/api/rollouts/{first.id_of('rollouts', 'u1')}").json()
    assert (rollout["status"], rollout["reward"], rollout["current_phase"], rollout["group_id"]) == (
        "completed", 0.5, "env_creation", "g")
    assert rollout["training_id"] == tid                           # derived from its step
    assert counts(monitor.store)["rollouts"] == 1


def _bad_requests(url, token):
    ok_rollout = {"client_id": "fine", "status": "running"}
    auth = {"Authorization": f"Bearer {token}"}
    yield "not json", 400, "not valid JSON", dict(content=b"{nope", headers=auth)
    yield "array body", 400, "JSON object", dict(json=[1], headers=auth)
    yield "unknown kind", 422, "unknown keys ['widgets']", dict(json={"widgets": []}, headers=auth)
    yield "no client_id", 422, "rollouts[1]: client_id", dict(json={"rollouts": [ok_rollout, {"status": "x"}]},
                                                             headers=auth)
    yield "wrong type", 422, "rollouts[1].reward: expected float", dict(
        json={"rollouts": [ok_rollout, {"client_id": "b", "reward": "high"}]}, headers=auth)
    yield "unknown link", 422, "no rollout 'ghost'", dict(
        json={"rollouts": [ok_rollout], "turns": [{"client_id": "ghost:turn:1", "rollout_id": "ghost", "turn": 1}]},
        headers=auth)
    yield "unknown training", 404, "training 999", dict(json={"training": {"training_id": 999, "status": "x"}},
                                                         headers=auth)
    yield "too many rows", 413, "more than", dict(json={"tasks": [{"client_id": f"t{i}"} for i in range(5001)]},
                                                  headers=auth)
    yield "oversized body", 413, "exceeds the limit", dict(
        content=b'{"tasks": [{"client_id": "' + b"x" * (9 * 1024 * 1024) + b'"}]}', headers=auth)
    yield "field too long", 413, "exceed the limit of 256", dict(
        json={"rollouts": [{"client_id": "c", "status": "s" * 300}]}, headers=auth)
    yield "wrong token", 401, "invalid project token", dict(json={"rollouts": [ok_rollout]},
                                                             headers={"Authorization": "Bearer wrong-SECRET"})
    yield "no token", 401, "missing bearer token", dict(json={"rollouts": [ok_rollout]})


def test_bad_ingest_gets_a_clear_4xx_and_changes_nothing(our_monitor):
    monitor, token = our_monitor
    before = counts(monitor.store)
    with httpx.Client(base_url=monitor.url, timeout=30) as http:
        for name, status, message, kwargs in _bad_requests(monitor.url, token):
            res = http.post("/api/ingest/batch", **kwargs)
            assert res.status_code == status, (name, res.text[:300])
            assert message in res.json()["detail"], (name, res.json())
            assert token not in res.text and "wrong-SECRET" not in res.text
        png = screenshot_png()
        sha = hashlib.sha256(png).hexdigest()
        auth = {"Authorization": f"Bearer {token}"}
        for name, path, body, status in (("hash mismatch", "0" * 64, png, 400), ("not an image", None, b"GIF89a..", 400),
                                         ("bad name", "xyz", png, 400)):
            target = path or hashlib.sha256(body).hexdigest()
            res = http.put(f"/api/blobs/{target}", content=body, headers=auth)
            assert res.status_code in (status, 404), (name, res.text)
        assert http.put(f"/api/blobs/{sha}", content=png, headers={"Authorization": "Bearer nope"}).status_code == 401
    assert counts(monitor.store) == before
    assert not list(monitor.blobs.root.rglob("*.png"))
    # and a good batch still goes through afterwards
    res = httpx.post(f"{monitor.url}/api/ingest/batch", json={"rollouts": [{"client_id": "fine"}]},
                     headers={"Authorization": f"Bearer {token}"})
    assert res.status_code == 200 and res.json()["rollouts"][0]["client_id"] == "fine"


def test_tokens_are_per_project(our_monitor):
    monitor, token = our_monitor
    other = monitor.store.create_token("p2")
    auth = lambda t: {"Authorization": f"Bearer {t}"}  # noqa: E731
    mine = httpx.post(f"{monitor.url}/api/ingest/batch", json={"tasks": [{"client_id": "t1", "name": "A"}]},
                      headers=auth(token)).json()["tasks"][0]["id"]
    theirs = httpx.post(f"{monitor.url}/api/ingest/batch", json={"tasks": [{"client_id": "t1", "name": "B"}]},
                        headers=auth(other)).json()["tasks"][0]["id"]
    assert mine != theirs                                   # same client_id, two projects, two rows
    # a project cannot link to another project's rows
    res = httpx.post(f"{monitor.url}/api/ingest/batch", json={"rollouts": [{"client_id": "r", "task_id": mine}]},
                     headers=auth(other))
    assert res.status_code == 422 and "no task" in res.json()["detail"]


def test_eval_and_baseline_rollouts_are_recorded_and_summarised(our_monitor):
    import asyncio

    monitor, token = our_monitor
    with training_run(monitor.url, "p1", "cua", "evals", token=token) as tid:
        asyncio.run(send_sample_run(monitor.url, token, tid, step=0, rewards=(0.0, 0.0), is_eval=True))
        asyncio.run(send_sample_run(monitor.url, token, tid, step=2, rewards=(1.0, 0.0), is_eval=True))
        asyncio.run(send_sample_run(monitor.url, token, tid, step=2, rewards=(1.0, 1.0)))
    run = httpx.get(f"{monitor.url}/api/trainings/{tid}").json()
    [baseline], [evaluation] = run["baselines"], run["evals"]
    assert baseline["step"] == 0 and baseline["summary"]["reward_mean"] == 0.0 and baseline["summary"]["rollouts"] == 2
    # rows opened "running" by the rollout workers show finished once the run is (nothing else closes them)
    assert (baseline["status"], evaluation["status"], run["steps"][0]["status"]) == ("completed",) * 3
    assert run["status"] == "completed" and run["current_phase"] == "done"
    assert evaluation["step"] == 2 and evaluation["summary"]["success_rate"] == 0.5
    assert run["curve"] == [{"step": 2, "reward_mean": 1.0, "success_rate": 1.0}]   # training rollouts only
    page = httpx.get(f"{monitor.url}/api/baselines/{baseline['id']}").json()
    assert {m["source_type"] for g in page["groups"] for m in g["members"]} == {"baseline"}


def test_held_out_curve_filters_pages_and_export(our_monitor):
    """Issue 37 item 5: the run page's held-out curve (evaluations, baseline), its rollouts a filtered page at a
    time, and the same filters exporting every match as CSV and JSONL."""
    import asyncio
    import csv
    import io
    import json

    monitor, token = our_monitor
    with training_run(monitor.url, "p1", "cua", "pages", token=token) as tid:
        asyncio.run(send_sample_run(monitor.url, token, tid, step=0, rewards=(0.0, 0.0), is_eval=True))
        for step in (1, 2, 3):
            asyncio.run(send_sample_run(monitor.url, token, tid, step=step, rewards=(1.0, 0.0, 0.0)))
        asyncio.run(send_sample_run(monitor.url, token, tid, step=2, rewards=(1.0, 0.0), is_eval=True,
                                    task_id="task-2"))
    api = httpx.Client(base_url=monitor.url)
    run = api.get(f"/api/trainings/{tid}").json()
    assert [(p["kind"], p["step"], p["success_rate"]) for p in run["heldout_curve"]] == [("baseline", 0, 0.0),
                                                                                          ("eval", 2, 0.5)]
    assert run["summary"]["rollouts"] == 9 and run["summary"]["success_rate"] == pytest.approx(1 / 3)
    assert [s["summary"]["by_status"] for s in run["steps"]] == [{"completed": 3}] * 3

    page = api.get(f"/api/trainings/{tid}/rollouts", params={"limit": 4}).json()
    assert page["total"] == 13 and len(page["rollouts"]) == 4
    assert [r["id"] for r in page["rollouts"]] == sorted((r["id"] for r in page["rollouts"]), reverse=True)
    assert {t["key"] for t in page["tasks"]} == {"task-1", "task-2"} and page["sources"] == ["baseline", "eval", "step"]
    rest = api.get(f"/api/trainings/{tid}/rollouts", params={"limit": 4, "offset": 12}).json()
    assert len(rest["rollouts"]) == 1 and rest["rollouts"][0]["id"] == min(r["id"] for r in
                                                                             api.get(f"/api/trainings/{tid}/rollouts").json()["rollouts"])
    won = api.get(f"/api/trainings/{tid}/rollouts", params={"min_reward": 0.5, "source": "step"}).json()
    assert won["total"] == 3 and {r["reward"] for r in won["rollouts"]} == {1.0}
    by_task = api.get(f"/api/trainings/{tid}/rollouts", params={"task": "task-2"}).json()
    assert by_task["total"] == 2 and {r["task_key"] for r in by_task["rollouts"]} == {"task-2"}
    assert api.get(f"/api/trainings/{tid}/rollouts", params={"status": "failed"}).json()["total"] == 0
    for bad in ({"limit": 0}, {"limit": 501}, {"offset": -1}, {"min_reward": "high"}):
        assert api.get(f"/api/trainings/{tid}/rollouts", params=bad).status_code == 422, bad
    assert api.get("/api/trainings/999999/rollouts").status_code == 404

    exported = api.get(f"/api/trainings/{tid}/rollouts.csv", params={"max_reward": 0.5})
    assert exported.status_code == 200 and exported.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(exported.text)))
    assert len(rows) == 9 and {float(r["reward"]) for r in rows} == {0.0} and rows[0]["task_name"] == "Open the editor"
    lines = api.get(f"/api/trainings/{tid}/rollouts.jsonl").text.splitlines()
    assert len(lines) == 13 and [json.loads(x)["id"] for x in lines] == sorted(json.loads(x)["id"] for x in lines)
    assert api.get(f"/api/trainings/{tid}/rollouts.xml").status_code == 404
    assert api.get("/api/trainings/999999/rollouts.csv").status_code == 404


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_csv_export_defuses_cells_that_start_like_formulas(our_monitor):
    """Issue 66: task keys and names come from the gym (a custom task's name is anyone's), group ids from the
    workflow; a CSV cell starting with = + - @ tab or CR is a formula to a spreadsheet, so it gets a leading
    quote (OWASP). Numbers stay numbers, and the JSONL export keeps the text as it is."""
    import asyncio
    import csv
    import io
    import json

    monitor, token = our_monitor
    hostile = {"task_id": "=HYPERLINK(\"http://x.example\",\"open\")", "task_name": "@SUM(1+1)*cmd|' /C calc'!A0",
               "group_id": "+1+1"}
    more = ["-2+3", "\t=1", "\r=1"]

    async def report() -> None:
        rep = EpisodeReporter(monitor.url, "p1", tid, token=token)
        for i, group in enumerate([hostile["group_id"], *more]):
            rollout = rep.rollout(f"formula{i}".ljust(32, "0"), task_id=hostile["task_id"],
                                  task_name=hostile["task_name"], step=1, source_type="step", is_eval=False,
                                  env_index=i, group_id=group, max_turns=5, model_path="/m")
            rollout.finished(reward=0.0, task_success=False, num_turns=0, summary={})
            rollout.advantage(-0.5, 0)
        await rep.aclose()

    with training_run(monitor.url, "p1", "cua", "formulas", token=token) as tid:
        asyncio.run(report())
    exported = httpx.get(f"{monitor.url}/api/trainings/{tid}/rollouts.csv")
    rows = list(csv.DictReader(io.StringIO(exported.text)))
    assert len(rows) == 4
    assert {r["task_key"] for r in rows} == {"'" + hostile["task_id"]}
    assert {r["task_name"] for r in rows} == {"'" + hostile["task_name"]}
    assert sorted(r["group_id"] for r in rows) == sorted("'" + g for g in [hostile["group_id"], *more])
    assert {r["advantage"] for r in rows} == {"-0.5"}          # a number, not text to defuse
    lines = httpx.get(f"{monitor.url}/api/trainings/{tid}/rollouts.jsonl").text.splitlines()
    assert {json.loads(line)["task_name"] for line in lines} == {hostile["task_name"]}


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_a_read_token_closes_every_read_and_leaves_ingest_to_project_tokens(tmp_path, store_url):
    from cua_rl.monitor.embedded import start_monitor

    monitor = start_monitor(tmp_path / "m", read_token="team-read-secret")
    try:
        token = monitor.store.create_token("p1")
        with training_run(monitor.url, "p1", "cua", "closed", token=token) as tid:   # ingest: project token only
            pass
        for path in ("/", f"/{tid}", "/api/trainings", f"/api/trainings/{tid}/rollouts.csv", "/static/app.js"):
            denied = httpx.get(monitor.url + path)
            assert denied.status_code == 401 and "read token" in denied.json()["detail"], path
        assert httpx.get(monitor.url + "/healthz").status_code == 200
        assert httpx.get(monitor.url + "/api/trainings", headers={"Authorization": f"Bearer {token}"}).status_code == 401
        ok = httpx.get(monitor.url + "/api/trainings", headers={"Authorization": "Bearer team-read-secret"})
        assert ok.status_code == 200 and [r["id"] for r in ok.json()] == [tid]
        browser = httpx.Client(base_url=monitor.url)   # a browser: ?token= once, then the cookie
        first = browser.get(f"/{tid}?project_id=p1&token=team-read-secret")
        assert first.status_code == 303 and first.headers["location"] == f"/{tid}?project_id=p1"
        assert "httponly" in first.headers["set-cookie"].lower()
        assert browser.get(f"/{tid}?project_id=p1").status_code == 200
        assert browser.get(f"/api/trainings/{tid}/rollouts").status_code == 200
        assert httpx.get(monitor.url + "/?token=wrong").status_code == 401
    finally:
        monitor.stop()


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_a_down_or_hung_monitor_costs_the_run_nothing(our_monitor, monkeypatch):
    """Refused connections are counted failures; a monitor that accepts and never answers fills at most
    MAX_PENDING sends, after which records are dropped with a count. Nothing raises, nothing waits."""
    import socket
    import time

    from cua_rl.monitor import reporter as reporter_mod

    monitor, token = our_monitor
    down = EpisodeReporter("http://127.0.0.1:9", "p1", 1, token=token, retry=FAST, timeout_s=0.5)
    report = down.rollout("a" * 32, task_id="t1", step=0)
    report.finished(reward=1.0, task_success=True, num_turns=1, summary={}, turns=[make_turn(screenshot_png())],
                    steps=[])
    await down.aclose()
    assert down.failures >= 2 and down.dropped == 0

    monkeypatch.setattr(reporter_mod, "MAX_PENDING", 3)
    with socket.socket() as hung:                  # accepts connections (backlog) and never answers
        hung.bind(("127.0.0.1", 0))
        hung.listen(64)
        rep = EpisodeReporter(f"http://127.0.0.1:{hung.getsockname()[1]}", "p1", 1, token=token, retry=FAST,
                              timeout_s=0.3)
        started = time.monotonic()
        for i in range(6):
            rep.rollout(f"{i:032d}", task_id="t1", step=0).finished(reward=0.0, task_success=False, num_turns=0,
                                                                     summary={})
        assert time.monotonic() - started < 0.5    # queuing never waits on the monitor
        assert rep.dropped >= 6
        await rep.aclose()
    assert rep.failures >= 1



def test_turns_show_live_and_the_trainers_logprobs_join_them_in_either_order(our_monitor):
    """A turn is in the viewer while its rollout still runs (the endpoint's ``on_turn`` -> ``report.turn``);
    the evaluated episode's re-send adds the agent's actions; the trainer's recomputed logprobs (sent by
    another process, knowing the turn only by its key) land on the same turn whether they arrive before the
    rollout worker's record or after it, and survive its re-sends."""
    import asyncio

    from cua_rl.areal_ext.trainer_logprobs import records_of
    from cua_rl.monitor.sender import RecordSender
    from cua_rl.trajectory.rows import new_rollout_uuid, turn_key

    monitor, token = our_monitor
    api = httpx.Client(base_url=monitor.url)
    uuid = new_rollout_uuid()
    shots = [screenshot_png("#3070c0", "t1"), screenshot_png("#c03070", "t2")]
    turns = [make_turn(shots[0]), make_turn(shots[1], 4)]

    def trainer_sends(by_key: dict, version: int | None = None) -> None:
        sender = RecordSender(lambda: MonitorClient.from_settings(monitor.url, token, "p1", raise_errors=True),
                              what="trainer logprobs")
        sender.submit(records_of(by_key, version))
        sender.close()
        assert sender.sent == 1 and sender.failures == 0 and sender.dropped == 0

    def rollout_page(tid: int) -> dict:
        [rollout] = api.get(f"/api/trainings/{tid}").json()["recent_rollouts"]
        return api.get(f"/api/rollouts/{rollout['id']}").json()

    async def episode(tid: int) -> None:
        rep = EpisodeReporter(monitor.url, "p1", tid, token=token, retry=FAST)
        report = rep.rollout(uuid, task_id="task-1", step=0, env_index=0, group_id="task-1:0:0")
        # the trainer's values for turn 2 arrive before the rollout worker has sent turn 2 at all
        await asyncio.to_thread(trainer_sends, {turn_key(uuid, 2): [-0.5, -0.25, -0.125, -1.0]})
        report.turn(1, turns[0])
        await rep.flush()
        live = await asyncio.to_thread(rollout_page, tid)
        assert live["status"] == "running" and live["current_turn"] == 1
        [t1] = [t for t in live["turns"] if t["turn"] == 1]
        assert t1["image_sha256"] == hashlib.sha256(shots[0]).hexdigest() and t1["actions"] == []
        assert len(t1["tokens"]["logprobs"]) == 6 and "trainer_logprobs" not in t1["tokens"]
        assert (await asyncio.to_thread(api.get, f"/blobs/{t1['image_sha256']}")).content == shots[0]

        report.turn(2, turns[1])
        report.finished(reward=1.0, task_success=True, num_turns=2, summary={"task_id": "task-1"}, turns=turns,
                        steps=agent_steps())
        await rep.flush()
        # after the turn exists
        await asyncio.to_thread(trainer_sends, {turn_key(uuid, 1): [-0.1, -0.2, -0.3, -0.4, -0.5, -0.6]}, 1)
        report.advantage(0.5, 2)                    # a later re-send of the turns must not drop them
        await rep.aclose()
        assert rep.failures == 0

    with training_run(monitor.url, "p1", "cua", "live", token=token) as tid:
        asyncio.run(episode(tid))
    done = rollout_page(tid)
    assert done["status"] == "completed" and [t["turn"] for t in done["turns"]] == [1, 2]
    t1, t2 = done["turns"]
    assert t1["actions"][0]["action"]["type"] == "click" and t2["episode_done"] is True
    assert t1["tokens"]["trainer_logprobs"] == [-0.1, -0.2, -0.3, -0.4, -0.5, -0.6]
    assert t2["tokens"]["trainer_logprobs"] == [-0.5, -0.25, -0.125, -1.0]
    # the trainer's version travels with its values (turn 1's were computed at version 1, turn 2's unsaid)
    assert t1["tokens"]["trainer_version"] == 1 and "trainer_version" not in t2["tokens"]
    assert t2["tokens"]["ids"] == [100, 101, 102, 103] and t2["advantage"] == 0.5
    assert len(list(monitor.blobs.root.rglob("*.png"))) == 2      # each screenshot uploaded once


def test_a_step_shows_running_until_its_rollouts_and_the_run_are_done():
    from cua_rl.monitor.views import parent_status, summarise

    running = summarise([{"status": "running"}, {"status": "completed", "reward": 1.0}])
    done = summarise([{"status": "completed", "reward": 1.0}])
    cancelled = summarise([{"status": "failed"}])
    assert parent_status("running", running, "running", latest=False) == "running"
    assert parent_status("running", done, "running", latest=True) == "running"      # the newest step may grow
    assert parent_status("running", done, "running", latest=False) == "completed"
    assert parent_status("running", running, "completed", latest=True) == "completed"
    assert parent_status("running", cancelled, "failed", latest=True) == "cancelled"
    assert parent_status("failed", done, "running", latest=False) == "failed"          # a recorded end stays
