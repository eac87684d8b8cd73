"""The command line: cua_rl/run/cli.py's flag table (flags, environment, .env files, quoting, masking), the
launcher's decisions on it (config file, embedded or not, values checked by the config classes, --dry-run),
and train.sh handing every argument to the launcher."""

import os
import subprocess

import pytest

from cli_cases import ALL_FLAGS, ALL_OVERRIDES, ENV_FOR_FLAGS, EXAMPLE, ROOT
from cua_rl.run import cli, launch

RECIPES = launch.RECIPES   # the recipes the launcher picks from (package data; examples/cua_agent links them)

ISSUE_ARGS = ["--gym", "http://gym.example:5010", "--gym-id", "g1", "--batch-size", "8", "--project-token", "SECRET",
              "actor.optimizer.lr=1e-6"]


def parse(args, environ=None, env_files=()):
    return cli.parse(args, environ or {}, list(env_files))


# --- the flag table ----------------------------------------------------------------------------------
def test_every_flag_becomes_its_override_and_the_token_only_an_environment_value():
    request = parse(ALL_FLAGS)
    assert request.overrides == ALL_OVERRIDES
    assert request.environ == {"PROJECT_TOKEN": "tok"}
    assert not any("tok" in o.replace("token", "") for o in request.overrides)
    assert request.flag_keys["train_dataset.batch_size"] == "--batch-size / BATCH_SIZE"


def test_every_environment_variable_falls_back_for_its_flag():
    request = parse([], environ=ENV_FOR_FLAGS)
    assert request.overrides == ALL_OVERRIDES
    assert request.environ == {"PROJECT_TOKEN": "tok"}


def test_flags_beat_the_environment_and_aliases_work():
    request = parse(["--gym-id=from-flag", "--inference-base-url", "http://127.0.0.1:2/v1",
                     "--gbox-mini-agent-base-url", "http://127.0.0.1:4"],
                    environ={"GYM_ID": "from-env", "BATCH_SIZE": "3", "MODEL_BASE_URL": "http://127.0.0.1:1/v1"})
    assert request.overrides == ["gym_id=from-flag", "gbox_mini_agent_base_url=http://127.0.0.1:4",
                                 "model_base_url=http://127.0.0.1:2/v1", "train_dataset.batch_size=3",
                                 "valid_dataset.batch_size=3"]


def test_passthrough_overrides_come_last_and_secrets_are_masked():
    request = parse(["--max-turns", "5", "+foo.bar=1", "max_turns=9", "project_token=hunter2",
                     "rollout.agent.admin_api_key=k3y", "--", "actor.path=/models/x", "~foo.bar"])
    assert request.overrides == ["max_turns=5", "+foo.bar=1", "max_turns=9", "project_token=hunter2",
                                 "rollout.agent.admin_api_key=k3y", "actor.path=/models/x", "~foo.bar"]
    assert [cli.mask(o) for o in request.overrides[3:5]] == ["project_token=****", "rollout.agent.admin_api_key=****"]
    # keys that merely contain "token" are not secrets
    assert cli.mask("actor.mb_spec.max_tokens_per_mb=8192") == "actor.mb_spec.max_tokens_per_mb=8192"


def test_values_that_hydra_would_misread_are_quoted():
    request = parse(["--gym-id", "007", "--model-name", "Qwen 3,VL", "--gbox-agent", "true", "--max-turns", "1,2",
                     "--gym-tags", " easy , a b"])
    assert request.overrides == ["gym_id='007'", "gbox_mini_agent_agent='true'", "model_name='Qwen 3,VL'",
                                 "max_turns='1,2'", "gym_tags=[easy,'a b']"]
    assert cli.hydra_str("it's") == "'it\\'s'" and cli.hydra_str("http://h:1/v1") == "http://h:1/v1"


@pytest.mark.parametrize("args, message", [
    (["--bogus"], "unknown flag '--bogus'. Run train.sh --help"),
    (["--gym-idd", "x"], "unknown flag '--gym-idd'"),
    (["--gym"], "--gym needs a value"),
    (["stray"], "unexpected argument 'stray'"),
    (["--", "stray"], "unexpected argument 'stray'"),
])
def test_bad_command_lines_fail_clearly(args, message):
    with pytest.raises(cli.UsageError, match=message):
        parse(args)


