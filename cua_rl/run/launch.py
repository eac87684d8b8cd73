"""What ``train.sh`` execs after preparing the environment: ``python -m cua_rl.run.launch [FLAGS] [key=value ...]``.

Every start-up decision is made here, once:
- the flags, their environment variables and the ``.env`` files become Hydra overrides (``cua_rl.run.cli``);
- GPU or not (``has_gpu``: ``CUA_RL_DEVICE`` or ``nvidia-smi``), which decides the default config file;
- embedded or not (``CUAConfig.embedded_enabled`` of the loaded config: no gym URL, or ``embedded.enabled``);
- the values are checked by the config classes; ``--dry-run`` stops after that, prints what would run and probes
  the external services it would use (``probes.py``; ``--offline``: not).

Then: the run's own directory (a timestamped trial), without a GPU the tiny model and vLLM's CPU environment,
the SFT warm start when ``sft.warm_start``, the embedded gym, agent service and monitor when embedded, and
``python -m cua_rl.train`` in AReaL's single-controller mode (AReaL's scheduler starts the actor and rollout
workers and vLLM, on a GPU or on the CPU alike).

Everything started here is stopped on exit, error or Ctrl-C (the trainer gets SIGTERM, then SIGKILL), and
the end prints where the logs, checkpoints and statistics are, plus the last rewards seen (``summary.py``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from cua_rl import own_command
from cua_rl.logs import log_to_file, setup_logging
from cua_rl.monitor.embedded import monitor_for_embedded_run
from cua_rl.progress import console as console_progress
from cua_rl.run import cli, gpus
from cua_rl.run.console import TrainerConsole
from cua_rl.run.preflight import PreflightError, check_embedded, missing_binaries, user_namespace_error
from cua_rl.run.prewarm import HUB_OFFLINE, Prewarmed, predicted_env
from cua_rl.run.probes import probe_services
from cua_rl.run.summary import print_summary, show_tail
from cua_rl.runs import AUTO_TRIAL, RunPaths, claim_run_dir, new_trial_name
from cua_rl.trainer.health import UnhealthyRun
from cua_rl.trainer.resume import newest_resumable, resume_point

if TYPE_CHECKING:
    from cua_rl.config import CUAConfig

logger = logging.getLogger("cua_rl.run.launch")
PACKAGE = Path(__file__).resolve().parents[1]            # cua_rl, in a clone or installed from the wheel
RECIPES = PACKAGE / "recipes"   # config*.yaml and .env.example: package data (examples/cua_agent links to them)
CLONE = PACKAGE.parent if (PACKAGE.parent / "pyproject.toml").is_file() else None   # None: installed
# Set for every process of the run unless the user set them: no cost-map download when AReaL imports litellm
# (offline nodes would wait on it), no tokenizer thread pools forked into workers. scripts/env.sh sets the
# same two for the clone's other commands.
PROCESS_DEFAULTS = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "TOKENIZERS_PARALLELISM": "false"}


def apply_process_defaults() -> None:
    """``PROCESS_DEFAULTS`` into this process's environment (and so its children's), where the user set none."""
    for name, value in PROCESS_DEFAULTS.items():
        os.environ.setdefault(name, value)


def trainer_cwd() -> Path:
    """Where the trainer starts: the clone (its sources first on the path, whatever clone the environment links)
    or, installed, the user's directory."""
    return CLONE or Path.cwd()


def has_gpu() -> bool:
    """The same decision as scripts/setup.sh: CUA_RL_DEVICE=cpu|gpu forces it, else `nvidia-smi -L`."""
    device = gpus.forced()
    return device == "gpu" if device else gpus.listed() > 0


class ConfigError(SystemExit):
    """The config file plus overrides do not load or validate: one readable message, exit code 2."""


