"""The learning gate: the embedded CPU default (config.learn.yaml: key-colour, the SFT warm start of an imperfect
demonstrator, GRPO) raises held-out success, and the same run with its rewards shuffled within each group
does not. A sign error in the advantages, rewards on the wrong rows, a shifted loss mask, a wrong image in a
row or a weight update that never reaches vLLM would each leave GRPO at or below the warm start.

It is ``bench/learning_bench.py`` with the default recipe: the warm start train.sh builds and keeps
(cua_rl/sft/warm_start.py; the README's command and this test share one build), GRPO and the control for
``STEPS`` steps each through the whole embedded stack, then held-out success of the warm start and of steps
``EVAL_STEPS`` of both runs on ``EPISODES`` key-colour instances no training group draws.

At lr 0.05 one step can break the reply for a step or two before the rewards repair it (docs/learning.md),
so each run is scored by the better of its two last evaluated checkpoints, the same statistic for both.
``MARGIN`` comes from the runs in docs/learning.md ("The learning gate"): GRPO rose +0.26 at step 24, the
control fell to 0.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STEPS = 24
EVAL_EVERY = 20               # evaluates steps 20 and 24
EPISODES = 128
MARGIN = 0.1

pytestmark = [pytest.mark.e2e, pytest.mark.desktop, pytest.mark.timeout(3600)]


def test_grpo_raises_held_out_success_and_shuffled_rewards_do_not(tmp_path):
    env = {**os.environ, "CUA_RL_DEVICE": "cpu"}
    env.pop("GYM_BASE_URL", None)
    out = tmp_path / "learning.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "learning_bench.py"), "--steps", str(STEPS), "--eval-every",
         str(EVAL_EVERY), "--seeds-per-task", str(EPISODES), "--workdir", str(tmp_path / "work"), "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=3500)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    result = json.loads(out.read_text())
    before = result["success_before"]
    grpo = max(p["success"] for p in result["curve"] if p["step"] > 0)
    control = max(p["success"] for p in result["control"]["curve"] if p["step"] > 0)
    print(f"LEARNING GATE: held-out success {before:.3f} (warm start) -> GRPO {grpo:.3f}, shuffled-rewards control "
          f"{control:.3f} (better of steps {[p['step'] for p in result['curve'] if p['step'] > 0]}, "
          f"{result['episodes_per_checkpoint']} episodes each); wall {result['wall_s']}")
    assert result["episodes_per_checkpoint"] == EPISODES
    assert result["dropped_episodes"] == 0 and result["model_errors"] == 0, result
    assert grpo - before >= MARGIN, result
    assert control - before < MARGIN, result
    assert grpo - control >= MARGIN, result