def test_help_lists_every_flag_with_its_variable_and_config_key(capsys):
    assert parse(["--gym", "x", "--help"]) is None
    cli.print_help()
    text = capsys.readouterr().out
    for flag in cli.FLAGS:
        for name in (flag.name, *flag.aliases):
            assert name in text, name
        names = f"[{flag.env} -> {', '.join(flag.keys)}]" if flag.keys else f"[{flag.env}]"
        assert names in " ".join(text.split()), names   # argparse wraps long help lines
    assert "--dry-run" in text
    assert text.startswith("usage: train.sh") and "examples/cua_agent/.env and <repo>/.env" in " ".join(text.split())
    assert "keyboard the Windows example" in " ".join(text.split())   # docs/local_gym.md's keyboard agent


def test_installed_help_names_cua_train_and_the_env_file_it_reads(capsys):
    """Installed from the wheel, the launcher is ``cua-train`` and reads ./.env only (it said train.sh and named
    the clone's files first)."""
    cli.print_help("cua-train")
    text = " ".join(capsys.readouterr().out.split())
    assert text.startswith("usage: cua-train") and "read from ./.env (data" in text and "examples/cua_agent" not in text


# --- .env files -----------------------------------------------------------------------------------
def test_env_files_precedence(tmp_path):
    example, root = tmp_path / "example.env", tmp_path / "root.env"
    example.write_text("# example .env\nGYM_ID=from-example\nMAX_TURNS=3\nGYM_LIMIT=4\nGBOX_AGENT=\"mai-ui\"  \n"
                       "export MODEL_NAME='quoted # not a comment'\nGYM_SEED=5 # trailing comment\nCUA_RL_FILEROOT=/x\n")
    root.write_text("GYM_ID=from-root\r\nMAX_TURNS=6\r\nGYM_LIMIT=\r\n")
    request = parse(["--gym-limit", "2"], environ={"MAX_TURNS": "8"}, env_files=[example, root])
    # root .env beats example .env; the process environment beats both; flags beat everything; empty = unset
    assert request.overrides == ["gym_id=from-root", "gbox_mini_agent_agent=mai-ui",
                                 "model_name='quoted # not a comment'", "max_turns=8", "gym_seed=5", "gym_limit=2"]
    # every .env value the environment lacks reaches the run's environment (CUA_RL_FILEROOT is no flag)
    assert request.environ["CUA_RL_FILEROOT"] == "/x" and "MAX_TURNS" not in request.environ
    assert "gym_limit=4" in parse([], env_files=[example, root]).overrides


def test_env_file_token_is_not_an_override(tmp_path):
    env = tmp_path / ".env"
    env.write_text("PROJECT_TOKEN=s3cr3t-from-file\nMONITOR_BASE_URL=http://127.0.0.1:9\n")
    request = parse([], env_files=[env])
    assert request.overrides == ["monitor_base_url=http://127.0.0.1:9"]
    assert request.environ["PROJECT_TOKEN"] == "s3cr3t-from-file"


def test_malformed_env_file_names_file_and_line(tmp_path):
    env = tmp_path / ".env"
    env.write_text("GYM_ID=a\n\nthis is not an assignment\n")
    with pytest.raises(cli.UsageError, match=f"{env}:3: expected KEY=value"):
        parse([], env_files=[env])


def test_env_example_documents_every_variable_and_holds_no_values():
    text = (EXAMPLE / ".env.example").read_text()
    for var in [flag.env for flag in cli.FLAGS] + ["MONITOR_PROJECT_TOKEN", "CUA_RL_FILEROOT"]:
        assert f"{var}=" in text, var
    # every documented variable is empty in the example: no addresses or secrets are committed
    for line in text.splitlines():
        if line and not line.startswith("#"):
            assert line.split("=", 1)[1].split("#")[0].strip() == "", line


# --- the launcher's decisions (in process; --dry-run loads and checks the config, starts nothing) --------
# (the `launcher` fixture: tests/conftest.py)


def test_issue_example_prints_overrides_and_never_the_token(launcher):
    rc, report, overrides, out = launcher(ISSUE_ARGS)
    assert rc == 0, out.err
    assert report["mode"] == "external gym http://gym.example:5010"
    assert report["config"].startswith(str(RECIPES / "config.cpu.yaml"))
    assert overrides == ["gym_base_url=http://gym.example:5010", "gym_id=g1", "train_dataset.batch_size=8",
                         "valid_dataset.batch_size=8", "actor.optimizer.lr=1e-6"]
    assert "SECRET" not in out.out + out.err and "PROJECT_TOKEN=****" in out.out


