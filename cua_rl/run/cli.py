"""The command line of ``train.sh``: one flag table, from which come ``--help``, the environment-variable
fallbacks (also read from ``.env`` files) and the Hydra overrides.

``train.sh`` only prepares the Python environment and hands every argument to ``python -m cua_rl.run.launch``,
which calls ``parse`` here. Nothing in this module checks a value's range or type: each flag becomes a Hydra
override of one config key, and the config classes (``cua_rl.config``) check it once, with the flag named in
the error (``flag_of_key``). Precedence: flags > process environment > ``<repo>/.env`` >
``examples/cua_agent/.env`` > config file.

Kept free of heavy imports: ``--help`` answers without loading AReaL.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from cua_rl.run import settings_help


@dataclass(frozen=True)
class Flag:
    name: str                   # --gym
    env: str                    # GYM_BASE_URL: its fallback in the environment and .env files
    keys: tuple[str, ...]       # the config keys it sets; () = not an override (the token, the config file)
    # A flag that sets a key shows that field's help (cua_rl/run/settings_help.py); this is the whole help of a
    # flag without a key, and a note after the field's help otherwise (what AReaL's own words leave out).
    help: str = ""
    kind: str = "str"           # str | number | list: how a value is written into an override
    aliases: tuple[str, ...] = ()
    metavar: str = "VALUE"


FLAGS: tuple[Flag, ...] = (
    Flag("--gym", "GYM_BASE_URL", ("gym_base_url",), metavar="URL"),
    Flag("--gym-id", "GYM_ID", ("gym_id",), metavar="ID"),
    Flag("--gbox-mini-url", "GBOX_MINI_AGENT_BASE_URL", ("gbox_mini_agent_base_url",),
         aliases=("--gbox-mini-agent-base-url",), metavar="URL"),
    Flag("--agent", "CUA_AGENT", ("agent_service",), metavar="KIND"),
    Flag("--gbox-agent", "GBOX_AGENT", ("gbox_mini_agent_agent",), metavar="NAME"),
    Flag("--standard-action-space", "STANDARD_ACTION_SPACE", ("gbox_mini_agent_standard_action_space",),
         metavar="NAME"),
    Flag("--model-base-url", "MODEL_BASE_URL", ("model_base_url",), aliases=("--inference-base-url",), metavar="URL"),
    Flag("--model-name", "MODEL_NAME", ("model_name",), metavar="NAME"),
    Flag("--monitor-base-url", "MONITOR_BASE_URL", ("monitor_base_url",), metavar="URL"),
    Flag("--project-id", "PROJECT_ID", ("project_id",), metavar="ID"),
    Flag("--project-token", "PROJECT_TOKEN", (),
         "Training Monitor token: passed to the run through the environment only, never an override or a file",
         metavar="TOKEN"),
    Flag("--batch-size", "BATCH_SIZE", ("train_dataset.batch_size", "valid_dataset.batch_size"),
         "here: tasks (GRPO groups) per step, train and eval", kind="number", metavar="N"),
    Flag("--max-turns", "MAX_TURNS", ("max_turns",), kind="number", metavar="N"),
    Flag("--max-task-time", "MAX_TASK_TIME", ("max_task_time_seconds",), kind="number", metavar="SECONDS"),
    Flag("--max-step-time", "MAX_STEP_TIME", ("max_turn_time_seconds",), kind="number", metavar="SECONDS"),
    Flag("--max-concurrent-groups", "MAX_CONCURRENT_ROLLOUTS", ("rollout.max_concurrent_rollouts",),
         "here: GRPO groups in flight, each gconfig.n_samples episodes at once on one gym host",
         kind="number", aliases=("--max-concurrent-rollouts",), metavar="N"),
    Flag("--gym-train-ratio", "GYM_TRAIN_RATIO", ("gym_train_ratio",), kind="number", metavar="R"),
    Flag("--gym-seed", "GYM_SEED", ("gym_seed",), kind="number", metavar="N"),
    Flag("--gym-limit", "GYM_LIMIT", ("gym_limit",), kind="number", metavar="N"),
    Flag("--gym-tags", "GYM_TAGS", ("gym_tags",), kind="list", metavar="a,b"),
    Flag("--gym-eval-number-range", "GYM_EVAL_NUMBER_RANGE", ("gym_eval_number_range",), metavar="RANGE"),
    Flag("--on-anomaly", "ON_ANOMALY", ("health.on_anomaly",), metavar="ACTION"),
    Flag("--config", "CUA_CONFIG", (), "config file (default, from cua_rl/recipes: config.yaml with a GPU; "
         "without one config.multiturn.yaml for the embedded stack, config.cpu.yaml for your gym)", metavar="FILE"),
)

EPILOG = """\
[ENV -> key]: the flag's environment variable and the config key it sets.
Other arguments are Hydra overrides passed through unchanged, after the flags' own, e.g.
actor.optimizer.lr=1e-6 or task_source.kind=file task_source.task_file=/path/tasks.jsonl (every config key,
listed in the config file or not; a new entry of a mapping takes a '+'). `--` ends the flags. Every flag
falls back to its environment variable (in brackets), also read from {env_files} (data, never executed).
Precedence: flags > environment > {precedence} > config file."""
# the .env files as the help names them: a clone's two (train.sh), or the working directory's (cua-train)
ENV_FILES = {"train.sh": ("examples/cua_agent/.env and <repo>/.env", "<repo>/.env > examples/cua_agent/.env"),
             "cua-train": ("./.env", "./.env")}

# Keys whose values are secrets: shown as **** wherever a command line or an override is printed.
_SECRET_KEY = re.compile(r"(^|_)(token|api_key|apikey|secret|password)$")
_BARE = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./:@%+-]*$")
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
_RESERVED = {"true", "false", "null", "True", "False", "None", "nan", "inf"}
_ENV_LINE = re.compile(r"^\s*(export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


class UsageError(Exception):
    """A bad command line or .env file: printed as ``train.sh: <message>``, exit code 2."""


@dataclass
class Request:
    """What the command line asks for, before any config is loaded."""

    overrides: list[str] = field(default_factory=list)   # the flags' overrides, then the user's own
    config_file: str = ""                                 # --config / CUA_CONFIG; "" = the default
    dry_run: bool = False
    offline: bool = False                                 # --offline: --dry-run probes no service (run/probes.py)
    print_config: bool = False                            # --print-config: the resolved config as YAML, then stop
    environ: dict[str, str] = field(default_factory=dict)  # .env values and the token, for the run's environment
    flag_keys: dict[str, str] = field(default_factory=dict)  # config key -> "--flag / ENV" that set it


def hydra_str(value: str) -> str:
    """A Hydra override value that stays this string: bare when plainly a string, else single-quoted (commas
    would make a sweep, "007" or "true" would stop being strings, spaces and brackets would not parse)."""
    if _BARE.match(value) and value not in _RESERVED:
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _override_value(flag: Flag, value: str) -> str:
    if flag.kind == "number":  # a number goes in bare; anything else as a string the config then refuses
        return value.strip() if _NUMBER.match(value.strip()) else hydra_str(value)
    if flag.kind == "list":
        return "[" + ",".join(hydra_str(v.strip()) for v in value.split(",") if v.strip()) + "]"
    return hydra_str(value)


def is_secret_override(arg: str) -> bool:
    key = arg.split("=", 1)[0]
    return "=" in arg and bool(_SECRET_KEY.search(key.rsplit(".", 1)[-1]))


def mask(arg: str) -> str:
    """``key=value`` with the value shown as **** when the key names a secret."""
    return f"{arg.split('=', 1)[0]}=****" if is_secret_override(arg) else arg


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=value lines (optionally ``export``, quoted, with a trailing `` # comment``), read as data. Empty
    values are left out (empty = unset)."""
    values: dict[str, str] = {}
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.rstrip("\r")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _ENV_LINE.match(line)
        if not m:
            raise UsageError(f"{path}:{n}: expected KEY=value")
        key, val = m.group(2), m.group(3)
        quoted = re.match(r"""^(["'])(.*)\1\s*$""", val)
        val = quoted.group(2) if quoted else re.sub(r"\s#.*$", "", val).strip()
        if val:
            values[key] = val
    return values


