"""The trajectory viewer in real headless Chromium (Debian's ``chromium`` + ``chromium-driver``, driven by
Selenium): pages load, the screenshot and the action overlay render where the action was, tokens are
coloured, and a run in progress updates without a reload."""

import asyncio
import os
import shutil
from pathlib import Path

import httpx
import pytest

from cua_rl.local_gym.curriculum import GATED
from cua_rl.monitor import training_run
from cua_rl.monitor.records import trainer_logprobs_record, update_record
from cua_rl.trainer.health import BY_NAME, Finding
from cua_rl.verdict import describe, file_in_store
from sample_run import INSTRUCTION, SCREEN, send_sample_run
from tests.chromium import css, wait_for

pytestmark = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)


def _verdict() -> dict:
    """A verdict as cua_rl/verdict.py writes it: two held-out instances of each gated regime, failed by the
    starting policy and solved by step 2."""
    regimes = {name: {"before": 0.0, "after": 1.0, "rise": 1.0, "ci95": [1.0, 1.0], "units": 2, "instances": 2}
               for name in GATED}
    summary, lines = describe(regimes)
    outcomes = [["054", seed, 0, name, f"unit{seed}"] for name in GATED for seed in (1, 2)]
    return {"summary": summary, "lines": lines,
            "before": {"checkpoint": "/warm-start", "outcomes": outcomes},
            "after": {"checkpoint": "/ckpt/default/epoch1epochstep0globalstep1",
                      "outcomes": [[*o[:2], 1, *o[3:]] for o in outcomes]}}