def test_config_choice_is_made_once_from_the_loaded_config(launcher):
    assert launcher([])[1]["config"] == f"{RECIPES / 'config.multiturn.yaml'} (default: no GPU found, embedded " \
                                        "stack: the learning recipe)"
    assert launcher([])[1]["mode"] == "embedded stack (gym id desktop)"
    assert launcher(["gym_base_url=http://127.0.0.1:7"])[1]["config"].startswith(str(RECIPES / "config.cpu.yaml"))
    assert launcher([], device="gpu")[1]["config"].startswith(str(RECIPES / "config.yaml"))
    # the embedded MiniWoB++ gym: the plain CPU stack (the learning recipe's curriculum is the desktop gym's)
    rc, report, _, _ = launcher(["--gym-id", "miniwob"])
    assert rc == 0 and report["mode"] == "embedded stack (gym id miniwob)"
    assert report["config"].startswith(f"{RECIPES / 'config.cpu.yaml'} (default: no GPU found, the embedded miniwob gym")
    # tasks of the user's own on the embedded gym (docs/local_gym.md's commands): the plain CPU stack, not the
    # learning recipe, whose task ids and warm start are the built-in curriculum's (before: config.multiturn.yaml)
    rc, report, overrides, _ = launcher([f"embedded.tasks_dir={RECIPES}"])
    assert rc == 0 and report["config"] == (f"{RECIPES / 'config.cpu.yaml'} (default: no GPU found, the embedded gym "
                                            "on your tasks (embedded.tasks_dir): the plain CPU stack)")
    # a gym URL and embedded.enabled=true: the config decides, the embedded stack runs
    assert launcher(["gym_base_url=http://127.0.0.1:7", "embedded.enabled=true"])[1]["mode"] == "embedded stack (gym id desktop)"


def test_a_custom_config_naming_its_own_gym_is_not_embedded(launcher, tmp_path, monkeypatch):
    custom = tmp_path / "custom.yaml"   # a whole config (Hydra's defaults list would search tmp_path)
    text = (EXAMPLE / "config.yaml").read_text()
    assert '\ngym_base_url: ""' in text
    custom.write_text(text.replace('\ngym_base_url: ""', "\ngym_base_url: http://127.0.0.1:9"))
    rc, report, _, out = launcher(["--config", str(custom)])
    assert rc == 0, out.err
    assert report["mode"] == "external gym http://127.0.0.1:9" and report["config"] == f"{custom} (given)"
    monkeypatch.chdir(EXAMPLE)   # a relative --config is relative to the caller's directory
    assert launcher(["--config", "config.yaml"])[1]["config"] == f"{EXAMPLE / 'config.yaml'} (given)"


@pytest.mark.parametrize("args, message", [
    (["--batch-size", "x"], "could not be converted to Integer full_key: train_dataset.batch_size"),
    (["--batch-size", "0"], "train_dataset.batch_size must be >= 1, got 0 (set by --batch-size / BATCH_SIZE)"),
    (["--gym-train-ratio", "1.5"], "gym_train_ratio must be within [0, 1], got 1.5 (set by --gym-train-ratio"),
    (["--gym-tags", "easy,a;b"], "bad tag 'a;b'"),
    (["--gym-eval-number-range", "1-x"], "set by --gym-eval-number-range / GYM_EVAL_NUMBER_RANGE"),
    (["--gym-seed", "-1"], "gym_seed must be >= 0"),
    (["--max-concurrent-rollouts", "0"], "rollout.max_concurrent_rollouts must be >= 1"),
    (["--config", "/nonexistent/cfg.yaml"], "config file not found: /nonexistent/cfg.yaml"),
    (["no_such_key=1"], "invalid configuration"),
    (["--bogus"], "unknown flag '--bogus'"),
])
def test_bad_values_are_refused_by_the_config_classes_naming_the_flag(launcher, args, message):
    rc, _, _, out = launcher(args)
    assert rc == 2 and out.out == ""
    assert out.err.startswith("train.sh: ") and message in out.err, out.err
    assert "Traceback" not in out.err


def test_an_agent_url_is_refused_where_our_agent_runs(launcher):
    rc, report, _, _ = launcher(["--gym", "http://10.1.1.2:5010", "--gbox-mini-url", "http://10.1.1.3:3000"])
    assert rc == 0 and report["agent"].startswith("the service at http://10.1.1.3:3000")
    rc, report, _, _ = launcher(["--gym", "http://10.1.1.2:5010", "--agent", "embedded"])
    assert rc == 0 and report["agent"].startswith("ours")
    for args in (["--gym", "http://10.1.1.2:5010", "--agent", "embedded"], []):   # --agent embedded; embedded stack
        rc, _, _, out = launcher([*args, "--gbox-mini-url", "http://10.1.1.3:3000"])
        assert rc == 2 and "agent URL http://10.1.1.3:3000 would be ignored" in out.err, out.err