def load_config(config_file: str, overrides: list[str], flag_keys: dict[str, str] | None = None,
                present: int | None = None):
    """The validated CUAConfig of ``config_file`` plus ``overrides``. AReaL's loader saves a config.yaml
    into the trial's log directory; under the ``auto`` placeholder that directory is removed again when
    the file is all it holds (the real trial name is chosen later). A bad value raises ``ConfigError``
    naming the flag that set it (``flag_keys``: config key -> flag, from ``cli.parse``); so does an allocation
    that needs more than the ``present`` GPUs (``deploy.check_gpus``; None: not checked)."""
    if not Path(config_file).is_file():   # before AReaL's import (seconds): a typo is told at once
        raise ConfigError(f"config file not found: {config_file}")
    from areal.api.cli_args import load_expr_config

    from cua_rl import deploy
    from cua_rl.config import CUAConfig, hydra_overrides

    try:
        config, _ = load_expr_config(["--config", config_file, *hydra_overrides(overrides)], CUAConfig)
        deploy.check_host(config)   # what this host must have for it (the attention's package)
        if present is not None:
            deploy.check_gpus(config, present)
    except Exception as exc:  # Hydra's parse errors, OmegaConf's type errors, our __post_init__ checks
        raise ConfigError(_config_error(config_file, exc, flag_keys or {})) from None
    if config.trial_name == AUTO_TRIAL:
        _drop_saved_config(config)
    return config


def _drop_saved_config(config: CUAConfig) -> None:
    """Remove the log directory AReaL's loader made for ``config`` when its config.yaml is all it holds (no
    run ever wrote there), and the experiment directory above it when that is left empty."""
    stray = RunPaths.of(config).logs
    if stray.is_dir() and {p.name for p in stray.iterdir()} <= {"config.yaml"}:
        shutil.rmtree(stray)
        with contextlib.suppress(OSError):   # not empty: other runs of the experiment
            stray.parent.rmdir()


def _config_error(config_file: str, exc: Exception, flag_keys: dict[str, str]) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    cause = exc.__cause__   # Hydra's "Error merging override k=v" holds OmegaConf's reason as its cause
    if cause is not None and str(cause).strip() and str(cause).strip() not in str(exc):
        text += ": " + " ".join(str(cause).split())
    flags = sorted({flag for key, flag in flag_keys.items() if key in text})
    source = f" (set by {', '.join(flags)})" if flags else ""
    return f"invalid configuration {config_file} + overrides: {text}{source}"


def _clear_name_records(config: CUAConfig) -> None:
    """Forget this experiment/trial's name-resolve records (as AReaL's own launchers do): a previous run
    of the same trial leaves e.g. its weight-update entry, and the next update would then fail."""
    from areal.utils import name_resolve, names

    name_resolve.logger.setLevel(logging.WARNING)   # "No such name resolve path" is not news
    name_resolve.reconfigure(config.cluster.name_resolve)
    name_resolve.clear_subtree(names.trial_root(experiment_name=config.experiment_name,
                                                trial_name=config.trial_name))


def _start_embedded(config: CUAConfig, stack: contextlib.ExitStack, env: dict[str, str]) -> list[str]:
    """Gym + agent service in this process; returns the overrides that point training at them. Each gets a fresh
    random token for this run, handed to the trainer's clients through ``env`` (``CUA_GYM_TOKEN``,
    ``CUA_AGENT_TOKEN``) and to the agent service's gym client directly: never a command line or a file."""
    from cua_rl.http.auth import AGENT_TOKEN, GYM_TOKEN, new_token
    from cua_rl.local_agent.server import start_agent_server
    from cua_rl.local_gym.server import start_gym_server

    emb = config.embedded
    t0 = time.monotonic()
    tasks_dir = os.path.abspath(os.path.expanduser(emb.tasks_dir)) if emb.tasks_dir else None
    gym_token, agent_token = new_token(), new_token()
    gym = start_gym_server(emb.host, emb.gym_port, gym_id=config.embedded_gym_id, pool_size=emb.num_desktops,
                           tasks_dir=tasks_dir, extra_tasks=config.custom_tasks(),
                           reuse_browsers=emb.reuse_browsers, restart_in_page=emb.restart_in_page,
                           fault_rate=emb.fault_rate, token=gym_token)
    stack.callback(gym.stop)
    agent = start_agent_server(emb.host, emb.agent_port, token=agent_token, gym_token=gym_token)
    stack.callback(agent.stop)
    env[GYM_TOKEN], env[AGENT_TOKEN] = gym_token, agent_token
    logger.info("embedded gym at %s (gym id %s), agent service at %s (%.1fs)", gym.url, gym.gym_id, agent.url,
                time.monotonic() - t0)
    return [f"gym_base_url={gym.url}", f"gym_id={gym.gym_id}", f"gbox_mini_agent_base_url={agent.url}"]