def test_run_groups_and_rollout_player(our_monitor, browser, tmp_path):
    monitor, token = our_monitor
    with training_run(monitor.url, "p1", "cua", "browser", token=token, config={"lr": 1e-5}) as tid:
        asyncio.run(send_sample_run(monitor.url, token, tid, rewards=(1.0, 0.0)))
    run = httpx.get(f"{monitor.url}/api/trainings/{tid}").json()
    best = max((m for g in httpx.get(f"{monitor.url}/api/steps/{run['steps'][0]['id']}").json()["groups"]
                for m in g["members"]), key=lambda m: m["reward"])
    # the trainer's logprobs of the best rollout's turn 2 (sampled at version 0), recomputed at version 1
    uuid = httpx.get(f"{monitor.url}/api/rollouts/{best['id']}").json()["client_id"]
    _trainer_sends(monitor.url, token, trainer_logprobs_record(uuid, 2, [-0.1, -0.3, -0.9, -2.0], version=1))
    # the trainer's update of those rollouts: its statistics (AReaL's names) and a tripped check
    gap = Finding(1, BY_NAME["sampler_logprob_gap"], 0.31, 0.05, "warn")
    _trainer_sends(monitor.url, token, update_record(
        tid, 0, train_step=1, stats={"ppo_actor/update/actor_loss/avg": -0.02, "ppo_actor/update/entropy/avg": 1.7,
                                     "ppo_actor/update/grad_norm": float("nan"), "sampler_logprob_gap": 0.31,
                                     "ppo_actor/update/entropy_bonus/avg": 0.0017},
        health={"sampler_logprob_gap": 0.31, "staleness": 0.0}, anomalies=[gap.as_dict()]))
    # the run's verdict on learning, filed after the run (cua_rl/verdict.py): a box on the run page, the starting
    # policy as the baseline and the last step as an evaluation on the held-out chart
    assert file_in_store(monitor.store, _verdict(), "browser")

    browser.get(f"{monitor.url}/")
    wait_for(browser, lambda d: css(d, "[data-testid=run-row]"))
    assert "browser" in css(browser, "[data-testid=run-row]")[0].text

    browser.get(f"{monitor.url}/{tid}?project_id=p1")                     # the client's UI link
    wait_for(browser, lambda d: css(d, "[data-testid=chart-reward_mean] circle.point"))
    # the update's statistics are drawn (a NaN is left out) and its tripped check is named twice
    assert len(css(browser, "[data-testid=chart-loss] circle.point")) == 1
    assert len(css(browser, "[data-testid=chart-entropy] circle.point")) == 1
    assert not css(browser, "[data-testid=chart-grad_norm] circle.point")
    # the regularisers' charts only when the run has them: an entropy term here, no KL penalty
    assert len(css(browser, "[data-testid=chart-entropy_bonus] circle.point")) == 1
    assert not css(browser, "[data-testid=chart-kl_reward]") and css(browser, "[data-testid=chart-grad_norm]")
    assert css(browser, "[data-testid=verdict]")[0].text.startswith("LEARNED: held-out greedy success rose")
    assert "instances: 0.000 -> 1.000, rise +1.000" in css(browser, "[data-testid=verdict]")[0].text
    assert len(css(browser, "[data-testid=chart-heldout] circle.point")) >= 1
    if os.environ.get("CUA_RL_DOCS_IMG") == "1":   # docs/img/monitor-verdict.png (docs/learning.md)
        browser.set_window_size(1400, 900)
        browser.save_screenshot(str(DOCS_IMG / "monitor-verdict.png"))
    assert css(browser, "[data-testid=health-anomaly]")[0].text == "sampler_logprob_gap 0.310 (warn)"
    [finding] = css(browser, "[data-testid=health-finding]")
    assert finding.text.startswith("warn · training step 1: [cua-rl] health step 1: sampler_logprob_gap 0.31")
    assert css(browser, "[data-testid=steps-table]") and "completed" in browser.find_element("tag name", "h1").text + \
        " ".join(e.text for e in css(browser, "[data-testid=status]"))

    browser.get(f"{monitor.url}/steps/{run['steps'][0]['id']}")
    wait_for(browser, lambda d: css(d, "[data-testid=group] [data-testid=member]"))
    members = css(browser, "[data-testid=member]")
    assert len(members) == 2
    advantages = sorted(float(e.text) for e in css(browser, "[data-testid=advantage]"))
    assert advantages[0] < 0 < advantages[1]

    browser.get(f"{monitor.url}/rollouts/{best['id']}")
    wait_for(browser, lambda d: d.execute_script(
        "const i = document.querySelector('[data-testid=screenshot]'); return i && i.complete && i.naturalWidth"))
    assert browser.execute_script("return document.querySelector('[data-testid=screenshot]').naturalWidth") == SCREEN[0]
    point = wait_for(browser, lambda d: css(d, "[data-testid=overlay] [data-testid=click-point]"))[0]
    assert float(point.get_attribute("cx")) == pytest.approx(0.25 * SCREEN[0])
    assert float(point.get_attribute("cy")) == pytest.approx(0.5 * SCREEN[1])
    # the overlay sits on the image: the click point is drawn inside the image's box, where the click was
    box = browser.execute_script("""
        const img = document.querySelector('[data-testid=screenshot]').getBoundingClientRect();
        const c = document.querySelector('[data-testid=click-point]').getBoundingClientRect();
        return [img.left, img.width, img.top, img.height, c.left + c.width / 2, c.top + c.height / 2];""")
    assert box[4] == pytest.approx(box[0] + 0.25 * box[1], abs=2) and box[5] == pytest.approx(box[2] + 0.5 * box[3], abs=2)
    tokens = css(browser, "[data-testid=token]")
    assert len(tokens) == 6 and tokens[0].text.strip() == "t100"
    colours = {t.value_of_css_property("background-color") for t in tokens}
    assert len(colours) >= 3                                             # coloured by logprob, not uniform
    assert len(css(browser, "[data-testid=image-hash]")[0].text) == 64
    assert "click" in css(browser, "[data-testid=action]")[0].text
    assert css(browser, "[data-testid=validation]")
    browser.save_screenshot(str(tmp_path / "rollout.png"))

    css(browser, "[data-testid=next]")[0].click()                       # turn 2: a drag
    wait_for(browser, lambda d: "turn 2 of 2" in css(d, "[data-testid=turn-label]")[0].text)
    wait_for(browser, lambda d: css(d, "[data-testid=overlay] [data-testid=drag]"))
    drag = css(browser, "[data-testid=drag]")[0]
    assert float(drag.get_attribute("x2")) == pytest.approx(0.8 * SCREEN[0])
    # turn 2 has the trainer's values: coloured by the gap, which the page says includes an update
    label = wait_for(browser, lambda d: css(d, "[data-testid=off-policy]"))[0]
    assert "sampled at version 0, trainer at 1" in label.text, label.text
    assert "trainer (v1) -0.9" in css(browser, "[data-testid=token]")[2].get_attribute("title")


def _trainer_sends(url: str, token: str, record) -> None:
    """What the training side sends (trainer logprobs, update statistics), through its sender."""
    from cua_rl.monitor.client import MonitorClient
    from cua_rl.monitor.sender import RecordSender

    sender = RecordSender(lambda: MonitorClient.from_settings(url, token, "p1", raise_errors=True),
                          what="test records")
    sender.submit([record])
    sender.close()
    assert sender.sent == 1 and sender.failures == 0