def test_a_fleet_of_gyms_is_one_flag_and_the_dry_run_names_every_host(launcher, tmp_path):
    """Issue 64: --gym takes URL,URL,... or @FILE; the dry run says where the episodes play; a flag named
    for what it counts (groups: AReaL's rollouts), its old name kept."""
    rc, report, overrides, out = launcher(["--gym", "http://10.1.1.2:5010,http://10.1.1.4:5010", "--gym-id", "desktop",
                                           "--max-concurrent-groups", "3"])
    assert rc == 0, out.err
    assert report["mode"].startswith("a fleet of 2 gym hosts: http://10.1.1.2:5010, http://10.1.1.4:5010 (each "
                                     "group placed on one host by capacity"), report["mode"]
    assert "gym_base_url='http://10.1.1.2:5010,http://10.1.1.4:5010'" in overrides
    assert "rollout.max_concurrent_rollouts=3" in overrides
    hosts = tmp_path / "gyms.txt"
    hosts.write_text("http://10.1.1.5:5010\n")
    rc, report, _, out = launcher(["--gym", f"@{hosts}", "--max-concurrent-rollouts", "2", "scheduler.type=ray",
                                   "gym_fleet.ray_gyms.enabled=true"])
    assert rc == 0, out.err
    assert report["mode"] == ("a fleet of 1 gym host: http://10.1.1.5:5010, plus our gym on each Ray node with spare "
                              "CPUs, once the trainer's workers are placed (each group placed on one host by capacity; "
                              "docs/cluster.md)"), report["mode"]
    rc, report, _, out = launcher(["scheduler.type=ray", "gym_fleet.ray_gyms.enabled=true"])
    assert rc == 0 and report["mode"].startswith("a fleet of gym hosts: our gym on each Ray node"), out.err
    rc, _, _, out = launcher(["--gym", "http://10.1.1.2:5010,10.1.1.3"])
    assert rc == 2 and "gym URL '10.1.1.3': expected http(s)://host[:port]" in out.err, out.err


def test_secret_overrides_are_masked_and_warned_about(launcher):
    rc, _, overrides, out = launcher(["project_token=hunter2"])
    assert rc == 0, out.err
    assert overrides == ["project_token=****"] and "hunter2" not in out.out + out.err
    assert "warning: project_token given as an override" in out.err


