"""train.sh flag translation, .env precedence, masking and errors (train.sh --dry-run as a subprocess)."""

import pytest

from trainsh import ALL_FLAGS, ALL_OVERRIDES, ENV_FOR_FLAGS, EXAMPLE, clean_env, copy_example, run

ISSUE_ARGS = ["--dry-run", "--gym", "http://gym.example:5010", "--gym-id", "g1", "--batch-size", "8",
              "--project-token", "SECRET", "actor.optimizer.lr=1e-6"]


def test_issue_example_prints_overrides_and_never_the_token():
    r = run(ISSUE_ARGS)
    assert r.returncode == 0, r.stderr
    for expected in ("gym_base_url=http://gym.example:5010", "gym_id=g1", "train_dataset.batch_size=8",
                     "actor.optimizer.lr=1e-6"):
        assert expected in r.stdout
    assert "SECRET" not in r.stdout + r.stderr
    assert "PROJECT_TOKEN=****" in r.stdout
    assert r.overrides == ["gym_base_url=http://gym.example:5010", "gym_id=g1", "train_dataset.batch_size=8",
                           "valid_dataset.batch_size=8", "actor.optimizer.lr=1e-6"]
    assert r.argv[:5] == ["python", "-m", "cua_rl.launch", "--config", r.config]
    assert "--embedded" not in r.argv and r.mode == "external gym http://gym.example:5010"
    assert r.launch_overrides == r.overrides


def test_unknown_flag_fails_naming_it():
    r = run(["--bogus"])
    assert r.returncode != 0
    assert "--bogus" in r.stderr and "--help" in r.stderr
    r = run(["--dry-run", "--gym-idd", "x"])
    assert r.returncode != 0 and "'--gym-idd'" in r.stderr


def test_help_lists_every_flag():
    r = run(["--help"])
    assert r.returncode == 0
    for flag in ("--gym ", "--gym-id", "--gbox-mini-url", "--gbox-mini-agent-base-url", "--gbox-agent",
                 "--standard-action-space", "--model-base-url", "--inference-base-url", "--model-name",
                 "--monitor-base-url", "--project-id", "--project-token", "--batch-size", "--max-turns",
                 "--max-task-time", "--max-step-time", "--max-concurrent-rollouts", "--gym-train-ratio",
                 "--gym-seed", "--gym-limit", "--gym-tags", "--gym-eval-number-range", "--config", "--dry-run"):
        assert flag in r.stdout, flag


def test_every_flag_becomes_its_override():
    r = run(["--dry-run", *ALL_FLAGS])
    assert r.returncode == 0, r.stderr
    assert r.overrides == ALL_OVERRIDES
    assert "tok" not in r.stdout.replace("token", "")


def test_every_environment_variable_falls_back_for_its_flag():
    r = run(["--dry-run"], env=clean_env(**ENV_FOR_FLAGS))
    assert r.returncode == 0, r.stderr
    assert r.overrides == ALL_OVERRIDES


def test_flags_beat_the_environment_and_aliases_work():
    env = clean_env(GYM_ID="from-env", BATCH_SIZE="3", MODEL_BASE_URL="http://127.0.0.1:1/v1")
    r = run(["--dry-run", "--gym-id=from-flag", "--inference-base-url", "http://127.0.0.1:2/v1",
             "--gbox-mini-agent-base-url", "http://127.0.0.1:4"], env=env)
    assert r.overrides == ["gym_id=from-flag", "gbox_mini_agent_base_url=http://127.0.0.1:4",
                           "model_base_url=http://127.0.0.1:2/v1", "train_dataset.batch_size=3",
                           "valid_dataset.batch_size=3"]


def test_no_gym_means_embedded():
    r = run(["--dry-run"])
    assert r.returncode == 0 and r.overrides == []
    assert r.mode.startswith("embedded") and r.argv[-2:] == ["--embedded", "--"]


def test_gym_url_from_an_override_also_means_external():
    r = run(["--dry-run", "gym_base_url=http://127.0.0.1:7"])
    assert r.mode == "external gym http://127.0.0.1:7" and "--embedded" not in r.argv
    r = run(["--dry-run", "gym_base_url="], env=clean_env(GYM_BASE_URL="http://127.0.0.1:7"))
    assert r.mode.startswith("embedded") and "--embedded" in r.argv