def _start_embedded_agent(config: CUAConfig, stack: contextlib.ExitStack, env: dict[str, str]) -> list[str]:
    """``--agent embedded`` with a gym of the user's: our agent service in this process (beside the policy
    endpoint, so on loopback), playing the tasks of the gym at ``gym_base_url`` (with the user's ``CUA_GYM_TOKEN``,
    if any); a fresh token of its own reaches the trainer's clients through ``env``."""
    from cua_rl.http.auth import AGENT_TOKEN, new_token
    from cua_rl.local_agent.server import start_agent_server

    token = new_token()
    agent = start_agent_server(config.embedded.host, config.embedded.agent_port, token=token)
    stack.callback(agent.stop)
    env[AGENT_TOKEN] = token
    logger.info("embedded agent service at %s, playing the tasks of the gym at %s", agent.url, config.gym_base_url)
    return [f"gbox_mini_agent_base_url={agent.url}"]


def _prepare_cpu(config: CUAConfig) -> dict[str, str]:
    """No GPU: the tiny model (built offline when ``actor.path`` has none) and vLLM's CPU environment."""
    from cua_rl.local_model.tiny import ensure_embedded_model
    from cua_rl.local_model.vllm_server import CPU_ENV

    model_dir = ensure_embedded_model(config)
    if not (model_dir / "config.json").exists():
        raise SystemExit(f"actor.path {model_dir} has no config.json: not a model directory")
    logger.info("no GPU: AReaL launches vLLM on the CPU for %s", model_dir)
    return dict(CPU_ENV)


def wait_interruptibly(proc: subprocess.Popen) -> int:
    """``proc.wait()`` that lets this process's signal handlers run within a second. Python runs them in the main
    thread only, and the kernel may hand a Ctrl-C or SIGTERM to any thread of ours (the embedded gym's, the agent
    service's, the console's reader): a main thread blocked in ``waitpid`` would not see it until the child
    ended by itself (a CI run's Ctrl-C went unanswered for 2 minutes while the run trained on)."""
    while True:
        with contextlib.suppress(subprocess.TimeoutExpired):
            return proc.wait(timeout=1.0)


def _run_trainer(cmd: list[str], env: dict[str, str], log_file: Path, total_steps: int | None = None,
                 early: Prewarmed | None = None) -> tuple[int, int | None]:
    """Run the trainer (``cua_rl.train``) in its own process group: all its output to ``log_file``, and to the console through
    ``TrainerConsole`` (one line per step instead of AReaL's statistics table; CUA_RL_CONSOLE=full: all).
    ``early``: the trainer process started at the launcher's first line (``prewarm.py``), used when it can be."""
    proc = early.hand_over(cmd[3:], env) if early is not None else None
    if proc is None:
        proc = subprocess.Popen(cmd, cwd=trainer_cwd(), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
    progress = console_progress()
    console = None if os.environ.get("CUA_RL_CONSOLE") == "full" else \
        TrainerConsole(total_steps, str(log_file), quiet=True, progress=progress)

    def show(lines: list[str]) -> None:
        for text in lines:
            progress.write(text.rstrip("\n"))

    def pump() -> None:
        with open(log_file, "ab") as f:
            for line in iter(proc.stdout.readline, b""):
                f.write(line)
                if console is None:
                    sys.stdout.buffer.write(line)
                    sys.stdout.flush()
                else:
                    show(console.feed(line.decode("utf-8", errors="replace")))
            if console is not None:
                show(console.close())

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()

    stopped_by: list[int] = []

    def stop(signum, _frame) -> None:
        stopped_by.append(signum)
        logger.warning("signal %d: stopping the trainer", signum)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)

    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            rc = wait_interruptibly(proc)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            raise
    finally:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        with contextlib.suppress(ProcessLookupError):  # helpers the trainer forked
            os.killpg(proc.pid, signal.SIGKILL)
        reader.join(10)
        progress.end()
        for s, h in old.items():
            signal.signal(s, h)
    if rc != 0 and stopped_by:   # asked to stop (Ctrl-C, SIGTERM): not a failure, no traceback to show
        return 128 + stopped_by[0], stopped_by[0]
    if rc not in (0, UnhealthyRun.CODE) and console is not None:   # a health stop printed its own cause
        show_tail(log_file)
    return rc, None