# --- train.sh --------------------------------------------------------------------------------------
def test_train_sh_prepares_the_environment_and_hands_every_argument_to_the_launcher(tmp_path):
    """STAND-IN for scripts/env.sh: a copy of train.sh beside an env.sh that puts a `python` first on PATH
    recording its argv and working directory. Checks the hand-over only (the launcher is tested above)."""
    example = tmp_path / "repo" / "examples" / "cua_agent"
    example.mkdir(parents=True)
    (example / "train.sh").write_text((EXAMPLE / "train.sh").read_text())
    bin_dir, record = tmp_path / "bin", tmp_path / "record.txt"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/bash\n{{ pwd; printf "%s\\n" "$@"; }} > {record}\n'
                                    '[ "$1 $2 $3" = "-m cua_rl.run.launch --bad" ] && exit 2; exit 0\n')
    (bin_dir / "python").chmod(0o755)
    (tmp_path / "repo" / "scripts").mkdir()
    (tmp_path / "repo" / "scripts" / "env.sh").write_text(f'export PATH="{bin_dir}:$PATH"\n')
    args = ["--gym", "http://127.0.0.1:5010", "--config", "my config.yaml", "max_turns=4", "--", "a=b c"]
    proc = subprocess.run(["bash", str(example / "train.sh"), *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    cwd, *argv = record.read_text().splitlines()
    assert cwd == str(tmp_path) and argv == ["-m", "cua_rl.run.launch", *args]
    assert len((EXAMPLE / "train.sh").read_text().splitlines()) <= 8
    # the launcher's exit code is train.sh's (2: bad input, refused before anything starts)
    bad = subprocess.run(["bash", str(example / "train.sh"), "--bad"], cwd=tmp_path, capture_output=True, timeout=60)
    assert bad.returncode == 2, bad.stderr


def test_train_sh_dry_run_end_to_end():
    """The real train.sh: set-up (idempotent), the launcher, the config loaded and checked; nothing started. (Bad
    values: the launcher in process above; train.sh's exit code is the launcher's: the stand-in test above. Each
    real launcher process imports AReaL to load the config, 18-50 s on 2 cores.)"""
    proc = subprocess.run(["bash", str(EXAMPLE / "train.sh"), "--dry-run", "--offline", *ISSUE_ARGS], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "mode: external gym http://gym.example:5010" in proc.stdout and "SECRET" not in proc.stdout + proc.stderr


def test_resume_is_a_switch_that_keeps_the_trial(launcher):
    request = parse(["--resume", "trial_name=mine", "--gym", "http://g:1"])
    assert request.overrides == ["existing_run=resume", "gym_base_url=http://g:1", "trial_name=mine"]
    rc, report, overrides, out = launcher(["--resume", "trial_name=mine"])
    assert rc == 0, out.err
    assert report["run"].endswith("/ resume mine") and "existing_run=resume" in overrides
    rc, report, _, out = launcher(["--resume"])
    assert rc == 0 and report["run"].endswith("resume the newest run with a committed recover point"), out.out
    rc, _, _, out = launcher(["--resume", "recover.mode=disabled"])
    assert rc == 2 and "existing_run=resume needs recover.mode on" in out.err and "--resume" in out.err


def test_hub_access_is_offline_unless_a_gpu_run_loads_a_hub_model(monkeypatch, tmp_path):
    """scripts/env.sh used to force HF_HUB_OFFLINE=1 (and WANDB_MODE=disabled) over whatever the user set, so
    config.yaml's Hub model could not load on a fresh GPU node. The launcher now decides, and the user's own
    value (environment or .env) wins."""
    from types import SimpleNamespace

    from cua_rl.run.launch import _hub_access
    from cua_rl.run.prewarm import HUB_OFFLINE

    def decided(path: str, gpu: bool, **user) -> dict:
        for name in HUB_OFFLINE:
            monkeypatch.delenv(name, raising=False)
        for name, value in user.items():
            monkeypatch.setenv(name, value)
        _hub_access(SimpleNamespace(actor=SimpleNamespace(path=path)), gpu)
        return {name: os.environ.get(name) for name in HUB_OFFLINE}

    assert decided("Qwen/Qwen3-VL-2B-Instruct", gpu=True) == dict.fromkeys(HUB_OFFLINE)   # downloaded as usual
    assert decided(str(tmp_path), gpu=True) == dict.fromkeys(HUB_OFFLINE, "1")            # a local model
    assert decided("Qwen/Qwen3-VL-2B-Instruct", gpu=False) == dict.fromkeys(HUB_OFFLINE, "1")   # the CPU stack
    assert decided(str(tmp_path), gpu=False, HF_HUB_OFFLINE="0")["HF_HUB_OFFLINE"] == "0"  # the user's value
    env_sh = (ROOT / "scripts" / "env.sh").read_text()
    assert "HF_HUB_OFFLINE" not in env_sh and "WANDB_MODE" not in env_sh


def test_gym_id_without_a_gym_url_picks_the_embedded_gym_or_is_refused(tmp_path, monkeypatch):
    """``--gym-id miniwob`` without ``--gym`` used to be replaced by ``desktop`` silently; now the embedded gym
    serves it, and an id the embedded gym does not serve is refused at load time, naming what to do."""
    from cua_rl.config import EMBEDDED_GYM_IDS
    from cua_rl.local_gym.manager import SUITES
    from cua_rl.run.launch import ConfigError, load_config

    monkeypatch.setenv("CUA_RL_FILEROOT", str(tmp_path))
    assert set(EMBEDDED_GYM_IDS) == set(SUITES)
    config = load_config(str(EXAMPLE / "config.cpu.yaml"), ["gym_id=miniwob"])
    assert config.embedded_enabled and config.embedded_gym_id == "miniwob"
    assert load_config(str(EXAMPLE / "config.cpu.yaml"), []).embedded_gym_id == "desktop"
    with pytest.raises(ConfigError, match="embedded gym serves desktop or miniwob"):
        load_config(str(EXAMPLE / "config.cpu.yaml"), ["gym_id=osworld"])
    external = load_config(str(EXAMPLE / "config.cpu.yaml"), ["gym_id=osworld", "gym_base_url=http://gym.example:5010"])
    assert not external.embedded_enabled and external.gym_id == "osworld"


def test_cua_eval_help_describes_every_option():
    """``cua-eval --help`` said nothing of --episodes-per-task or --concurrency (review of 2026-12-07)."""
    from cua_rl.evaluate import _gym_parser

    bare = [a.option_strings[-1] for a in _gym_parser()._actions if a.option_strings and not (a.help or "").strip()]
    assert not bare, f"cua-eval --help gives no description for {bare}"
