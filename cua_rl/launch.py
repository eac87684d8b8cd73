"""What ``train.sh`` execs after preparing the environment: ``python -m cua_rl.launch [FLAGS] [key=value ...]``.

Every start-up decision is made here, once:
- the flags, their environment variables and the ``.env`` files become Hydra overrides (``cua_rl.cli``);
- GPU or not (``has_gpu``: ``CUA_RL_DEVICE`` or ``nvidia-smi``), which decides the default config file;
- embedded or not (``CUAConfig.embedded_enabled`` of the loaded config: no gym URL, or ``embedded.enabled``);
- the values are checked by the config classes; ``--dry-run`` stops after that and prints what would run.

Then: the run's own directory (a timestamped trial), without a GPU the tiny model and vLLM's CPU environment,
the SFT warm start when ``sft.warm_start``, the embedded gym, agent service and monitor when embedded, and
``python -m cua_rl.train`` in AReaL's single-controller mode (AReaL's scheduler starts the actor and rollout
workers and vLLM, on a GPU or on the CPU alike).

Everything started here is stopped on exit, error or Ctrl-C (the trainer gets SIGTERM, then SIGKILL), and
the end prints where the logs, checkpoints and statistics are, plus the last rewards seen.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

from cua_rl import cli
from cua_rl.console import ANSI, TABLE_START, TrainerConsole
from cua_rl.logs import log_to_file, setup_logging
from cua_rl.areal_ext.model_watch import GONE_RE
from cua_rl.monitor.embedded import monitor_for_embedded_run
from cua_rl.areal_ext.resume import newest_resumable, resume_point, settle
from cua_rl.runs import AUTO_TRIAL, RunPaths, claim_run_dir, new_trial_name

logger = logging.getLogger("cua_rl.launch")
REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_DIR = REPO_ROOT / "examples" / "cua_agent"   # the recipes (config*.yaml) and .env


def has_gpu() -> bool:
    """The same decision as scripts/setup.sh: CUA_RL_DEVICE=cpu|gpu forces it, else `nvidia-smi -L`."""
    forced = os.environ.get("CUA_RL_DEVICE", "auto")
    if forced in ("cpu", "gpu"):
        return forced == "gpu"
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return any(line.startswith("GPU") for line in out.splitlines())


def read_scalars(tb_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Scalars from tensorboard event files (TFRecord framing + tensorboardX's Event proto; no TF needed)."""
    from tensorboardX.proto import event_pb2

    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(tb_dir.glob("**/events.out.tfevents.*")):
        data = path.read_bytes()
        pos = 0
        while pos + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            record = data[pos + 12: pos + 12 + length]
            pos += 12 + length + 4
            event = event_pb2.Event.FromString(record)
            for v in event.summary.value:
                scalars.setdefault(v.tag, []).append((event.step, v.simple_value))
    return scalars


class ConfigError(SystemExit):
    """The config file plus overrides do not load or validate: one readable message, exit code 2."""


def load_config(config_file: str, overrides: list[str], flag_keys: dict[str, str] | None = None):
    """The validated CUAConfig of ``config_file`` plus ``overrides``. AReaL's loader saves a config.yaml
    into the trial's log directory; under the ``auto`` placeholder that directory is removed again when
    the file is all it holds (the real trial name is chosen later). A bad value raises ``ConfigError``
    naming the flag that set it (``flag_keys``: config key -> flag, from ``cli.parse``)."""
    from areal.api.cli_args import load_expr_config

    from cua_rl.config import CUAConfig

    if not Path(config_file).is_file():
        raise ConfigError(f"config file not found: {config_file}")
    try:
        config, _ = load_expr_config(["--config", config_file, *overrides], CUAConfig)
    except Exception as exc:  # Hydra's parse errors, OmegaConf's type errors, our __post_init__ checks
        raise ConfigError(_config_error(config_file, exc, flag_keys or {})) from None
    if config.trial_name == AUTO_TRIAL:
        _drop_saved_config(config)
    return config


def _drop_saved_config(config) -> None:
    """Remove the log directory AReaL's loader made for ``config`` when its config.yaml is all it holds (no
    run ever wrote there), and the experiment directory above it when that is left empty."""
    stray = RunPaths.of(config).logs
    if stray.is_dir() and {p.name for p in stray.iterdir()} <= {"config.yaml"}:
        shutil.rmtree(stray)
        with contextlib.suppress(OSError):   # not empty: other runs of the experiment
            stray.parent.rmdir()


