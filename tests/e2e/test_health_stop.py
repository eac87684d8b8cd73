"""Runs that stop themselves on garbage, naming the cause (cua_rl/trainer/health.py): an agent that cannot
reach the policy endpoint, and weight updates that never reach vLLM (the second test, below).

The agent service is given a policy URL that does not route to the endpoint (``policy.advertised_host`` on an
address nobody listens on: what an agent on another host gets when the endpoint binds or advertises the wrong
interface). Every episode is lost, every group rejected, and AReaL would wait for a batch forever (this is how
the issue's run sat silent for minutes). The run must stop by itself within its first step: exit code 3, the
``[cua-rl] health`` line on the console with the cause and what to check, the summary's cause naming the
invariant and 'policy unreached', and nothing left running. ``health.stall_seconds`` is short so the test
is; the check is the same at the default 60 s. The other provoked stops and a healthy run: bench/health_bench.py
(docs/health.md).
"""

import math
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from cua_rl.http.serve import free_port
from cua_rl.trainer.progress import read_metrics
from cua_rl.trainer.weight_probe import real_update
from tests.hosts import Service, left_behind, pids, stop
from tests.warm_starts import trains_from_pinned

ROOT = Path(__file__).resolve().parents[2]
# the one-turn recipe: the quickest run of the embedded stack (this test needs no learning, and the
# multi-turn default runs episodes of up to 6 turns)
LEARN = ROOT / "examples" / "cua_agent" / "config.learn.yaml"
MULTITURN = ROOT / "examples" / "cua_agent" / "config.multiturn.yaml"   # the README's recipe
pytestmark = [pytest.mark.e2e, pytest.mark.desktop, pytest.mark.timeout(900)]


# the one-turn recipe, small and without a warm start (the policy section is part of its key, and a run that
# stops in its first step needs no trained model)
SMALL_UNTRAINED = ["--config", str(LEARN), "train_dataset.batch_size=1", "gconfig.n_samples=2", "sft.warm_start=false"]


# The weight-update run also trains with a KL penalty to its starting weights and an entropy term (both small:
# the run is about its weights, not what they learn), which the test then finds in its statistics. A KL penalty
# needs token group weights (cua_rl.deploy.check_kl_weight; the multiturn recipe's are equal).
ENTROPY_BONUS = 0.001
REGULARISED = ["actor.kl_ctl=0.02", "trajectory.group_weight=tokens", f"entropy_bonus={ENTROPY_BONUS}"]
# The stale-weights run stops at its first real update, which needs a group whose rewards differ: the pinned warm
# start scores most groups alike (the drill draws yellow three times in four), and CI's run of 2026-11-30 had its
# first mixed group at step 4, past the old limit of 3 steps. Eight steps leave room; the run ends at the stop.
STALE_STEPS = 8