def test_a_run_in_progress_updates_live(our_monitor, browser):
    monitor, token = our_monitor
    with training_run(monitor.url, "p1", "cua", "live", token=token) as tid:
        asyncio.run(send_sample_run(monitor.url, token, tid, step=0, rewards=(0.0, 1.0)))
        browser.get(f"{monitor.url}/{tid}")
        wait_for(browser, lambda d: len(css(d, "[data-testid=chart-reward_mean] circle.point")) == 1)
        assert "running" in " ".join(e.text for e in css(browser, "[data-testid=status]"))
        # the next step's rollouts arrive while the page is open: it redraws without a reload
        asyncio.run(send_sample_run(monitor.url, token, tid, step=1, rewards=(1.0, 1.0)))
        wait_for(browser, lambda d: len(css(d, "[data-testid=chart-reward_mean] circle.point")) == 2)
        assert len(css(browser, "[data-testid=steps-table] tr")) == 3
    wait_for(browser, lambda d: "completed" in " ".join(e.text for e in css(d, "[data-testid=status]")))


def info(driver) -> str | None:
    """The pager's text, read in the page (the list is redrawn under Selenium's element handles)."""
    return driver.execute_script("const e = document.querySelector('[data-testid=page-info]'); "
                                 "return e && e.textContent")


def test_the_run_page_shows_held_out_success_and_pages_and_filters_rollouts(our_monitor, browser, tmp_path):
    """Issue 37 item 5 in the browser: the held-out curve with its baseline, the learning-rate chart, and the
    rollouts a page of 50 at a time, filtered by status, task and reward, the filter kept in the address."""
    monitor, token = our_monitor
    with training_run(monitor.url, "p1", "cua", "pages", token=token) as tid:
        asyncio.run(send_sample_run(monitor.url, token, tid, step=0, rewards=(0.0, 0.0), is_eval=True))
        for step in range(1, 20):
            asyncio.run(send_sample_run(monitor.url, token, tid, step=step, rewards=(1.0, 0.0, 0.0)))
        asyncio.run(send_sample_run(monitor.url, token, tid, step=10, rewards=(1.0, 0.0), is_eval=True,
                                    task_id="task-2"))
        _trainer_sends(monitor.url, token, update_record(tid, 1, train_step=1, stats={"ppo_actor/update/lr": 2e-5},
                                                         health={}, anomalies=[]))
    browser.get(f"{monitor.url}/{tid}")
    wait_for(browser, lambda d: css(d, "[data-testid=page-info]"))
    assert len(css(browser, "[data-testid=chart-heldout] circle.point")) == 2        # the eval and the baseline
    assert len(css(browser, "[data-testid=chart-heldout] circle.also")) == 1
    assert len(css(browser, "[data-testid=chart-lr] circle.point")) == 1
    assert css(browser, "[data-testid=page-info]")[0].text == "1–50 of 61"
    assert len(css(browser, "[data-testid=rollout-row]")) == 50
    css(browser, "[data-testid=page-next]")[0].click()
    wait_for(browser, lambda d: info(d) == "51–61 of 61")
    assert len(css(browser, "[data-testid=rollout-row]")) == 11 and "offset=50" in browser.current_url

    from selenium.webdriver.support.ui import Select

    Select(css(browser, "[data-testid=filter-task]")[0]).select_by_value("task-2")   # back to page 1, filtered
    wait_for(browser, lambda d: info(d) == "1–2 of 2")
    reward = css(browser, "[data-testid=filter-min_reward]")[0]
    reward.send_keys("0.5\n")
    wait_for(browser, lambda d: info(d) == "1–1 of 1")
    assert [e.text for e in css(browser, "[data-testid=row-reward]")] == ["1.000"]
    assert "task=task-2" in browser.current_url and "min_reward=0.5" in browser.current_url
    csv_link = next(a for a in css(browser, "#rollouts a") if a.text == "CSV").get_attribute("href")
    assert "task=task-2" in csv_link and "min_reward=0.5" in csv_link
    assert httpx.get(csv_link).text.count("\n") == 2                              # header and the one rollout
    browser.refresh()                                                             # the filter survives a reload
    wait_for(browser, lambda d: info(d) == "1–1 of 1")
    browser.set_window_size(1400, 2300)                                           # the whole page (docs/img)
    browser.save_screenshot(str(tmp_path / "run-page.png"))