def _config_error(config_file: str, exc: Exception, flag_keys: dict[str, str]) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    flags = sorted({flag for key, flag in flag_keys.items() if key in text})
    source = f" (set by {', '.join(flags)})" if flags else ""
    return f"invalid configuration {config_file} + overrides: {text}{source}"


def _clear_name_records(config) -> None:
    """Forget this experiment/trial's name-resolve records (as AReaL's own launchers do): a previous run
    of the same trial leaves e.g. its weight-update entry, and the next update would then fail."""
    from areal.utils import name_resolve, names

    name_resolve.logger.setLevel(logging.WARNING)   # "No such name resolve path" is not news
    name_resolve.reconfigure(config.cluster.name_resolve)
    name_resolve.clear_subtree(names.trial_root(experiment_name=config.experiment_name,
                                                trial_name=config.trial_name))


def _start_embedded(config, stack: contextlib.ExitStack) -> list[str]:
    """Gym + agent service in this process; returns the overrides that point training at them."""
    from cua_rl.local_agent.server import start_agent_server
    from cua_rl.local_gym.server import start_gym_server

    emb = config.embedded
    t0 = time.monotonic()
    tasks_dir = os.path.abspath(os.path.expanduser(emb.tasks_dir)) if emb.tasks_dir else None
    gym = start_gym_server(emb.host, emb.gym_port, gym_id=emb.gym_id, pool_size=emb.num_desktops,
                           tasks_dir=tasks_dir)
    stack.callback(gym.stop)
    agent = start_agent_server(emb.host, emb.agent_port)
    stack.callback(agent.stop)
    logger.info("embedded gym at %s (gym id %s), agent service at %s (%.1fs)", gym.url, gym.gym_id, agent.url,
                time.monotonic() - t0)
    return [f"gym_base_url={gym.url}", f"gym_id={gym.gym_id}", f"gbox_mini_agent_base_url={agent.url}"]


def _prepare_cpu(config) -> dict[str, str]:
    """No GPU: the tiny model (built offline when ``actor.path`` has none) and vLLM's CPU environment."""
    from cua_rl.local_model.vllm_server import CPU_ENV

    from cua_rl.config import resolve_tiny_model_dir

    model_dir = Path(config.actor.path)
    if model_dir == Path(resolve_tiny_model_dir(config)):
        from cua_rl.local_model.tiny import build_tiny, is_current

        if not is_current(model_dir):  # missing, or left by an older builder (e.g. a head size vLLM rejects)
            logger.info("building the tiny offline model at %s", model_dir)
            build_tiny(model_dir)
    elif not (model_dir / "config.json").exists():
        raise SystemExit(f"actor.path {model_dir} has no config.json: not a model directory")
    logger.info("no GPU: AReaL launches vLLM on the CPU for %s", model_dir)
    return dict(CPU_ENV)


def _run_trainer(cmd: list[str], env: dict[str, str], log_file: Path,
                 total_steps: int | None = None) -> tuple[int, int | None]:
    """Run the trainer (``cua_rl.train``) in its own process group: all its output to ``log_file``, and to the console through
    ``TrainerConsole`` (one line per step instead of AReaL's statistics table; CUA_RL_CONSOLE=full: all)."""
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    console = None if os.environ.get("CUA_RL_CONSOLE") == "full" else \
        TrainerConsole(total_steps, str(log_file), quiet=True)

    def show(lines: list[str]) -> None:
        for text in lines:
            sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()

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
            rc = proc.wait()
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
        for s, h in old.items():
            signal.signal(s, h)
    if rc != 0 and stopped_by:   # asked to stop (Ctrl-C, SIGTERM): not a failure, no traceback to show
        return 128 + stopped_by[0], stopped_by[0]
    if rc != 0 and console is not None:
        _show_tail(log_file)
    return rc, None


def _show_tail(log_file: Path, lines: int = 40) -> None:
    """A failed trainer's last lines, which the quiet console kept back (the traceback is usually there);
    AReaL's statistics tables are left out (a trainer killed after a step ends its log with one)."""
    try:
        text = log_file.read_text(errors="replace").splitlines()
    except OSError:
        return
    tail = [line for line in text if not ANSI.sub("", line).strip().startswith(TABLE_START)][-lines:]
    print(f"[cua-rl] the trainer failed; the last {len(tail)} lines of {log_file} (statistics tables left out):")
    for line in tail:
        print("  " + ANSI.sub("", line))