def choose_config(request: cli.Request, gpu: bool, present: int | None = None) -> tuple[str, str, object]:
    """(config file, why it was chosen, its loaded config). Given: that file. Else with a GPU config.yaml;
    without one config.multiturn.yaml when the run is embedded on the desktop gym's built-in tasks (the learning
    recipe, whose curriculum lives there), config.cpu.yaml when it names a gym, the embedded MiniWoB++ gym or
    tasks of its own (``embedded.tasks_dir``): the embedded question is answered by the loaded config itself
    (``embedded_enabled``). With GPUs (``present`` of them, None: not counted) the default is fitted to them
    (``_fit_to_gpus``) and every config is checked against them."""
    overrides, keys = request.overrides, request.flag_keys
    checked = present if gpu else None
    if request.config_file:
        # relative to the caller's directory; a link (examples/cua_agent/config*.yaml) keeps the name it was given
        path = os.path.abspath(Path(request.config_file).expanduser())
        return path, "given", load_config(path, overrides, keys, checked)
    if gpu:
        path, why = _fit_to_gpus(request, present)
        return path, why, load_config(path, overrides, keys, checked)
    path = str(RECIPES / "config.multiturn.yaml")
    config = load_config(path, overrides, keys)
    if config.embedded_enabled and config.embedded_gym_id == "desktop" and not config.embedded.tasks_dir:
        return path, "default: no GPU found, embedded stack: the learning recipe", config
    _drop_saved_config(config)   # loaded only to ask; its experiment's log directory must not stay behind
    path = str(RECIPES / "config.cpu.yaml")
    if not config.embedded_enabled:
        why = "default: no GPU found, your gym"
    elif config.embedded.tasks_dir:   # the learning recipe trains the built-in curriculum's task 054
        why = "default: no GPU found, the embedded gym on your tasks (embedded.tasks_dir): the plain CPU stack"
    else:
        why = (f"default: no GPU found, the embedded {config.embedded_gym_id} gym: the plain CPU stack (the learning "
               "recipe is the desktop curriculum's)")
    return path, why, load_config(path, overrides, keys)


def _fit_to_gpus(request: cli.Request, present: int | None) -> tuple[str, str]:
    """(GPU recipe, why) for a run with no config file of the user's: config.yaml (8 GPUs) fitted to the
    ``present`` GPUs (``deploy.fit_default``: its overrides join ``request.overrides``, so the trainer gets them
    too), unless the overrides already set the allocation (``deploy.allocation_overrides``: the user's is kept,
    and checked) or the GPUs are not counted (None)."""
    from cua_rl import deploy

    users = deploy.allocation_overrides(request.overrides)
    if present is None or users:
        why = "not counted (CUA_RL_DEVICE=gpu, nvidia-smi lists none)" if present is None else \
            f"your allocation ({', '.join(deploy.override_key(a) for a in users)})"
        return str(RECIPES / "config.yaml"), f"default: a GPU is present; {why}"
    recipe, fitted = deploy.fit_default(present)
    request.overrides[:0] = fitted   # first: what the user wrote stays last
    plural = "s" if present > 1 else ""
    return str(RECIPES / recipe), f"default: {present} GPU{plural} listed, fitted to the GPUs present"


def _gpus_line(config: CUAConfig, gpu: bool, present: int | None, config_file: str, why: str) -> str:
    """The ``gpus:`` line of --dry-run and of the run's header."""
    from cua_rl import deploy

    if not gpu:
        how = "no GPU found: vLLM and the trainer on the CPU"
    elif "fitted to the GPUs present" in why:
        how = f"{Path(config_file).name} fitted to the GPUs present"
    else:
        how = "the allocation as written" + (", checked against the GPUs present" if present is not None else "")
    return deploy.gpus_line(config, present, how)