def test_a_running_rollout_links_to_its_live_view_until_it_ends(our_monitor, browser):
    """The workflow reports the gym's execution and its live view (RolloutReport.execution); the rollout page
    links to it while the rollout runs, and not after (tests/local_gym/test_live_view.py: the view itself)."""
    from cua_rl.monitor import EpisodeReporter

    monitor, token = our_monitor
    live = "http://127.0.0.1:5010/api/v1/desktop/executions/ex9/live"
    identity = dict(source_type="step", is_eval=False, env_index=0, max_turns=5, model_path="/m")

    async def report(finish: bool) -> None:
        rep = EpisodeReporter(monitor.url, "p1", tid, token=token)
        rollout = rep.rollout("cc33", task_id="t1", step=1, **identity)
        rollout.execution("ex9", live)
        if finish:
            rollout.finished(reward=1.0, task_success=True, num_turns=0, summary={"execution_id": "ex9"})
        await rep.aclose()

    with training_run(monitor.url, "p1", "cua", "live", token=token) as tid:
        asyncio.run(report(finish=False))
        rid = httpx.get(f"{monitor.url}/api/trainings/{tid}/rollouts").json()["rollouts"][0]["id"]
        browser.get(f"{monitor.url}/rollouts/{rid}")
        wait_for(browser, lambda d: css(d, "[data-testid=live-view]"))
        assert css(browser, "[data-testid=live-view]")[0].get_attribute("href") == live
        asyncio.run(report(finish=True))
    browser.get(f"{monitor.url}/rollouts/{rid}")
    wait_for(browser, lambda d: css(d, "[data-testid=rollout-reward]"))
    assert css(browser, "[data-testid=live-view]") == []


def test_a_live_view_address_that_is_not_http_is_no_link(our_monitor, browser):
    """Issue 66: the live view's address comes from whoever reports the rollout; a ``javascript:`` one was
    rendered as a link that would run in the monitor's page. Only http(s) addresses become links."""
    from cua_rl.monitor import EpisodeReporter

    monitor, token = our_monitor
    identity = dict(source_type="step", is_eval=False, env_index=0, max_turns=5, model_path="/m")

    async def report(client_id: str, live: str) -> None:
        rep = EpisodeReporter(monitor.url, "p1", tid, token=token)
        rep.rollout(client_id, task_id="t1", step=1, **identity).execution("ex9", live)
        await rep.aclose()

    with training_run(monitor.url, "p1", "cua", "live", token=token) as tid:
        for client_id, live in (("cc40", "javascript:document.title='pwned'"), ("cc41", "data:text/html,<b>x</b>"),
                                ("cc42", "https://gym.example/api/v1/desktop/executions/ex9/live")):
            asyncio.run(report(client_id, live))
        ids = {r["client_id"]: r["id"] for r in httpx.get(f"{monitor.url}/api/trainings/{tid}/rollouts").json()["rollouts"]}
        for client_id, linked in (("cc40", False), ("cc41", False), ("cc42", True)):
            browser.get(f"{monitor.url}/rollouts/{ids[client_id]}")
            wait_for(browser, lambda d: css(d, "[data-testid=rollout-reward]"))
            assert bool(css(browser, "[data-testid=live-view]")) == linked, client_id
            hrefs = [a.get_attribute("href") or "" for a in css(browser, "a")]
            assert not [h for h in hrefs if not h.startswith(("http://", "https://"))], hrefs


DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"


def _axes(driver, testid: str) -> dict:
    return driver.execute_script("""
        const svg = document.querySelector(`[data-testid=${arguments[0]}]`);
        const all = (sel) => [...svg.querySelectorAll(sel)].map((t) => t.textContent);
        return {x: all('text.x-tick'), y: all('text.y-tick'), xLabel: all('text.x-label')[0] || null,
                yLabel: all('text.y-label')[0] || null, empty: all('[data-testid=chart-empty]')[0] || null};""", testid)