def endpoint_totals(logs: Path) -> dict[str, int]:
    """The policy endpoints' counts (verified prompts, mismatches, ...) and the episode counts (evaluated,
    lost, groups rejected), summed over rollout workers."""
    totals: dict[str, int] = {}
    for f in sorted((logs / "policy_endpoint").glob("*.json")):
        try:
            for k, v in json.loads(f.read_text()).items():
                totals[k] = totals.get(k, 0) + int(v)
        except (OSError, ValueError) as exc:
            logger.warning("unreadable endpoint counts %s: %s", f, exc)
    return totals


# AReaL's trainer calling its inference server (vLLM/SGLang) and finding nobody there: the server died.
_ENGINE_GONE = re.compile(r"Engine method '(\w+)' failed: .*Addr: (\S+?)\. .*(?:ConnectionRefused|ClientConnectorError)")


_LOST = "it exited or was killed; see rollout.log. The episodes in flight were lost, not scored."


def failure_cause(train_log: Path) -> str | None:
    """A failed run's cause in one sentence, when ``train.log`` shows one we know; else None."""
    try:
        text = train_log.read_text(errors="replace")
    except OSError:
        return None
    watched = GONE_RE.search(text)   # cua_rl.areal_ext.model_watch stopped the run
    if watched:
        return f"{watched.group(0)}: {_LOST}"
    gone = _ENGINE_GONE.search(text)
    if gone:
        return (f"the model server at {gone.group(2)} stopped answering (connection refused when the trainer "
                f"called {gone.group(1)}): {_LOST}")
    return None


def _summary(paths: RunPaths, elapsed: float, rc: int, stopped_by: int | None = None) -> None:
    """What the run did; ``stopped_by``: the signal that asked the launcher to stop it (not a failure)."""
    outcome = ("finished" if rc == 0 else f"stopped by {signal.Signals(stopped_by).name}" if stopped_by
               else f"FAILED (exit code {rc})")
    print(f"\n[cua-rl] training {outcome} in {elapsed:.0f} s")
    print(f"[cua-rl] logs:        {paths.logs}  (train.log; rollout.log: rollout worker and vLLM; actor.log)")
    totals = endpoint_totals(paths.logs)
    if totals:
        print(f"[cua-rl] policy endpoint: {totals.get('verified_turns', 0)} turns with prompt ids verified "
              f"against the engine, {totals.get('prompt_mismatches', 0)} mismatches refused, "
              f"{totals.get('straddles', 0)} interrupted outputs and "
              f"{totals.get('vision_token_outputs', 0)} with vision placeholder tokens regenerated, "
              f"{totals.get('failed_turns', 0)} failed turns")
    if "episodes_evaluated" in totals:
        print(f"[cua-rl] episodes:    {totals['episodes_evaluated']} evaluated, {totals.get('episodes_lost', 0)} lost to "
              f"infrastructure failures (gym, agent service or model server: never given a reward), "
              f"{totals.get('groups_rejected', 0)} groups rejected for too few evaluated episodes")
    saved = paths.checkpoints.is_dir() and any(p.is_file() for p in paths.checkpoints.rglob("*"))
    print(f"[cua-rl] checkpoints: {paths.checkpoints}" + ("" if saved else "  (none written: see saver.freq_steps)"))
    if rc != 0:
        cause = None if stopped_by else failure_cause(paths.logs / "train.log")
        if cause:
            print(f"[cua-rl] cause:       {cause}")
        point = settle(paths.checkpoints) if paths.checkpoints.is_dir() else None   # the trainer is gone
        if point is not None:
            print(f"[cua-rl] recover point: after step {point['global_step'] + 1}; continue this run with: "
                  f"train.sh --resume trial_name={paths.checkpoints.name} (and the same other arguments)")
    print(f"[cua-rl] statistics:  {paths.tensorboard}  (tensorboard event files)")
    try:
        scalars = read_scalars(paths.tensorboard)
    except Exception as exc:  # a summary must never hide the run's own exit code
        print(f"[cua-rl] (could not read statistics: {exc})")
        return
    wanted = ("rollout/reward", "rollout/task_success", "eval-rollout/reward", "eval-rollout/task_success")
    for tag in (t for t in wanted if t in scalars):
        print(f"[cua-rl]   {tag}: {by_step(scalars[tag])}")


def by_step(points: list[tuple[int, float]]) -> str:
    """``steps 1-24: 0.781 0.833 - ...``: AReaL's 0-based global steps numbered as the console numbers them,
    '-' for a step without the statistic."""
    values = dict(points)
    first, last = min(values), max(values)
    return f"steps {first + 1}-{last + 1}: " + " ".join(
        f"{values[s]:.3f}" if s in values else "-" for s in range(first, last + 1))


