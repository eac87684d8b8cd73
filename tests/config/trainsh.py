"""Run train.sh --dry-run as a subprocess and read its report back."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "cua_agent"
TRAIN_SH = EXAMPLE / "train.sh"
# Variables train.sh reads; cleared so the caller's shell cannot leak into a test.
TRAIN_ENV_VARS = ("GYM_BASE_URL GYM_ID GBOX_MINI_AGENT_BASE_URL GBOX_AGENT STANDARD_ACTION_SPACE MODEL_BASE_URL "
                  "MODEL_NAME MONITOR_BASE_URL PROJECT_ID PROJECT_TOKEN MONITOR_PROJECT_TOKEN BATCH_SIZE MAX_TURNS "
                  "MAX_TASK_TIME MAX_STEP_TIME MAX_CONCURRENT_ROLLOUTS GYM_TRAIN_RATIO GYM_SEED GYM_LIMIT GYM_TAGS "
                  "GYM_EVAL_NUMBER_RANGE CUA_CONFIG").split()

# Every flag with a value, the overrides it must become, and the same values as environment variables.
ALL_FLAGS = ["--gym", "http://127.0.0.1:5010", "--gym-id", "desk", "--gbox-mini-url", "http://127.0.0.1:3100",
             "--gbox-agent", "mai-ui", "--standard-action-space", "mobile", "--model-base-url", "http://127.0.0.1:8000/v1",
             "--model-name", "m1", "--monitor-base-url", "http://127.0.0.1:9000", "--project-id", "p1",
             "--project-token", "tok", "--batch-size", "2", "--max-turns", "7", "--max-task-time", "300",
             "--max-step-time", "30", "--max-concurrent-rollouts", "3", "--gym-train-ratio", "0.5", "--gym-seed", "0",
             "--gym-limit", "10", "--gym-tags", "easy,normal", "--gym-eval-number-range", "001-032"]
ALL_OVERRIDES = ["gym_base_url=http://127.0.0.1:5010", "gym_id=desk", "gbox_mini_agent_base_url=http://127.0.0.1:3100",
                 "gbox_mini_agent_agent=mai-ui", "gbox_mini_agent_standard_action_space=mobile",
                 "model_base_url=http://127.0.0.1:8000/v1", "model_name=m1", "monitor_base_url=http://127.0.0.1:9000",
                 "project_id=p1", "train_dataset.batch_size=2", "valid_dataset.batch_size=2", "max_turns=7",
                 "max_task_time_seconds=300", "max_turn_time_seconds=30", "rollout.max_concurrent_rollouts=3",
                 "gym_train_ratio=0.5", "gym_seed=0", "gym_limit=10", "gym_tags=[easy,normal]",
                 "gym_eval_number_range='001-032'"]
ENV_FOR_FLAGS = {"GYM_BASE_URL": "http://127.0.0.1:5010", "GYM_ID": "desk", "GBOX_MINI_AGENT_BASE_URL": "http://127.0.0.1:3100",
                 "GBOX_AGENT": "mai-ui", "STANDARD_ACTION_SPACE": "mobile", "MODEL_BASE_URL": "http://127.0.0.1:8000/v1",
                 "MODEL_NAME": "m1", "MONITOR_BASE_URL": "http://127.0.0.1:9000", "PROJECT_ID": "p1",
                 "PROJECT_TOKEN": "tok", "BATCH_SIZE": "2", "MAX_TURNS": "7", "MAX_TASK_TIME": "300",
                 "MAX_STEP_TIME": "30", "MAX_CONCURRENT_ROLLOUTS": "3", "GYM_TRAIN_RATIO": "0.5", "GYM_SEED": "0",
                 "GYM_LIMIT": "10", "GYM_TAGS": "easy,normal", "GYM_EVAL_NUMBER_RANGE": "001-032"}


@dataclass
class DryRun:
    returncode: int
    stdout: str
    stderr: str
    mode: str = ""
    config: str = ""
    overrides: list[str] | None = None
    argv: list[str] | None = None  # the printed command, split like a shell would

    @property
    def launch_overrides(self) -> list[str]:
        return self.argv[self.argv.index("--") + 1:]


def clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in TRAIN_ENV_VARS}
    env.update(extra)
    return env


def run(args: list[str], env: dict | None = None, script: Path = TRAIN_SH, cwd: Path = ROOT) -> DryRun:
    proc = subprocess.run(["bash", str(script), *args], capture_output=True, text=True, timeout=60,
                          env=clean_env() if env is None else env, cwd=cwd)
    result = DryRun(proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stdout.splitlines()
    if proc.returncode == 0 and "--dry-run" in args:
        result.mode = next(line for line in lines if line.startswith("mode: "))[6:]
        result.config = next(line for line in lines if line.startswith("config: "))[8:].split(" (")[0]
        start = lines.index("overrides:") + 1
        result.overrides = []
        for line in lines[start:]:
            if not line.startswith("  "):
                break
            result.overrides.append(line.strip())
        command_at = next(i for i, line in enumerate(lines) if line.startswith("command"))
        result.argv = shlex.split(lines[command_at + 1])
    return result


def copy_example(tmp_path: Path) -> Path:
    """A private copy of the example (train.sh + configs) so .env files never touch the shared tree."""
    dest = tmp_path / "repo" / "examples" / "cua_agent"
    dest.mkdir(parents=True)
    for name in ("train.sh", "config.yaml", "config.cpu.yaml", "config.learn.yaml"):
        shutil.copy2(EXAMPLE / name, dest / name)
    return dest / "train.sh"
