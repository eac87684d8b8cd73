"""The README's main command, run in full, and the learning gate over that one run.

The run is ``bench/learning_bench.py --recipe multiturn --rl-seeds 1 --no-control --greedy-only``: the
README's ``train.sh`` on a machine without a GPU (config.multiturn.yaml: the key-sequence curriculum family,
three key presses with the reward only at the end, one of them "the previous key again" so the history
matters; the SFT warm start of a demonstrator biased to see yellow as red; GRPO through the embedded stack:
Xvfb desktops, the agent service, the policy endpoint, AReaL's vLLM on the CPU, AReaL's trainer) for
``STEPS`` steps, then ``python -m cua_rl.evaluate --greedy``: held-out greedy success of the warm start and of
the last step on ``EPISODES`` key-sequence instances no training group draws. One start-up serves two tests
(docs/testing.md: the time budget):

- ``test_grpo_flips_the_biased_slice_and_serves_every_step``, the learning gate: GRPO raises held-out greedy
  success by ``MARGIN`` with a paired bootstrap interval above 0, and on the slice where the warm start's
  demonstrator was biased (instances that show yellow) greedy success goes from at most ``SLIP_BEFORE`` up by
  at least ``SLIP_GAIN``. Sharpening the warm start cannot do that: its greedy choice there is the wrong key
  (the shuffled-rewards control, docs/learning.md: 0.06 -> 0.00 on that slice). A sign error in the
  advantages, rewards on the wrong rows, a shifted loss mask, a wrong image in a row or a weight update that
  never reaches vLLM would each leave that slice wrong. The sampled rollouts must not collapse meanwhile
  (success of the last steps at most ``COLLAPSE`` below the first steps') and every step's weights must have
  been served: vLLM loaded weight versions 1, 2, ... in order.
- ``test_the_readme_command_trains_through_the_whole_stack_and_reports_it``: what the user of the README's
  command sees and gets: the kept warm start used, one console line per step instead of AReaL's table, the
  disk weight update that vLLM's CPU worker loaded, every policy turn's prompt ids verified against vLLM with
  0 mismatches, loadable checkpoints, statistics with the reward, the summary lines, the embedded Training
  Monitor holding the trainer's recomputed logprobs beside vLLM's, and nothing left running. (The baseline
  evaluation before step 1, ``baseline_eval``, needs an eval split, which this recipe has not: the Ctrl-C
  test's run checks it, tests/e2e/test_launch_interrupt.py.)

The warm start's held-out score is measured once per warm start and code version and kept beside it, as the
warm start itself is (bench/learning_bench.py ``baseline_file``: the key hashes the warm start, every file of
``cua_rl``, the recipe and the instances); a change to any of them measures it again.

Greedy decoding makes the score a function of the checkpoint and the instance (no sampling noise), so the
last step alone is scored. The 3-seed run with sampled success, pass@4 and the controls is the bench's
(``python bench/learning_bench.py --recipe multiturn``; docs/learning.md), not CI's: CI's time budget
(docs/testing.md) pays for one GRPO run. The one-turn recipe (config.learn.yaml), the gate before this one,
rose from a warm start that already preferred the right key, which sharpening alone can give, and its
scores varied widely from run to run (docs/learning.md).
"""

import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cua_rl.areal_ext.health import BY_NAME
from cua_rl.run.launch import load_config

ROOT = Path(__file__).resolve().parents[2]
STEPS = 16                    # the recipe's (config.multiturn.yaml says why 16)
EPISODES = 128                # held-out instances, each played once greedily
# The rise of held-out greedy success and the gain on the yellow slice. From the warm start of the last machine
# (yellow 0.16) 12 steps gave +0.34 and +0.35 (yellow 0.95); from this machine's (yellow 0.035) GRPO is slower
# and varies more: +0.36, +0.33 and +0.12 at step 16 (yellow 0.82, 0.77, 0.28; the interval of the last
# [0.06, 0.18]), +0.09 at step 12. What the gate must catch went below 0 (from the earlier warm starts): the
# shuffled-rewards and shuffled-screenshots controls, -0.05 and -0.07 (interval [-0.12, -0.03]), yellow to 0.00
# (docs/learning.md). The gate asks for a rise that is real (interval above 0) and a gain on the slice where
# the warm start is wrong, not for how fast a run gets there.
MARGIN = 0.1
# the yellow slice: the warm start is wrong there (greedy 0.16 and 0.035 measured, two machines)
SLIP_BEFORE, SLIP_GAIN = 0.2, 0.2
# How far the sampled rollouts' success may fall from the first third of the policy versions to the last: the
# one-turn recipe's collapse fell to about 0 (docs/learning.md); from this machine's warm start one 16-step run
# fell 0.72 -> 0.49 (one version at 0.25) while its greedy success still rose 0.56 -> 0.68.
COLLAPSE = 0.3