def _check_agent_choice(config: CUAConfig) -> None:
    """A run that starts our agent service (the embedded stack, ``--agent embedded``) has no use for an agent
    URL: one given (``--gbox-mini-url``, GBOX_MINI_AGENT_BASE_URL, the config) is refused, not replaced."""
    from cua_rl.config import CUAConfig

    given = config.gbox_mini_agent_base_url
    if _starts_our_agent(config) and given != CUAConfig.gbox_mini_agent_base_url:
        which = "the embedded stack starts" if config.embedded_enabled else "--agent embedded starts"
        raise ConfigError(f"{which} our agent service, so the agent URL {given} would be ignored: drop "
                          "--gbox-mini-url (GBOX_MINI_AGENT_BASE_URL), or use --agent external to train with that agent")


def _check_custom_tasks(config: CUAConfig) -> None:
    """Tasks written in the config (``task_source.kind: custom``) are served by the embedded desktop gym, which
    the launcher starts with them; a gym of the user's evaluates only the tasks it defines."""
    if config.custom_tasks() and not (config.embedded_enabled and config.embedded_gym_id == "desktop"):
        where = "the miniwob gym" if config.embedded_enabled else f"the gym at {config.gym_base_url}"
        raise ConfigError(f"task_source kind=custom: tasks written in the config run on the embedded desktop gym "
                          f"only, not on {where} (a genv gym evaluates only the tasks it defines): add them to "
                          f"your gym and name them with kind=ids, or train without --gym")


def _preflight_line(config: CUAConfig) -> str:
    """What the embedded stack's preflight (``preflight.py``) finds, for ``--dry-run`` (which installs nothing)."""
    missing = missing_binaries(config.embedded_gym_id)
    userns = user_namespace_error()
    if not missing and userns is None:
        return "ok (the gym's binaries found, user namespaces available)"
    found = [f"missing {', '.join(sorted(missing))} (Debian: {' '.join(sorted(set(missing.values())))}; a run "
             f"installs them in a clone)"] if missing else []
    return "; ".join(found + ([f"no user namespaces ({userns})"] if userns else []))


def _starts_our_agent(config: CUAConfig) -> bool:
    return config.embedded_enabled or config.agent_service == "embedded"


def _agent_line(config: CUAConfig) -> str:
    if _starts_our_agent(config):
        return "ours, started beside the trainer (the policy endpoint on loopback)"
    return f"the service at {config.gbox_mini_agent_base_url} (it calls the policy endpoint)"


def _warn_secret_overrides(overrides: list[str]) -> None:
    for arg in overrides:
        if cli.is_secret_override(arg):
            print(f"train.sh: warning: {arg.split('=', 1)[0]} given as an override lands in argv and in the run's "
                  "saved config.yaml; prefer the environment (e.g. PROJECT_TOKEN in .env)", file=sys.stderr)


def _mode(config: CUAConfig) -> str:
    """Where the run's episodes play, in words (--dry-run's first line)."""
    if config.embedded_enabled:
        return f"embedded stack (gym id {config.embedded_gym_id})"
    urls, ray = config.gym_urls, config.gym_fleet.ray_gyms.enabled
    on_ray = "our gym on each Ray node with spare CPUs, once the trainer's workers are placed"
    if len(urls) == 1 and not ray:
        return f"external gym {urls[0]}"
    if not urls:
        return f"a fleet of gym hosts: {on_ray}"
    return (f"a fleet of {len(urls)} gym host{'s' if len(urls) > 1 else ''}: {', '.join(urls)}"
            + (f", plus {on_ray}" if ray else "")
            + " (each group placed on one host by capacity; docs/cluster.md)")


