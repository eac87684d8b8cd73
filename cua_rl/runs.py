"""Where a run's files go and how runs are named: the one definition the launcher (which claims the
directories) and the workflow (which writes its counts there) share.

Each run gets its own trial directory by default (``run<YYYYmmdd_HHMMSS>``); an explicit name that already
trained here is refused unless ``existing_run=overwrite`` (deleted first) or ``existing_run=resume``
(``train.sh --resume``: continued, cua_rl/areal_ext/resume.py), so runs never share statistics, logs or checkpoints.
"""

from __future__ import annotations

import getpass
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger("cua_rl.runs")


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
    user said ``existing_run=overwrite``, or kept for ``existing_run=resume`` (which needs the run): runs
    never share statistics, logs or checkpoints unless one continues the other."""
    if existing_run == "resume":
        if not run_exists(paths):
            raise SystemExit(f"--resume: there is no run named {trial!r} ({paths.checkpoints})")
        return
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