pytestmark = [pytest.mark.e2e, pytest.mark.desktop, pytest.mark.timeout(2400)]


def _pids(pattern: str) -> set[int]:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


@pytest.fixture(scope="module")
def gate_run(tmp_path_factory):
    """The bench's one run: (its JSON, the GRPO run's console output, its log dir, its checkpoint dir)."""
    tmp = tmp_path_factory.mktemp("learning-gate")
    env = {**os.environ, "CUA_RL_DEVICE": "cpu"}
    env.pop("GYM_BASE_URL", None)
    xvfb_before, vllm_before = _pids("^Xvfb"), _pids("areal_vllm_server")
    out = tmp / "learning.json"
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "learning_bench.py"), "--recipe", "multiturn", "--rl-seeds", "1",
         "--no-control", "--greedy-only", "--steps", str(STEPS), "--seeds-per-task", str(EPISODES),
         "--workdir", str(tmp / "work"), "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=2300)
    print(f"learning bench: {time.monotonic() - started:.0f} s (exit code {proc.returncode})")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    fileroot = tmp / "work" / "fileroot"
    logs = next(fileroot.glob("logs/*/cua-learn-multiturn/grpo-s1"))
    ckpts = next(fileroot.glob("checkpoints/*/cua-learn-multiturn/grpo-s1"))
    time.sleep(2)
    left = {"Xvfb": _pids("^Xvfb") - xvfb_before, "vLLM": _pids("areal_vllm_server") - vllm_before}
    return json.loads(out.read_text()), (tmp / "work" / "grpo-s1.log").read_text(errors="replace"), logs, ckpts, left


def test_grpo_flips_the_biased_slice_and_serves_every_step(gate_run):
    result, _, _, _, _ = gate_run
    [run] = result["seeds"]
    print(f"LEARNING GATE: held-out greedy success {result['greedy_before']:.3f} (warm start) -> "
          f"{result['greedy_after']:.3f} at step {STEPS}, paired 95% interval of the rise {result['rise_ci95']}; "
          f"biased slice {result['slip_greedy_before']} -> {result['slip_greedy_after']}; turns per episode "
          f"{result['turns_per_episode']}; rollout success per step {run['rollout_success']}; "
          f"{result['episodes_per_checkpoint']['greedy']} instances; warm start's score "
          f"{'kept' if result['baseline']['reused'] else 'measured now'}; wall {result['wall_s']}")
    assert result["episodes_per_checkpoint"]["greedy"] == EPISODES
    assert result["dropped_episodes"] == 0 and result["model_errors"] == 0, result
    # the warm start's greedy choice is wrong where its demonstrator was biased: it can be flipped, not sharpened
    assert result["slip_greedy_before"] <= SLIP_BEFORE and result["greedy_before"] <= 1 - MARGIN, result
    assert result["greedy_rise"] >= MARGIN and result["rise_ci95"][0] > 0, result
    assert result["slip_greedy_after"] >= result["slip_greedy_before"] + SLIP_GAIN, result
    # the sampled policy did not collapse while its greedy choice flipped: the sampled success of the last third
    # of the policy versions that trained (16 episodes each, temperature 1; the run's monitor files each episode
    # under the version that started it) is not more than COLLAPSE below the first third's. Sampled
    # success hardly moves in a run this short (it starts near 0.7: sampling finds the right key on the biased slice
    # now and then), so "the last third above the first" was a coin flip: first -> last third means (per step) of
    # 0.72 -> 0.78 and 0.69 -> 0.90 (session 6's seeds), 0.72 -> 0.88 and 0.69 -> 0.59 (two CI runs, held-out
    # greedy 0.93 and 0.95 in both); the one-turn recipe's collapse (docs/learning.md) fell to about 0.
    # The last versions may have started no episode: AReaL fills a step's batch with episodes up to
    # max_head_offpolicyness versions old, so the last steps can train on what earlier versions started, and
    # what the last version starts is cut off when the run ends (one CI run: versions 0-10 had 16 episodes or
    # more, version 11 none). Every earlier version has episodes; the thirds are over those that have.
    success = run["rollout_success"]
    lag = load_config(str(ROOT / result["config"]), result["overrides"]).rollout.max_head_offpolicyness
    seen = [s for s in success if s is not None]
    assert len(success) == STEPS and None not in success[:STEPS - lag], success
    third = len(seen) // 3
    first, last = sum(seen[:third]) / third, sum(seen[-third:]) / third
    assert last >= first - COLLAPSE, success
    # every step's weights reached the model that served the next rollouts, in order (AReaL's disk update)
    assert run["served_versions"][:STEPS - 1] == list(range(1, STEPS)), run["served_versions"]