def _print_dry_run(request: cli.Request, config_file: str, why: str, config: CUAConfig, gpus_line: str = "") -> None:
    print("train.sh --dry-run: the config loads and checks; nothing is started")
    print(f"mode: {_mode(config)}")
    print(f"config: {config_file} ({why})")
    if gpus_line:
        print(f"gpus: {gpus_line}")
    print(f"agent: {_agent_line(config)}")
    trial = "a new timestamped trial at start" if config.trial_name == AUTO_TRIAL else config.trial_name
    if config.existing_run == "resume":
        trial = ("resume " + ("the newest run with a committed recover point" if config.trial_name == AUTO_TRIAL
                              else config.trial_name))
    print(f"run: {config.experiment_name} / {trial}")
    print("overrides:")
    for arg in request.overrides:
        print(f"  {cli.mask(arg)}")
    if "PROJECT_TOKEN" in request.environ:
        print("environment: PROJECT_TOKEN=**** (the monitor token; never an override)")
    for name in ("CUA_GYM_TOKEN", "CUA_AGENT_TOKEN"):
        if os.environ.get(name) or os.environ.get(f"{name}_FILE"):
            print(f"environment: {name}=**** (sent to the {name.split('_')[1].lower()} service; never an override)")
    if config.embedded_enabled:
        print(f"preflight: {_preflight_line(config)}")
    from cua_rl.run.estimate import of_config

    for line in of_config(config):
        print(line)
    print(f"trainer: python -m cua_rl.train --config {config_file} <overrides above> plus the run's own "
          "(trial name, statistics path" + (", the embedded services' URLs" if config.embedded_enabled else "")
          + (", the warm start" if config.sft.warm_start else "") + ")")


def _hub_access(config: CUAConfig, gpu: bool) -> None:
    """Offline unless the run needs the Hub: a CPU run (the tiny model, built offline, or a local warm start)
    or a model in a local directory never reaches it, so a machine without a route to it never waits on one.
    A Hub id on a GPU machine is downloaded as usual. Values the user set (environment, .env) win."""
    local = not gpu or Path(str(config.actor.path)).expanduser().is_dir()
    if local:
        for name in HUB_OFFLINE:
            os.environ.setdefault(name, "1")
    else:
        logger.info("model %s: Hugging Face Hub access allowed (HF_HUB_OFFLINE=%s)", config.actor.path,
                    os.environ.get("HF_HUB_OFFLINE", "unset"))


def main(argv: list[str] | None = None) -> int:
    try:
        request = cli.parse(sys.argv[1:] if argv is None else argv, dict(os.environ),
                            cli.default_env_files(CLONE))
    except cli.UsageError as exc:
        print(f"train.sh: {exc}", file=sys.stderr)
        return 2
    if request is None:
        cli.print_help("cua-train" if CLONE is None or Path(sys.argv[0]).name == "cua-train" else "train.sh")
        return 0
    os.environ.update(request.environ)   # .env values and the token reach every child through it
    apply_process_defaults()
    gpu = has_gpu()
    present = gpus.present(gpu)
    # the trainer's process imports AReaL while this one does the same to load the config (prewarm.py)
    early = (None if request.dry_run or request.print_config
             else Prewarmed.start(predicted_env(dict(os.environ), gpu), trainer_cwd()))
    try:
        try:
            before = dict(os.environ)
            setup_logging()
            _warn_secret_overrides(request.overrides)
            config_file, why, config = choose_config(request, gpu, present)
            gpus_line = _gpus_line(config, gpu, present, config_file, why)
            _check_agent_choice(config)
            _check_custom_tasks(config)
            if config.embedded_enabled and not request.dry_run:
                for line in check_embedded(config.embedded_gym_id, CLONE):
                    logger.info("preflight: %s", line)
            if early is not None:   # what AReaL's imports (swanlab, ...) put there: they do the same there
                early.set_by_imports = frozenset(k for k, v in os.environ.items() if before.get(k) != v)
            _hub_access(config, gpu)
        except (cli.UsageError, ConfigError, PreflightError) as exc:
            print(f"train.sh: {exc}", file=sys.stderr)
            return 2
        if request.print_config:
            print_config(config)
            return 0
        if request.dry_run:
            _print_dry_run(request, config_file, why, config, gpus_line)
            return 0 if request.offline else probe_services(config)   # the external services answer (probes.py)
        return run(config_file, config, list(request.overrides), gpu, early, gpus_line)
    finally:
        if early is not None:
            early.discard()