def choose_config(request: cli.Request, gpu: bool) -> tuple[str, str, object]:
    """(config file, why it was chosen, its loaded config). Given: that file. Else with a GPU config.yaml;
    without one config.learn.yaml when the run is embedded (the learning recipe), config.cpu.yaml when it
    names a gym: the embedded question is answered by the loaded config itself (``embedded_enabled``)."""
    overrides, keys = request.overrides, request.flag_keys
    if request.config_file:
        path = str(Path(request.config_file).expanduser().resolve())   # relative to the caller's directory
        return path, "given", load_config(path, overrides, keys)
    if gpu:
        path = str(EXAMPLE_DIR / "config.yaml")
        return path, "default: a GPU is present", load_config(path, overrides, keys)
    path = str(EXAMPLE_DIR / "config.learn.yaml")
    config = load_config(path, overrides, keys)
    if config.embedded_enabled:
        return path, "default: no GPU found, embedded stack: the learning recipe", config
    _drop_saved_config(config)   # loaded only to ask; its experiment's log directory must not stay behind
    path = str(EXAMPLE_DIR / "config.cpu.yaml")
    return path, "default: no GPU found, your gym", load_config(path, overrides, keys)


def _warn_secret_overrides(overrides: list[str]) -> None:
    for arg in overrides:
        if cli.is_secret_override(arg):
            print(f"train.sh: warning: {arg.split('=', 1)[0]} given as an override lands in argv and in the run's "
                  "saved config.yaml; prefer the environment (e.g. PROJECT_TOKEN in .env)", file=sys.stderr)


def _print_dry_run(request: cli.Request, config_file: str, why: str, config) -> None:
    print("train.sh --dry-run: the config loads and checks; nothing is started")
    print("mode: embedded stack" if config.embedded_enabled else f"mode: external gym {config.gym_base_url}")
    print(f"config: {config_file} ({why})")
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
    print(f"trainer: python -m cua_rl.train --config {config_file} <overrides above> plus the run's own "
          "(trial name, statistics path" + (", the embedded services' URLs" if config.embedded_enabled else "")
          + (", the warm start" if config.sft.warm_start else "") + ")")


def main(argv: list[str] | None = None) -> int:
    try:
        request = cli.parse(sys.argv[1:] if argv is None else argv, dict(os.environ),
                            cli.default_env_files(REPO_ROOT))
        if request is None:
            cli.print_help()
            return 0
        os.environ.update(request.environ)   # .env values and the token reach every child through it
        setup_logging()
        _warn_secret_overrides(request.overrides)
        gpu = has_gpu()
        config_file, why, config = choose_config(request, gpu)
    except (cli.UsageError, ConfigError) as exc:
        print(f"train.sh: {exc}", file=sys.stderr)
        return 2
    if request.dry_run:
        _print_dry_run(request, config_file, why, config)
        return 0
    return run(config_file, config, list(request.overrides), gpu)


def run(config_file: str, config, overrides: list[str], gpu: bool) -> int:
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
    # The embedded services run in this process: their per-episode lines go to a file, not the console.
    log_to_file(paths.logs / "launcher.log", quiet_console=os.environ.get("CUA_RL_CONSOLE") != "full")
    if named:   # a new timestamped trial has no records to forget
        _clear_name_records(config)
    overrides.append(f"++stats_logger.tensorboard.path={paths.tensorboard}")
    env = dict(os.environ)
    rc, stopped_by = 1, None
    with contextlib.ExitStack() as stack:
        try:
            if not gpu:
                env.update(_prepare_cpu(config))
            if config.sft.warm_start:
                from cua_rl.sft.warm_start import ensure_warm_start

                model = ensure_warm_start(config, config_file, overrides, paths.logs / "warm_start.log", env)
                overrides.append(f"actor.path={model}")
                logger.info("training from the SFT warm start %s", model)
            if config.embedded_enabled:
                overrides += _start_embedded(config, stack)
                overrides += monitor_for_embedded_run(config, paths.logs, env, stack)
            cmd = [sys.executable, "-m", "cua_rl.train", "--config", config_file, *overrides]
            logger.info("starting the trainer: python -m cua_rl.train --config %s ...", config_file)
            rc, stopped_by = _run_trainer(cmd, env, paths.logs / "train.log", config.total_train_steps)
        except KeyboardInterrupt:
            logger.warning("interrupted; shutting everything down")
            rc, stopped_by = 130, signal.SIGINT
    _summary(paths, time.monotonic() - started, rc, stopped_by)
    return rc


if __name__ == "__main__":
    sys.exit(main())
