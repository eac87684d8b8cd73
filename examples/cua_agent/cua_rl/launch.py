"""What ``train.sh`` execs: ``python -m cua_rl.launch --config CONFIG [--embedded] -- OVERRIDES...``.

- ``--embedded``: start the gym (X11 desktops) and the agent service in this process, point the config at
  them, and run training against them.
- ``train.py`` always runs in AReaL's single-controller mode: AReaL's local scheduler starts the RPC workers
  (actor, rollout) and the rollout worker launches AReaL's vLLM server, on a GPU or on the CPU alike. Without
  a GPU the only differences are the config (config.cpu.yaml: sizes, float32, CPU worker extension), vLLM's
  CPU environment (``CPU_ENV``) and the tiny model, built offline first when missing.

Everything started here is stopped on exit, error or Ctrl-C (the trainer gets SIGTERM, then SIGKILL), and
the end prints where the logs, checkpoints and statistics are, plus the last rewards seen.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import logging
import os
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from cua_rl.console import TrainerConsole
from cua_rl.logs import setup_logging
from cua_rl.monitor.embedded import monitor_for_embedded_run

logger = logging.getLogger("cua_rl.launch")
EXAMPLE_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = EXAMPLE_DIR.parents[1]


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


@dataclass
class RunPaths:
    logs: Path
    checkpoints: Path
    tensorboard: Path

    @classmethod
    def of(cls, config, trial: str | None = None) -> "RunPaths":
        """The directories AReaL's StatsLogger and Saver use for this run (``trial`` in place of the
        config's), computed without creating them (AReaL's own getters make the directories)."""
        user, s = getpass.getuser(), config.stats_logger
        trial = trial or s.trial_name
        logs = Path(f"{s.fileroot}/logs/{user}/{s.experiment_name}/{trial}")
        ckpt = Path(f"{config.saver.fileroot}/checkpoints/{user}/{config.saver.experiment_name}/{trial}")
        return cls(logs=logs, checkpoints=ckpt, tensorboard=logs / "tensorboard")


AUTO_TRIAL = "auto"


def run_exists(paths: RunPaths) -> bool:
    """A run of this experiment/trial already trained here (loading a config only writes config.yaml, and
    AReaL may create an empty checkpoint directory)."""
    return ((paths.logs / "train.log").exists() or paths.tensorboard.exists()
            or (paths.checkpoints.is_dir() and any(paths.checkpoints.iterdir())))


def new_trial_name(logs_of, now: float | None = None) -> str:
    """``run<YYYYmmdd_HHMMSS>`` (AReaL trial names take no '-'), suffixed ``_2``, ``_3``... while
    ``logs_of(name)`` (a name's RunPaths) shows that a run of that name exists."""
    base = time.strftime("run%Y%m%d_%H%M%S", time.localtime(now))
    name, n = base, 1
    while run_exists(logs_of(name)):
        n += 1
        name = f"{base}_{n}"
    return name


def claim_run_dir(paths: RunPaths, trial: str, existing_run: str) -> None:
    """An explicit trial name whose run exists is refused, or its logs and checkpoints are removed when the
    user said ``existing_run=overwrite``: runs never share statistics, logs or checkpoints."""
    if not run_exists(paths):
        return
    if existing_run != "overwrite":
        raise SystemExit(f"a run named {trial!r} already exists ({paths.logs}); choose another trial_name, "
                         f"leave it at '{AUTO_TRIAL}' for a new timestamped one, or pass existing_run=overwrite "
                         f"to delete its logs and checkpoints")
    for d in (paths.logs, paths.checkpoints):
        if d.exists():
            logger.warning("existing_run=overwrite: deleting %s", d)
            shutil.rmtree(d)


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


def load_config(config_file: str, overrides: list[str]):
    """The validated CUAConfig of ``config_file`` plus ``overrides``. AReaL's loader saves a config.yaml
    into the trial's log directory; under the ``auto`` placeholder that directory is removed again when
    the file is all it holds (the real trial name is chosen later)."""
    sys.path.insert(0, str(EXAMPLE_DIR))
    from areal.api.cli_args import load_expr_config

    from configs import CUAConfig

    config, _ = load_expr_config(["--config", config_file, *overrides], CUAConfig)
    if config.trial_name == AUTO_TRIAL:
        stray = RunPaths.of(config).logs
        if stray.is_dir() and {p.name for p in stray.iterdir()} <= {"config.yaml"}:
            shutil.rmtree(stray)
    return config


def _clear_name_records(config) -> None:
    """Forget this experiment/trial's name-resolve records (as AReaL's own launchers do): a previous run
    of the same trial leaves e.g. its weight-update entry, and the next update would then fail."""
    from areal.utils import name_resolve, names

    name_resolve.reconfigure(config.cluster.name_resolve)
    name_resolve.clear_subtree(names.trial_root(experiment_name=config.experiment_name,
                                                trial_name=config.trial_name))


def _start_embedded(config, stack: contextlib.ExitStack) -> list[str]:
    """Gym + agent service in this process; returns the overrides that point training at them."""
    from cua_rl.local_agent.server import start_agent_server
    from cua_rl.local_gym.server import start_gym_server

    emb = config.embedded
    t0 = time.monotonic()
    gym = start_gym_server(emb.host, emb.gym_port, gym_id=emb.gym_id, pool_size=emb.num_desktops)
    stack.callback(gym.stop)
    agent = start_agent_server(emb.host, emb.agent_port)
    stack.callback(agent.stop)
    logger.info("embedded gym at %s (gym id %s), agent service at %s (%.1fs)", gym.url, gym.gym_id, agent.url,
                time.monotonic() - t0)
    return [f"gym_base_url={gym.url}", f"gym_id={gym.gym_id}", f"gbox_mini_agent_base_url={agent.url}"]


def _prepare_cpu(config) -> dict[str, str]:
    """No GPU: the tiny model (built offline when ``actor.path`` has none) and vLLM's CPU environment."""
    from cua_rl.local_model.vllm_server import CPU_ENV

    from configs import resolve_tiny_model_dir

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


def _run_trainer(cmd: list[str], env: dict[str, str], log_file: Path, total_steps: int | None = None) -> int:
    """Run train.py in its own process group: all its output to ``log_file``, and to the console through
    ``TrainerConsole`` (one line per step instead of AReaL's statistics table; CUA_RL_CONSOLE=full: all)."""
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    console = None if os.environ.get("CUA_RL_CONSOLE") == "full" else TrainerConsole(total_steps, str(log_file))

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

    def stop(signum, _frame) -> None:
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
    return rc


def endpoint_totals(logs: Path) -> dict[str, int]:
    """The policy endpoints' counts (verified prompts, mismatches, ...) summed over rollout workers."""
    totals: dict[str, int] = {}
    for f in sorted((logs / "policy_endpoint").glob("*.json")):
        try:
            for k, v in json.loads(f.read_text()).items():
                totals[k] = totals.get(k, 0) + int(v)
        except (OSError, ValueError) as exc:
            logger.warning("unreadable endpoint counts %s: %s", f, exc)
    return totals


def _summary(paths: RunPaths, elapsed: float, rc: int) -> None:
    print(f"\n[cua-rl] training {'finished' if rc == 0 else f'FAILED (exit code {rc})'} in {elapsed:.0f} s")
    print(f"[cua-rl] logs:        {paths.logs}  (train.log; rollout.log: rollout worker and vLLM; actor.log)")
    totals = endpoint_totals(paths.logs)
    if totals:
        print(f"[cua-rl] policy endpoint: {totals.get('verified_turns', 0)} turns with prompt ids verified "
              f"against the engine, {totals.get('prompt_mismatches', 0)} mismatches refused, "
              f"{totals.get('straddles', 0)} interrupted outputs and "
              f"{totals.get('vision_token_outputs', 0)} with vision placeholder tokens regenerated, "
              f"{totals.get('failed_turns', 0)} failed turns")
    saved = paths.checkpoints.is_dir() and any(p.is_file() for p in paths.checkpoints.rglob("*"))
    print(f"[cua-rl] checkpoints: {paths.checkpoints}" + ("" if saved else "  (none written: see saver.freq_steps)"))
    print(f"[cua-rl] statistics:  {paths.tensorboard}  (tensorboard event files)")
    try:
        scalars = read_scalars(paths.tensorboard)
    except Exception as exc:  # a summary must never hide the run's own exit code
        print(f"[cua-rl] (could not read statistics: {exc})")
        return
    wanted = ("rollout/reward", "rollout/task_success", "eval-rollout/reward", "eval-rollout/task_success",
              "ppo_actor/task_reward/avg")
    for tag in (t for t in wanted if t in scalars):
        print(f"[cua-rl]   {tag}: " + ", ".join(f"step {s}: {v:.3f}" for s, v in scalars[tag]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cua_rl.launch")
    parser.add_argument("--config", required=True)
    parser.add_argument("--embedded", action="store_true", help="start the embedded gym and agent service")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (after --)")
    args = parser.parse_args(argv)
    setup_logging()
    started = time.monotonic()
    config_file = str(Path(args.config).resolve())
    overrides = list(args.overrides)
    config = load_config(config_file, overrides)  # validates the config before anything starts
    if config.trial_name == AUTO_TRIAL:
        trial = new_trial_name(lambda name: RunPaths.of(config, name))
        overrides.append(f"trial_name={trial}")
        config = load_config(config_file, overrides)
    paths = RunPaths.of(config)
    claim_run_dir(paths, config.trial_name, config.existing_run)
    logger.info("run %s/%s: logs %s", config.experiment_name, config.trial_name, paths.logs)
    _clear_name_records(config)
    overrides.append(f"++stats_logger.tensorboard.path={paths.tensorboard}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(EXAMPLE_DIR), *filter(None, [os.environ.get("PYTHONPATH")])])}
    rc = 1
    with contextlib.ExitStack() as stack:
        try:
            if not has_gpu():
                env.update(_prepare_cpu(config))
            if config.sft.warm_start:
                from cua_rl.sft.warm_start import ensure_warm_start

                model = ensure_warm_start(config, config_file, overrides, paths.logs / "warm_start.log", env)
                overrides.append(f"actor.path={model}")
                logger.info("training from the SFT warm start %s", model)
            if args.embedded or config.embedded_enabled:
                overrides += _start_embedded(config, stack)
                overrides += monitor_for_embedded_run(config, paths.logs, env, stack)
            cmd = [sys.executable, str(EXAMPLE_DIR / "train.py"), "--config", config_file, *overrides]
            logger.info("starting the trainer: %s", " ".join(cmd[:4]) + " ...")
            rc = _run_trainer(cmd, env, paths.logs / "train.log", config.total_train_steps)
        except KeyboardInterrupt:
            logger.warning("interrupted; shutting everything down")
            rc = 130
    _summary(paths, time.monotonic() - started, rc)
    return rc


if __name__ == "__main__":
    sys.exit(main())