def test_the_readme_command_trains_through_the_whole_stack_and_reports_it(gate_run):
    from cua_rl.run.summary import read_scalars

    _, out, logs, ckpts, left = gate_run
    # the default trains from the kept SFT warm start, not from the random tiny model
    assert re.search(r"training from the SFT warm start \S+/warm-starts/sft-[0-9a-f]{16}", out), out[-4000:]
    # PPO steps ran and their weights reached vLLM (disk update -> /areal_update_weights -> worker extension)
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
    assert proof and int(proof.group(1)) >= STEPS and int(proof.group(2)) == 0, out[-3000:]
    # the step checkpoints hold loadable models
    saved = list(ckpts.rglob("config.json"))
    assert saved and any(p.parent.glob("*.safetensors") for p in saved), list(ckpts.rglob("*"))[:20]
    # statistics: the reward of the real episodes was logged
    scalars = read_scalars(logs / "tensorboard")
    assert "rollout/reward" in scalars and "ppo_actor/task_reward/avg" in scalars, sorted(scalars)[:80]
    assert all(0.0 <= v <= 1.0 for _, v in scalars["rollout/reward"])
    assert scalars["rollout/num_turns"][0][1] >= 1  # the policy endpoint recorded real model turns
    # the launcher's summary tells the user where everything went
    assert "[cua-rl] checkpoints:" in out and "[cua-rl] statistics:" in out
    _assert_monitor_has_the_trainer_logprobs(logs / "monitor" / "monitor.db")
    # nothing left running: no desktops, no vLLM (of the run, or of the evaluation after it)
    assert not any(left.values()), f"left running: {left}"


def _assert_monitor_has_the_trainer_logprobs(db: Path) -> None:
    from cua_rl.monitor import views
    from cua_rl.monitor.store import Store, sqlite_url

    store = Store.open(sqlite_url(db))
    try:
        [run] = views.trainings(store)
        training = views.training(store, run["id"])
        assert run["status"] == "completed"
        # the first step's rollouts: long trained and reported by the end (the newest rollouts of a run may be
        # read ahead for a step that never trains, and the last step's values may still be queued at its end)
        # Step 1 is on-policy (both sides hold the warm start, in float32), so the two agree token for token
        # up to arithmetic: CI saw a median of 0, a mean of 2e-5 and one token at 0.016 (the second turn of
        # three identical episodes). A sampler the trainer does not match shows a gap near 0.5 (images
        # swapped) or far above 0.05 (weights not updated): docs/learning.md, tests/policy/test_gates_trainer.py.
        first = views.groups(store, "steps", training["steps"][0]["id"])
        trained, diffs = 0, []
        for member in (m for group in first["groups"] for m in group["members"]):
            rollout = views.rollout(store, member["id"])
            for turn in rollout["turns"]:
                tokens = turn["tokens"]
                if "trainer_logprobs" in tokens:
                    trained += 1
                    turn_diffs = [abs(a - b) for a, b in
                                  zip(tokens["trainer_logprobs"], tokens["logprobs"], strict=True)]
                    assert max(turn_diffs) < BY_NAME["sampler_logprob_gap"].threshold, \
                        (rollout["id"], turn["turn"], max(turn_diffs))
                    diffs += turn_diffs
        assert trained >= 4, trained   # at least one group of 4 episodes
        assert statistics.median(diffs) < 1e-3 and statistics.fmean(diffs) < 1e-3, \
            (statistics.median(diffs), statistics.fmean(diffs))
    finally:
        store.close()