def test_passthrough_overrides_come_last_and_secrets_are_masked():
    r = run(["--dry-run", "--max-turns", "5", "+foo.bar=1", "max_turns=9", "project_token=hunter2",
             "rollout.agent.admin_api_key=k3y", "--", "actor.path=/models/x"])
    assert r.returncode == 0, r.stderr
    assert r.overrides == ["max_turns=5", "+foo.bar=1", "max_turns=9", "project_token=****",
                           "rollout.agent.admin_api_key=****", "actor.path=/models/x"]
    assert "hunter2" not in r.stdout + r.stderr and "k3y" not in r.stdout + r.stderr
    assert "warning: project_token given as an override" in r.stderr
    assert "project_token=****" in r.argv
    # keys that merely contain "token" are not secrets
    r = run(["--dry-run", "actor.mb_spec.max_tokens_per_mb=8192"])
    assert r.overrides == ["actor.mb_spec.max_tokens_per_mb=8192"]


def test_values_that_hydra_would_misread_are_quoted():
    r = run(["--dry-run", "--gym-id", "007", "--model-name", "Qwen 3,VL", "--gbox-agent", "true"])
    assert r.overrides == ["gym_id='007'", "gbox_mini_agent_agent='true'", "model_name='Qwen 3,VL'"]


@pytest.mark.parametrize("args, message", [
    (["--batch-size", "x"], "BATCH_SIZE / its flag must be an integer >= 1, got 'x'"),
    (["--batch-size", "0"], "must be an integer >= 1"),
    (["--gym-train-ratio", "1.5"], "must be a number in [0, 1]"),
    (["--gym-tags", "easy,a;b"], "bad tag 'a;b'"),
    (["--gym-eval-number-range", "1-x"], "expected e.g. 001-032"),
    (["--gym"], "--gym needs a value"),
    (["stray"], "unexpected argument 'stray'"),
    (["--config", "/nonexistent/cfg.yaml"], "config file not found: /nonexistent/cfg.yaml"),
])
def test_bad_values_fail_clearly(args, message):
    r = run(["--dry-run", *args])
    assert r.returncode != 0
    assert message in r.stderr


def test_config_choice():
    given = run(["--dry-run", "--config", "examples/cua_agent/config.yaml"])
    assert given.config == str(EXAMPLE / "config.yaml")  # relative to the caller's directory, made absolute
    from_env = run(["--dry-run"], env=clean_env(CUA_CONFIG=str(EXAMPLE / "config.cpu.yaml")))
    assert from_env.config == str(EXAMPLE / "config.cpu.yaml")
    # no GPU: the embedded stack runs the learning recipe, a user's gym the plain CPU stack
    cpu = clean_env(CUA_RL_DEVICE="cpu")
    assert run(["--dry-run"], env=cpu).config == str(EXAMPLE / "config.learn.yaml")
    assert run(["--dry-run", "--gym", "http://gym:5010", "--gym-id", "g"], env=cpu).config == \
        str(EXAMPLE / "config.cpu.yaml")
    assert run(["--dry-run"], env=clean_env(CUA_RL_DEVICE="gpu")).config == str(EXAMPLE / "config.yaml")