def env_defaults(files: list[Path], environ: dict[str, str]) -> dict[str, str]:
    """Values of the .env files (a later file wins) that the process environment does not already set."""
    merged: dict[str, str] = {}
    for path in files:
        if path.is_file():
            merged.update(read_env_file(path))
    return {k: v for k, v in merged.items() if k not in environ}


def _names(flag: Flag) -> str:
    """``[ENV -> config.key]``: one setting's names, from this table (the help is their documentation)."""
    return f"[{flag.env}" + (f" -> {', '.join(flag.keys)}]" if flag.keys else "]")


def flag_help(flag: Flag) -> str:
    """A flag's help: the field it sets carries it (read from the source, nothing imported), then the flag's note."""
    text = settings_help.help_of(flag.keys[0]) if flag.keys else ""
    return "; ".join(part for part in (text, flag.help) if part)


def build_parser(prog: str = "train.sh") -> argparse.ArgumentParser:
    """Only for ``--help`` (``parse`` reads the command line itself: flags and overrides interleave); ``prog``:
    train.sh in a clone, cua-train installed from the wheel."""
    env_files, precedence = ENV_FILES.get(prog, ENV_FILES["train.sh"])
    parser = argparse.ArgumentParser(
        prog=prog, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EPILOG.format(env_files=env_files, precedence=precedence),
        description=textwrap.fill(
            "Train a computer-use agent with GRPO on AReaL. Without --gym (and without GYM_BASE_URL) the "
            "embedded stack runs on this machine: a gym with X11 desktops, the agent service and, without a "
            "GPU, a tiny model on vLLM's CPU backend.", 100))
    for flag in FLAGS:
        parser.add_argument(flag.name, *flag.aliases, metavar=flag.metavar, help=f"{flag_help(flag)} {_names(flag)}")
    parser.add_argument("--dry-run", action="store_true",
                        help="load and check the config, print what would run, start nothing; then probe every "
                             "external service the run would use (each gym host, the agent service, the monitor: "
                             "one 'probe: ROLE URL: ok' line each, within 30 s; any failure exits 1)")
    parser.add_argument("--offline", action="store_true",
                        help="with --dry-run: skip the probes of the external services (no network)")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved config as YAML on stdout (as Hydra's --cfg job), start nothing")
    parser.add_argument("--resume", action="store_true",
                        help="continue a killed run from its last committed recover point: the run named by "
                             "trial_name=..., else the experiment's newest [-> existing_run=resume]")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="Hydra overrides")
    return parser