def print_config(config: CUAConfig) -> None:
    """The resolved config as YAML on stdout (``--print-config``, as Hydra's ``--cfg job``): the same dump AReaL's
    loader saves as the run's config.yaml."""
    import dataclasses

    import yaml

    sys.stdout.write(yaml.dump(dataclasses.asdict(config), default_flow_style=False, sort_keys=False))


def run(config_file: str, config: CUAConfig, overrides: list[str], gpu: bool, early: Prewarmed | None = None,
        gpus_line: str = "") -> int:
    """Train ``config`` (``config_file`` plus ``overrides``): everything after the decisions."""
    started = time.monotonic()
    resume = config.existing_run == "resume"
    named = config.trial_name != AUTO_TRIAL
    if not named:
        if resume:
            trial = newest_resumable(RunPaths.of(config, AUTO_TRIAL).checkpoints.parent)
            if trial is None:
                raise SystemExit(f"--resume: no run of experiment {config.experiment_name!r} has a committed "
                                 f"recover point; name one with trial_name=...")
        else:
            trial = new_trial_name(lambda name: RunPaths.of(config, name))
        overrides.append(f"trial_name={trial}")
        config = load_config(config_file, overrides)
        named = resume   # a resumed trial has name-resolve records to forget
    paths = RunPaths.of(config)
    claim_run_dir(paths, config.trial_name, config.existing_run)
    if config.embedded_enabled:   # before the gym's threads: its desktops' HOME mounts die with this process
        from cua_rl.local_gym.mounts import private_namespace

        private_namespace()
    if resume:
        point = resume_point(config)   # fail before anything starts; the trainer loads it
        logger.info("resuming run %s after step %d", config.trial_name, point.global_step + 1)
    logger.info("run %s/%s (config %s): logs %s", config.experiment_name, config.trial_name,
                Path(config_file).name, paths.logs)
    if gpus_line:
        logger.info("gpus: %s", gpus_line)
    # The embedded services run in this process: their per-episode lines go to a file, not the console.
    log_to_file(paths.logs / "launcher.log", quiet_console=os.environ.get("CUA_RL_CONSOLE") != "full")
    if named:   # a new timestamped trial has no records to forget
        _clear_name_records(config)
    run_overrides = list(overrides)   # the user's and the trial's: what the verdict loads its config with
    overrides.append(f"++stats_logger.tensorboard.path={paths.tensorboard}")
    env = dict(os.environ)
    if config.scheduler.type == "local":   # this machine's vLLM servers (trainer's, verdict's): their sockets
        env["VLLM_RPC_BASE_PATH"] = _vllm_socket_dir()   # (a Ray node has no such folder: vLLM's default there)
    rc, stopped_by = 1, None
    start = Path(config.actor.path)   # the policy the run starts from (the verdict's "before")
    with contextlib.ExitStack() as stack:
        try:
            if not gpu:
                env.update(_prepare_cpu(config))
            if config.sft.warm_start:
                from cua_rl.sft.warm_start import ensure_warm_start

                model = ensure_warm_start(config, config_file, overrides, paths.logs / "warm_start.log", env)
                overrides.append(f"actor.path={model}")   # its line said where (reusing, copied or built)
                start = Path(model)
            if config.embedded_enabled:
                overrides += _start_embedded(config, stack, env)
                overrides += monitor_for_embedded_run(config.embedded, config.monitor_base_url, paths.logs, env, stack)
            elif config.agent_service == "embedded":
                overrides += _start_embedded_agent(config, stack, env)
            cmd = [sys.executable, "-m", "cua_rl.train", "--config", config_file, *overrides]
            logger.info("starting the trainer: python -m cua_rl.train --config %s ...", config_file)
            rc, stopped_by = _run_trainer(cmd, env, paths.logs / "train.log", config.total_train_steps, early)
        except KeyboardInterrupt:
            logger.warning("interrupted; shutting everything down")
            rc, stopped_by = 130, signal.SIGINT
    elapsed = time.monotonic() - started   # the training's; the verdict's own time is in its lines
    if rc == 0 and config.verdict.enabled:
        _, why_not = verdict_tasks(config)
        if why_not is None:
            give_verdict(config_file, run_overrides, start, paths.logs, env)
        else:
            print(f"[cua-rl] verdict:     none: {why_not}", flush=True)
    from cua_rl.run.plot import plot_run

    plot_run(paths.logs)   # metrics.png beside metrics.jsonl, before the summary names it
    print_summary(paths, elapsed, rc, stopped_by, train_command())
    return rc