def _train(tmp_path: Path, env: dict, args: list[str], steps: int = 4) -> tuple[int, str]:
    """``train.sh`` with ``args`` for at most ``steps`` steps, in its own process group: a timeout ends the whole
    run."""
    log = tmp_path / "train_sh.log"
    with open(log, "w") as sink:
        proc = subprocess.Popen(["bash", str(ROOT / "examples/cua_agent/train.sh"), f"total_train_steps={steps}", *args],
                                cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(800)
        except subprocess.TimeoutExpired:
            rc = stop(proc, timeout_s=120)
    return rc, log.read_text(errors="replace")


def test_a_run_whose_agent_cannot_reach_the_policy_endpoint_stops_itself(tmp_path):
    env = {**os.environ, "CUA_RL_FILEROOT": str(tmp_path / "fileroot"), "CUA_RL_DEVICE": "cpu"}
    env.pop("GYM_BASE_URL", None)
    xvfb_before, vllm_before = pids("^Xvfb", here=True), pids("areal_vllm_server", here=True)
    started = time.monotonic()
    rc, out = _train(tmp_path, env, [*SMALL_UNTRAINED, "trial_name=unreached", "policy.advertised_host=127.0.0.2",
                                     "health.stall_seconds=10"])
    print(f"health stop e2e: exit code {rc} after {time.monotonic() - started:.0f} s")
    assert rc == 3, out[-5000:]
    health = re.search(r"^\[cua-rl\] health step 1: infra_lost_share 1 \(> 0.5; stop\): .*$", out, re.M)
    assert health and "policy unreached" in health.group(0) and "Check:" in health.group(0), out[-5000:]
    assert "[cua-rl] training STOPPED by a health check (exit code 3)" in out
    cause = re.search(r"^\[cua-rl\] cause: +a health check stopped the run: infra_lost_share 1 .*policy unreached",
                      out, re.M)
    assert cause, out[-3000:]
    assert "the trainer failed; the last" not in out, "a health stop is not shown as a crash"
    assert re.search(r"episodes: +0 evaluated, \d+ lost .*policy unreached \d+", out), out[-3000:]
    rollout_log = next((tmp_path / "fileroot" / "logs").glob("*/*/unreached/rollout.log")).read_text(errors="replace")
    assert "could not reach the policy endpoint at http://127.0.0.2:" in rollout_log
    _assert_the_run_page_names_the_stop(next((tmp_path / "fileroot" / "logs").glob("*/*/unreached/monitor/monitor.db")))
    assert not left_behind("^Xvfb", xvfb_before), "Xvfb processes left behind"
    assert not left_behind("areal_vllm_server", vllm_before), "vLLM processes left behind"


def _assert_the_run_page_names_the_stop(db: Path) -> None:
    """The embedded Training Monitor's run page lists the check that stopped the run, on the step it stopped."""
    from cua_rl.monitor import views
    from cua_rl.monitor.store import Store, sqlite_url

    store = Store.open(sqlite_url(db))
    try:
        [run] = views.trainings(store)
        [found] = views.training(store, run["id"])["anomalies"]
        assert (found["name"], found["action"], found["train_step"], found["step"]) == \
            ("infra_lost_share", "stop", 1, 0), found
        assert "policy unreached" in found["line"]
    finally:
        store.close()


def test_a_run_whose_weight_updates_never_reach_vllm_stops_itself(tmp_path):
    """vLLM acknowledges every weight update and keeps its first weights (tests/doubles/stale_vllm.py, a test
    double of AReaL's worker extension): AReaL labels every output with the new version, and only the
    weight probe sees it (cua_rl/trainer/weight_probe.py). The run must stop after the first update that
    changed the trainer's weights, naming ``weights_unchanged``: the first step whose groups' rewards differ
    (no recipe trains a step at learning rate 0). The README's recipe from its pinned warm start (the one CI's
    learning gate trains from), so the groups' rewards differ and the updates are real.

    The run takes the path of a user with a gym of their own and no agent service: the gym is a process of
    its own (``cua-gym serve``) given with ``--gym``, and ``--agent embedded`` starts our agent service beside
    the trainer; the updates being real shows its episodes were played and scored. It also carries the KL
    penalty and the entropy term (``REGULARISED``), checked in its statistics."""
    env = {**os.environ, "CUA_RL_FILEROOT": str(tmp_path / "fileroot"), "CUA_RL_DEVICE": "cpu"}
    for name in ("GYM_BASE_URL", "GYM_ID", "GBOX_MINI_AGENT_BASE_URL", "CUA_AGENT"):
        env.pop(name, None)
    vllm_before, workers_before = pids("areal_vllm_server", here=True), pids("cua_rl.areal_ext.worker", here=True)
    gym = Service(["cua_rl.local_gym", "serve", "--gym-id", "desktop", "--pool-size", "2"], free_port(), tmp_path,
                  "gym")
    gym.start()
    try:
        rc, out = _train(tmp_path, env, ["--config", str(MULTITURN), *trains_from_pinned("multiturn"),
                                         "--gym", gym.url, "--gym-id", "desktop",
                                         "--agent", "embedded", "trial_name=stale",
                                         "vllm.worker_extension_cls=tests.doubles.stale_vllm.IgnoresWeightUpdates",
                                         *REGULARISED], steps=STALE_STEPS)
    finally:
        gym.stop()
    assert re.search(r"embedded agent service at http://127\.0\.0\.1:\d+, playing the tasks of the gym at "
                     + re.escape(gym.url), out), out[-5000:]
    assert rc == 3, out[-5000:]
    line = re.search(r"^\[cua-rl\] health step (\d): weights_unchanged 1 \(> 0; stop\): .*$", out, re.M)
    assert line and "1 of 1 servers" in line.group(0), out[-5000:]
    # it stopped at the first step whose update was real (steps whose groups all scored alike train on the KL
    # and entropy terms alone: an SGD step the canary cannot see, which the probe does not judge)
    logs = next((tmp_path / "fileroot" / "logs").glob("*/*/stale"))
    optimizer = yaml.safe_load((logs / "config.yaml").read_text())["actor"]["optimizer"]   # the run's own
    real = [r["step"] for r in read_metrics(logs) if real_update(r, optimizer["type"], optimizer["gradient_clipping"])]
    assert real and int(line.group(1)) == real[0], (line.group(0), real)
    print(f"stale weights: stopped at step {line.group(1)}, its first real update")
    assert re.search(r"^\[cua-rl\] cause: +a health check stopped the run: weights_unchanged 1", out, re.M), out[-3000:]
    _assert_the_regularisers_trained(logs)
    assert not left_behind("areal_vllm_server", vllm_before), "vLLM processes left behind"
    assert not left_behind("cua_rl.areal_ext.worker", workers_before), \
        "training workers (actor or ref) left behind"


def _assert_the_regularisers_trained(logs: Path) -> None:
    """Issue 37 item 2, on the same run: the KL penalty's reference model (a second engine at the starting
    weights in the actor's own worker, ``reference_model``: issue 59 item 4) and the entropy term both ran, and
    every update's statistics carry them: the entropy term is its coefficient times the mean entropy, the KL
    penalty's reward and the sampler-vs-trained KL are there too (the names the monitor's run page charts,
    records.UPDATE_STATS)."""
    from cua_rl.monitor.records import UPDATE_STATS
    from cua_rl.run.summary import read_scalars

    actor_log = (logs / "actor.log").read_text(errors="replace")
    assert "Engine 'ref/0'" in actor_log and "instantiated successfully" in actor_log, "no reference engine ran"
    assert not (logs / "ref.log").exists(), "the reference got a worker process of its own"
    scalars = read_scalars(logs)
    steps = {name: dict(scalars.get(UPDATE_STATS[name], [])) for name in ("entropy", "entropy_bonus", "kl_reward",
                                                                           "behave_kl")}
    assert steps["entropy_bonus"] and steps["entropy_bonus"].keys() == steps["entropy"].keys(), steps
    for step, bonus in steps["entropy_bonus"].items():
        assert bonus == pytest.approx(ENTROPY_BONUS * steps["entropy"][step], rel=1e-3), (step, steps)
        assert math.isfinite(steps["kl_reward"][step]) and step in steps["behave_kl"], (step, steps)
