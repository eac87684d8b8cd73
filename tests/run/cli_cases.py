"""Every train.sh flag with a value, the overrides it must become, and the same values as environment
variables (shared by test_cli.py and tests/config/test_config_loading.py); ``load``, a recipe loaded with overrides
as the launcher loads it (shared by the launcher's and the config's tests: test modules import no other test module)."""

from pathlib import Path

from areal.api.cli_args import load_expr_config

from cua_rl.config import CUAConfig

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "cua_agent"

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


def load(tmp_path: Path, *overrides: str, config: str = "config.yaml") -> CUAConfig:
    """``examples/cua_agent/<config>`` with ``overrides``, its fileroot under ``tmp_path``."""
    cfg, config_file = load_expr_config(
        ["--config", str(EXAMPLE / config), f"cluster.fileroot={tmp_path}", *overrides], CUAConfig)
    assert isinstance(cfg, CUAConfig) and config_file == str(EXAMPLE / config)
    return cfg