def _vllm_socket_dir() -> str:
    """A folder for the ZMQ sockets of this run's vLLM servers (``cua_rl.local_model.vllm_server.socket_dir``),
    removed when the launcher exits however the run ended: vLLM leaves them in /tmp when it is killed."""
    import atexit

    from cua_rl.local_model.vllm_server import socket_dir

    folder = socket_dir()
    atexit.register(shutil.rmtree, folder, True)
    return folder


def verdict_tasks(config: CUAConfig) -> tuple[list[str], str | None]:
    """(the run's training tasks its verdict plays, None) or ([], why there is no verdict for this run)
    (cua_rl/verdict.py: the embedded curriculum on the CPU, family tasks with both gated regimes)."""
    from cua_rl.local_gym.curriculum import GATED

    if not config.verdict.enabled:
        return [], "off (verdict.enabled=false)"
    if not config.embedded_enabled:
        return [], "the held-out yardstick is the embedded gym's curriculum; on your gym, cua-eval evaluates checkpoints"
    if config.cluster.n_gpus_per_node:
        return [], ("the verdict serves the model with vLLM on the CPU (cua_rl/evaluate.py); with GPUs, evaluate "
                    "checkpoints with cua-eval --model-url")
    source = config.task_source
    if config.task_sources or source.kind != "ids" or not source.task_ids:
        return [], "the run does not train on curriculum family tasks by id (task_source.kind: ids)"
    from cua_rl.local_gym import load_tasks
    from cua_rl.local_gym.curriculum import regimes

    tasks = load_tasks()
    for key in source.task_ids:
        task = tasks.get(str(key))
        if task is None or task.family is None or not set(GATED) <= {r.name for r in regimes(task.family)}:
            return [], f"task {key} has no held-out regimes {list(GATED)} (curriculum family key-sequence has)"
    return [str(k) for k in source.task_ids], None


def give_verdict(config_file: str, overrides: list[str], start: Path, logs: Path, env: dict) -> None:
    """The run's verdict on learning after a finished run it applies to (``verdict_tasks``): ``python -m
    cua_rl.verdict``, a process of its own as the trainer is, its output in the run's verdict.log;
    ``overrides``: the run's own, without the embedded services' addresses. Its failure or a Ctrl-C is reported, never the run's. The
    run's saved config.yaml is put back afterwards (AReaL's config loader writes it again)."""
    cmd = [sys.executable, "-m", "cua_rl.verdict", "--config", config_file, "--start", str(start), *overrides]
    saved = logs / "config.yaml"
    kept = saved.read_bytes() if saved.is_file() else None
    print(f"[cua-rl] verdict:     judging the run on held-out tasks (python -m cua_rl.verdict, about 2 minutes a "
          f"checkpoint on 2 CPU cores; verdict.enabled=false skips it; log: {logs / 'verdict.log'})", flush=True)
    with open(logs / "verdict.log", "ab") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        rc = wait_interruptibly(proc)
    except KeyboardInterrupt:
        print("[cua-rl] verdict:     interrupted; the run itself finished", flush=True)
        rc = proc.wait()
    finally:
        if kept is not None:
            saved.write_bytes(kept)
    if rc not in (0, -signal.SIGINT, 130):
        print(f"[cua-rl] verdict:     FAILED (exit code {rc}): see verdict.log in the run's log directory", flush=True)


def train_command() -> str:
    """How a user starts this launcher from a fresh shell: this clone's ``train.sh`` by its full path, else the
    installed ``cua-train`` (its PATH may lack this environment)."""
    script = CLONE / "examples" / "cua_agent" / "train.sh" if CLONE else None
    return str(script) if script and script.is_file() else own_command("cua-train", "cua_rl.run.launch")


if __name__ == "__main__":
    sys.exit(main())