def test_charts_have_axes_and_units_a_rollout_shows_its_instruction_and_cancelled_is_not_failed(
        our_monitor, browser, tmp_path):
    """Issue 62 item 5: every chart has an x axis (the step, named by its numbering) and a y axis (the quantity and
    its unit), both with ticks; an empty held-out chart says why; the rollout page shows the task instruction the
    agent got; the episodes the run's end cancelled in flight are "cancelled", not "failed". With
    CUA_RL_DOCS_IMG=1 the run page's screenshot is written to docs/img."""
    monitor, token = our_monitor
    with training_run(monitor.url, "p1", "cua", "docs", token=token) as tid:
        for step in range(6):
            asyncio.run(send_sample_run(monitor.url, token, tid, step=step,
                                        rewards=(1.0, 0.0, 1.0 if step >= 2 else 0.0, 1.0 if step >= 4 else 0.0)))
            _trainer_sends(monitor.url, token, update_record(tid, step, train_step=step + 1, stats={
                "ppo_actor/update/actor_loss/avg": 0.02 - 0.005 * step, "ppo_actor/update/entropy/avg": 1.9 - 0.1 * step,
                "ppo_actor/update/grad_norm": 0.8 + 0.1 * step, "ppo_actor/update/lr": 5e-6,
                "ppo_actor/update/approx_kl/avg": 1e-4 * (step + 1), "sampler_logprob_gap": 0.002},
                health={"staleness": 0.0}, anomalies=[]))
        asyncio.run(send_sample_run(monitor.url, token, tid, step=6, rewards=(1.0, 1.0), cancelled=2))
    browser.set_window_size(1400, 1800)
    browser.get(f"{monitor.url}/{tid}")
    wait_for(browser, lambda d: len(css(d, "[data-testid=chart-reward_mean] circle.point")) == 7)
    charts = [e.get_attribute("data-testid") for e in css(browser, "svg.chart")]
    assert {"chart-reward_mean", "chart-success_rate", "chart-heldout", "chart-loss", "chart-lr"} <= set(charts)
    for testid in charts:
        axes = _axes(browser, testid)
        if testid == "chart-heldout":
            assert axes["empty"] == "no held-out evaluation in this run (no eval split)", axes
            continue
        assert len(axes["x"]) >= 2 and len(axes["y"]) >= 2 and axes["xLabel"] and axes["yLabel"], (testid, axes)
    reward = _axes(browser, "chart-reward_mean")
    assert reward["xLabel"] == "policy version sampled (= step − 1)" and reward["yLabel"] == "reward (gym score, 0–1)"
    assert reward["x"][0] == "0" and reward["x"][-1] == "6" and reward["y"][0] == "0"
    success = _axes(browser, "chart-success_rate")
    assert success["y"][0] == "0%" and success["y"][-1] == "100%" and success["yLabel"] == "success (% of episodes)"
    loss = _axes(browser, "chart-loss")
    assert loss["xLabel"] == "training step" and loss["x"][0] == "1" and loss["x"][-1] == "6", loss
    assert _axes(browser, "chart-entropy")["yLabel"] == "entropy (nats per token)"
    # the cancelled episodes: cancelled in the list and in their step's summary, never failed
    wait_for(browser, lambda d: css(d, "[data-testid=rollout-row]"))
    statuses = [e.text for e in css(browser, "#rollouts [data-testid=status]")]
    assert statuses.count("cancelled") == 2 and "failed" not in statuses, statuses
    if os.environ.get("CUA_RL_DOCS_IMG") == "1":
        browser.save_screenshot(str(tmp_path / "monitor-run-axes.png"))

    rollouts = httpx.get(f"{monitor.url}/api/trainings/{tid}/rollouts?status=cancelled").json()["rollouts"]
    browser.get(f"{monitor.url}/rollouts/{rollouts[0]['id']}")
    wait_for(browser, lambda d: css(d, "[data-testid=rollout-error]"))
    assert css(browser, "h1 [data-testid=status]")[0].text == "cancelled"
    assert css(browser, "[data-testid=rollout-error]")[0].text.startswith("cancelled: the run stopped")
    best = httpx.get(f"{monitor.url}/api/trainings/{tid}/rollouts?status=completed&min_reward=1").json()["rollouts"][0]
    browser.get(f"{monitor.url}/rollouts/{best['id']}")
    wait_for(browser, lambda d: d.execute_script(
        "const i = document.querySelector('[data-testid=screenshot]'); return i && i.complete && i.naturalWidth"))
    assert css(browser, "[data-testid=instruction]")[0].text == f"instruction: {INSTRUCTION}"
    if os.environ.get("CUA_RL_DOCS_IMG") == "1":
        shutil.copy(tmp_path / "monitor-run-axes.png", DOCS_IMG / "monitor-run-axes.png")
