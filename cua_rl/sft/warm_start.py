"""The warm start a run trains from when ``sft.warm_start`` is on: SFT on the config's demonstrations, built
once and kept.

The launcher calls ``ensure_warm_start`` before the trainer starts and trains from the directory it returns
(``actor.path``). The build is the user's own command, ``python -m cua_rl.sft``, run as a child process so the
SFT engine's torch state and rank variables stay out of the launcher. A build is keyed by everything its
checkpoint depends on (``warm_start_key``): the ``sft`` section, the base model, the prompt settings and the
source of the demonstrator, curriculum, prompt and row code. The same key finds the same directory under
``<CUA_RL_HOME>/warm-starts``, so later runs start at once; a build goes to a temporary directory that is
renamed only when complete, so a killed build is never picked up.

A fresh clone's first run need not build at all: the README's recipes have their warm starts pinned in the
repository (``PINS``; scripts/pin_warm_starts.py), each stamped with what it was built from (``PINNED.json``:
``pin_key``, the key's inputs with the base model named by its builder's files rather than its path and file
times, and ``sources``, a hash of ``SOURCES`` and the demonstrated tasks' files). When both match this run's,
the pin is copied where a build would go; when only the sources differ, the run builds and says why.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from cua_rl import cua_rl_home
from cua_rl.progress import console

if TYPE_CHECKING:
    from cua_rl.config import CUAConfig


logger = logging.getLogger("cua_rl.sft")

PACKAGE = Path(__file__).resolve().parents[1]      # cua_rl
# The code a warm start depends on: demonstrations, curriculum, prompt building, rows, SFT training.
SOURCES = ("sft/__main__.py", "sft/demos.py", "sft/rows.py", "sft/train.py", "local_gym/curriculum.py",
           "local_gym/board.tcl", "local_agent", "policy", "sft/miniwob_demos.py", "local_gym/miniwob_solvers.py")
# and the task files of the tasks it demonstrates (``sft.tasks``; task_files): not every task of the gym
STAMP = "warm_start.json"
PINS = PACKAGE / "recipes" / "pinned" / "warm-starts"   # the pinned warm starts, one folder per recipe
PINNED = "PINNED.json"                                   # a pin's stamp: what it was built from, where, when
# The SFT child's progress lines: "recorded 16/128 demonstrations", "SFT step 15/300: loss ...".
PROGRESS = re.compile(r"(recorded|SFT step) (\d+)/(\d+)")


def _hash_tree(h, path: Path) -> None:
    files = sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts) \
        if path.is_dir() else [path]
    for f in files:
        h.update(str(f.relative_to(PACKAGE)).encode())
        h.update(f.read_bytes())


def _hash_sources(h) -> None:
    """Feed every file of ``SOURCES`` (path and bytes) into the hash ``h``."""
    for rel in SOURCES:
        if (PACKAGE / rel).exists():
            _hash_tree(h, PACKAGE / rel)


def _base_model_identity(model_dir: Path) -> dict:
    """What names the base weights without reading them: its config, the tiny builder's stamp when present,
    and the size and time of each weight file."""
    ident = {"path": str(model_dir)}
    for name in ("config.json", "tiny_spec.json"):
        if (model_dir / name).exists():
            ident[name] = hashlib.sha256((model_dir / name).read_bytes()).hexdigest()
    for f in sorted(model_dir.glob("*.safetensors")):
        st = f.stat()
        ident[f.name] = [st.st_size, st.st_mtime_ns]
    return ident


def _inputs(config: CUAConfig, base: dict) -> dict:
    sft = {k: v for k, v in asdict(config.sft).items() if k not in ("output_dir", "warm_start")}
    inputs = {"sft": sft, "policy": asdict(config.policy), "agent": config.gbox_mini_agent_agent, "base": base}
    if config.gym_id == "miniwob":   # the same task names would be MiniWoB++ pages, not curriculum tasks
        inputs["gym"] = "miniwob"
    return inputs


def warm_start_key(config: CUAConfig) -> str:
    """16 hex digits naming what a warm start of ``config`` is built from."""
    base = _base_model_identity(Path(os.path.expanduser(config.actor.path)))
    h = hashlib.sha256(json.dumps(_inputs(config, base), sort_keys=True, default=str).encode())
    _hash_sources(h)
    for path in task_files(config.sft.tasks):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def pin_key(config: CUAConfig) -> str | None:
    """16 hex digits naming the settings a warm start of ``config`` is built with, the same on every machine: the
    key's inputs with the base model named by its builder's files (the tiny model's ``config.json`` and
    ``tiny_spec.json``), not its path or file times. None when the base is not a tiny model: only those are
    pinned."""
    base = _base_model_identity(Path(os.path.expanduser(config.actor.path)))
    if "tiny_spec.json" not in base:
        return None
    base = {k: v for k, v in base.items() if k in ("config.json", "tiny_spec.json")}
    return hashlib.sha256(json.dumps(_inputs(config, base), sort_keys=True, default=str).encode()).hexdigest()[:16]


def sources_hash(config: CUAConfig) -> str:
    """16 hex digits naming the code and task files a warm start of ``config`` is built from (``SOURCES`` and
    its tasks' files), the same in every clone: what a pin records, so a pin older than its sources is told."""
    h = hashlib.sha256()
    _hash_sources(h)
    for path in task_files(config.sft.tasks):
        h.update(str(path.relative_to(PACKAGE)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def find_pin(config: CUAConfig) -> tuple[Path | None, str]:
    """The pinned warm start that stands for a build of ``config`` here, or (None, why none does: "" when no pin
    has this config's settings, else which of its sources differ)."""
    key = pin_key(config)
    if key is None:
        return None, ""
    sources = sources_hash(config)
    for stamp in sorted(PINS.glob(f"*/{PINNED}")):
        pin = json.loads(stamp.read_text())
        if pin.get("pin_key") != key:
            continue
        if not (stamp.parent / "model.safetensors").is_file():   # an install without the weights (a wheel)
            return None, f"the pinned warm start {stamp.parent.name} has no weights here"
        if pin.get("sources") != sources:
            return None, (f"the pinned warm start {stamp.parent.name} was built from other sources (pinned "
                          f"{pin.get('sources')}, this clone {sources}: warm_start.SOURCES changed since "
                          f"{pin.get('built')}; scripts/pin_warm_starts.py re-pins)")
        return stamp.parent, ""
    return None, ""


def task_files(task_keys) -> list[Path]:
    """The YAML files of the gym's tasks named by ``task_keys`` (a warm start's demonstrated tasks); an edit to
    another task of the gym changes no warm start."""
    from cua_rl.local_gym import tasks as gym_tasks

    directory = Path(gym_tasks.TASKS_DIR)
    tasks = gym_tasks.load_tasks(directory)
    found = [task for key in task_keys if (task := tasks.get(str(key))) is not None]
    return sorted(path for task in found if (path := directory / f"{task.task_id}.yaml").is_file())


def _dir_of(key: str) -> Path:
    return Path(cua_rl_home()) / "warm-starts" / f"sft-{key}"


def warm_start_dir(config: CUAConfig) -> Path:
    """Where the warm start of ``config`` is (or will be) kept."""
    return _dir_of(warm_start_key(config))


def is_built(path: Path) -> bool:
    return (path / STAMP).exists() and (path / "config.json").exists()


def ensure_warm_start(config: CUAConfig, config_file: str, overrides: list[str], log_file: Path,
                      env: dict[str, str] | None = None) -> Path:
    """The warm start of ``config``: reused when built, else built now (``python -m cua_rl.sft`` with the
    run's config file and overrides, in ``env``; output to ``log_file``, progress lines to the console)."""
    from cua_rl.local_model.tiny import ensure_embedded_model

    ensure_embedded_model(config)   # the key names the base weights: they must exist when it is taken
    key = warm_start_key(config)   # once: the stamp must name the key the directory was found by
    out = _dir_of(key)
    if is_built(out):
        logger.info("SFT warm start: reusing %s", out)
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f"{out.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    pin, why = find_pin(config)
    if pin is not None:
        record = _copy_pin(pin, partial, key)
        os.replace(partial, out)
        logger.info("SFT warm start: the pinned one (%s, built %s) matches this run's settings and sources; "
                    "copied to %s, nothing to build", pin, record.get("built"), out)
        return out
    if why:
        print(f"[cua-rl] SFT warm start: building it (about 8 minutes on 2 cores): {why}", flush=True)
    logger.info("SFT warm start: %d demonstrations per task of %s, %d steps (first run only; kept in %s; "
                "log %s)", config.sft.demos_per_task, list(config.sft.tasks), config.sft.steps, out, log_file)
    started = time.monotonic()
    cmd = [sys.executable, "-m", "cua_rl.sft", "--config", config_file, *overrides,
           f"sft.output_dir={partial}", "sft.warm_start=false"]
    try:
        result = _run_showing_progress(cmd, log_file, env)
        result["checkpoint"] = str(out)
        (partial / STAMP).write_text(json.dumps({"key": key, "result": result,
                                                 "seconds": round(time.monotonic() - started, 1)}, indent=2))
        shutil.rmtree(out, ignore_errors=True)   # an incomplete one (no stamp): never used, replaced
        os.replace(partial, out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    logger.info("SFT warm start: built %s in %.0f s", out, time.monotonic() - started)
    return out


def _copy_pin(pin: Path, dest: Path, key: str) -> dict:
    """The pin's checkpoint files into ``dest`` with a build stamp of its own (the pin's record, not its stamp:
    the copy is what the verdict keys its kept score by, cua_rl.verdict.hash_weights); the pin's record."""
    dest.mkdir(parents=True)
    for f in pin.iterdir():
        if f.is_file() and f.name not in (STAMP, PINNED):
            shutil.copy2(f, dest / f.name)
    record = json.loads((pin / PINNED).read_text())
    (dest / STAMP).write_text(json.dumps({"key": key, "pinned": str(pin), "result": record.get("sft"),
                                          "seconds": record.get("build_seconds")}, indent=2))
    return record


def _run_showing_progress(cmd: list[str], log_file: Path, env: dict[str, str] | None) -> dict:
    """Run the SFT command; all output to ``log_file``, its progress lines to the console; its JSON result."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    result: dict = {}
    with open(log_file, "w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", env={**(env or os.environ), "PYTHONUNBUFFERED": "1"})
        progress = console()
        try:
            shown: dict[str, int] = {}
            for line in proc.stdout:
                log.write(line)
                m = PROGRESS.search(line) if " cua_rl.sft" in line else None
                if m and progress.tty:   # a bar per phase on a terminal
                    _advance(progress, m, line)
                # elsewhere a few lines per phase: the first, each quarter, the last
                elif m and shown.get(m.group(1)) != (quarter := 4 * int(m.group(2)) // max(1, int(m.group(3)))):
                    shown[m.group(1)] = quarter
                    print(f"[cua-rl] {line.split(' INFO ', 1)[-1].rstrip()}", flush=True)
                elif line.startswith('{"demonstrations"'):
                    result = json.loads(line)
            rc = proc.wait()
        except BaseException:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
        finally:
            progress.end()
    if rc != 0:
        raise SystemExit(f"SFT warm start failed (exit {rc}); see {log_file}")
    return result


PHASES = {"recorded": ("SFT demonstrations", "demos"), "SFT step": ("SFT steps", "steps")}
LOSS = re.compile(r"loss ([0-9.]+)")


def _advance(progress, m: re.Match, line: str) -> None:
    """The warm start's bar on a terminal: one per phase (demonstrations recorded, SFT steps), with the loss."""
    name, unit = PHASES[m.group(1)]
    done, total = int(m.group(2)), int(m.group(3))
    if progress.name != name:
        progress.phase(name, total, unit=unit)
    loss = LOSS.search(line)
    progress.advance(done, f"loss {loss.group(1)}" if loss else "")