_BY_NAME = {name: flag for flag in FLAGS for name in (flag.name, *flag.aliases)}
_HINT = "Run train.sh --help for the flags; Hydra overrides are key=value without dashes."


def _check_override(arg: str) -> str:
    if "=" not in arg and not arg.startswith("~"):   # ~key deletes a key in Hydra
        raise UsageError(f"unexpected argument {arg!r}: overrides look like key=value (see --help)")
    return arg


SWITCHES = ("--dry-run", "--offline", "--print-config", "--resume", "--help", "-h")


def _split_argv(argv: list[str]) -> tuple[dict[str, str], list[str], set[str]]:
    """(flag env name -> value, overrides, switches given) of ``argv``; ``--name=value`` works too."""
    given: dict[str, str] = {}
    overrides: list[str] = []
    switches: set[str] = set()
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            for rest in argv[i:]:
                _check_override(rest)
            overrides += argv[i:]
            break
        if arg in SWITCHES:
            switches.add("--help" if arg == "-h" else arg)
        elif arg.startswith("-"):
            name, eq, value = arg.partition("=")
            flag = _BY_NAME.get(name)
            if flag is None:
                raise UsageError(f"unknown flag {name!r}. {_HINT}")
            if not eq:
                if i >= len(argv):
                    raise UsageError(f"{name} needs a value (see --help)")
                value, i = argv[i], i + 1
            given[flag.env] = value
        else:
            overrides.append(_check_override(arg))
    return given, overrides, switches


def parse(argv: list[str], environ: dict[str, str], env_files: list[Path]) -> Request | None:
    """The request of ``argv`` (flags and overrides) with ``environ`` and the ``.env`` files as fallbacks;
    None when the user asked for ``--help``."""
    given, passthrough, switches = _split_argv(argv)
    if "--help" in switches:
        return None
    if "--offline" in switches and "--dry-run" not in switches:
        raise UsageError("--offline goes with --dry-run (it skips the dry-run's probes; a run contacts its services)")
    defaults = env_defaults(env_files, environ)
    lookup = {**defaults, **environ, **given}
    request = Request(dry_run="--dry-run" in switches, offline="--offline" in switches,
                      print_config="--print-config" in switches, environ=dict(defaults))
    if "--resume" in switches:
        request.overrides.append("existing_run=resume")
        request.flag_keys["existing_run"] = "--resume"
    for flag in FLAGS:
        value = lookup.get(flag.env, "")
        if not value:
            continue
        if flag.env == "PROJECT_TOKEN":
            request.environ["PROJECT_TOKEN"] = value
        elif flag.env == "CUA_CONFIG":
            if not Path(value).expanduser().is_file():   # told before anything loads (AReaL's import: seconds)
                raise UsageError(f"config file not found: {value} ({flag.name} / {flag.env})")
            request.config_file = value
        for key in flag.keys:
            request.overrides.append(f"{key}={_override_value(flag, value)}")
            request.flag_keys[key] = f"{flag.name} / {flag.env}"
    request.overrides += passthrough   # last: the user's own overrides win over the flags
    return request


def print_help(prog: str = "train.sh") -> None:
    build_parser(prog).print_help(sys.stdout)


def default_env_files(clone: Path | None) -> list[Path]:
    """The .env files the launcher reads, lowest precedence first: a clone's two, or (installed from the
    wheel, ``clone`` None) the one in the current directory."""
    if clone is None:
        return [Path.cwd() / ".env"]
    return [clone / "examples" / "cua_agent" / ".env", clone / ".env"]