def test_dry_run_needs_no_python_environment(tmp_path):
    """Only the real run sources scripts/env.sh (the multi-GB install); a dry run is plain bash."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    r = run(ISSUE_ARGS, env=env)
    assert r.returncode == 0, r.stderr
    assert "nothing is started" in r.stdout and "[setup]" not in r.stderr


# --- .env files --------------------------------------------------------------------------------
def test_env_files_precedence(tmp_path):
    script = copy_example(tmp_path)
    example_dir, repo = script.parent, script.parent.parent.parent
    (example_dir / ".env").write_text(
        "# example .env\nGYM_ID=from-example\nMAX_TURNS=3\nGYM_LIMIT=4\nGBOX_AGENT=\"mai-ui\"  \n"
        "export MODEL_NAME='quoted # not a comment'\nGYM_SEED=5 # trailing comment\n")
    (repo / ".env").write_text("GYM_ID=from-root\r\nMAX_TURNS=6\r\nGYM_LIMIT=\r\n")
    env = clean_env(MAX_TURNS="8")
    r = run(["--dry-run", "--gym-limit", "2"], env=env, script=script)
    assert r.returncode == 0, r.stderr
    # root .env beats example .env; the shell beats both; flags beat everything; empty = unset
    assert r.overrides == ["gym_id=from-root", "gbox_mini_agent_agent=mai-ui", "model_name='quoted # not a comment'",
                           "max_turns=8", "gym_seed=5", "gym_limit=2"]
    r = run(["--dry-run"], env=clean_env(), script=script)
    assert "gym_limit=4" in r.overrides and "max_turns=6" in r.overrides


def test_env_file_token_is_masked_and_not_an_override(tmp_path):
    script = copy_example(tmp_path)
    (script.parent / ".env").write_text("PROJECT_TOKEN=s3cr3t-from-file\nMONITOR_BASE_URL=http://127.0.0.1:9\n")
    r = run(["--dry-run"], env=clean_env(), script=script)
    assert r.returncode == 0, r.stderr
    assert "s3cr3t" not in r.stdout + r.stderr
    assert r.overrides == ["monitor_base_url=http://127.0.0.1:9"] and "PROJECT_TOKEN=****" in r.stdout


def test_malformed_env_file_names_file_and_line(tmp_path):
    script = copy_example(tmp_path)
    (script.parent / ".env").write_text("GYM_ID=a\n\nthis is not an assignment\n")
    r = run(["--dry-run"], env=clean_env(), script=script)
    assert r.returncode != 0
    assert f"{script.parent / '.env'}:3: expected KEY=value" in r.stderr


def test_real_run_without_launcher_says_what_is_missing(tmp_path):
    """The copy has no cua_rl/launch.py: the real run stops before any install with a clear message."""
    script = copy_example(tmp_path)
    r = run([], env=clean_env(), script=script)
    assert r.returncode != 0 and "cua_rl/launch.py is missing" in r.stderr


def test_env_example_documents_every_variable_and_holds_no_values():
    text = (EXAMPLE / ".env.example").read_text()
    for var in ("GYM_BASE_URL", "GYM_ID", "GBOX_MINI_AGENT_BASE_URL", "GBOX_AGENT", "STANDARD_ACTION_SPACE",
                "MODEL_BASE_URL", "MODEL_NAME", "MONITOR_BASE_URL", "PROJECT_ID", "PROJECT_TOKEN",
                "MONITOR_PROJECT_TOKEN", "BATCH_SIZE", "MAX_TURNS", "MAX_TASK_TIME", "MAX_STEP_TIME",
                "MAX_CONCURRENT_ROLLOUTS", "GYM_TRAIN_RATIO", "GYM_SEED", "GYM_LIMIT", "GYM_TAGS",
                "GYM_EVAL_NUMBER_RANGE", "CUA_CONFIG", "CUA_RL_FILEROOT"):
        assert f"{var}=" in text, var
    # every documented variable is empty in the example: no addresses or secrets are committed
    for line in text.splitlines():
        if line and not line.startswith("#"):
            assert line.split("=", 1)[1].split("#")[0].strip() == "", line


def test_real_run_execs_the_launcher_with_the_dry_run_argv_and_the_token_in_the_environment(tmp_path):
    """STAND-IN for scripts/env.sh and the launcher: the copy's env.sh puts a `python` first on PATH that
    records its argv, working directory and PROJECT_TOKEN. Checks the hand-over, not the launcher."""
    script = copy_example(tmp_path)
    repo = script.parent.parent.parent
    (script.parent / "cua_rl").mkdir()
    (script.parent / "cua_rl" / "launch.py").write_text("# stand-in\n")
    bin_dir, record = tmp_path / "bin", tmp_path / "record.txt"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(
        f'#!/bin/bash\n{{ pwd; echo "TOKEN=${{PROJECT_TOKEN:-}}"; printf "%s\\n" "$@"; }} > {record}\n')
    (bin_dir / "python").chmod(0o755)
    (repo / "scripts").mkdir()
    (repo / "scripts" / "env.sh").write_text(f'export PATH="{bin_dir}:$PATH"\n')
    args = ["--gym", "http://127.0.0.1:5010", "--gym-id", "g1", "--project-token", "SECRET", "max_turns=4"]
    dry = run(["--dry-run", *args], script=script, cwd=tmp_path)
    real = run(args, script=script, cwd=tmp_path)
    assert real.returncode == 0, real.stderr
    cwd, token, *argv = record.read_text().splitlines()
    assert cwd == str(repo) and token == "TOKEN=SECRET"
    assert ["python", *argv] == dry.argv and "SECRET" not in " ".join(argv)
