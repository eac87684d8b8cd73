"""Where a run's files go, how runs are named, and the records the run's processes share on disk: the one
definition the launcher (which claims the directories and sums the counts), the trainer (its health checks
and resume read them) and the workflow (which writes them) share.

Each run gets its own trial directory by default (``run<YYYYmmdd_HHMMSS>``); an explicit name that already
trained here is refused unless ``existing_run=overwrite`` (deleted first) or ``existing_run=resume``
(``train.sh --resume``: continued, cua_rl/trainer/resume.py), so runs never share statistics, logs or checkpoints.

Shared records under the run's log directory:
- the counts (``read_counts``/``write_counts``): each rollout worker process writes its workflows' counts
  (episodes evaluated, episodes lost by cause, groups rejected, and its policy endpoints' turn counts:
  recorded, verified, refused, undelivered, ...; ``cua_rl.workflow.worker``) as JSON under
  ``<logs>/policy_endpoint/``, one file per kind, host and process; the launcher's summary and the run's
  health checks add them up. Kinds ("train", "eval") are kept apart; a lost episode is counted under its
  ``DropCause`` (``episodes_lost_<cause>``), defined here, where the writers and readers of the counts meet;
- the dropped stream items (``record_dropped``, read by ``read_dropped``): a training row the workflow returns
  nothing for, one line in ``<logs>/dropped_stream/``, which the trainer's loader counts as consumed
  (cua_rl/trainer/resume.py);
- ``STREAM_KEY``: the stream index the trainer's loader gives each task row, which the workflow copies into
  its rows;
- ``EPISODE_COLUMNS``: each training row's episode outcome (the gym's reward, success, and the row's share of
  its episode), which the workflow copies into its rows so the trainer reports what each step trained
  (cua_rl/trainer/progress.py): AReaL's own rollout statistics are exported when a step commits, not per
  trained batch, so they belong to whichever episodes finished before the commit.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import shutil
import socket
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from areal.api.cli_args import BaseExperimentConfig


logger = logging.getLogger("cua_rl.runs")

class DropCause(StrEnum):
    """Why an episode was dropped, not evaluated (``cua_rl.workflow.Dropped.cause``): the workflow counts each as
    ``episodes_lost_<cause>``, the launcher's summary and the run's health checks read them. A ``StrEnum``: the
    counts' keys and the monitor's words stay the values below.

    - ``gym``: the gym failed (create, a read or an action after retries, evaluate), or its host drained too often;
    - ``agent_service``: the agent service failed or could not be reached;
    - ``model_server``: the model server failed or was too slow for a turn;
    - ``policy_unreached``: the agent's model calls failed and not one of them reached the policy endpoint (the URL
      the agent was given does not route to it from the agent's host: policy.bind_host / advertised_host);
    - ``crash``: the episode raised (a bug of ours).

    Not a cause: a group whose gym host drained (cua_rl/workflow/placement.py) is played again elsewhere, its
    episodes counted as drained, never as lost."""

    GYM = "gym"
    AGENT_SERVICE = "agent_service"
    MODEL_SERVER = "model_server"
    POLICY_UNREACHED = "policy_unreached"
    CRASH = "crash"


STREAM_KEY = "cua_stream_index"   # in the task row the workflow gets, and as a [rows] tensor in its batch
DROPPED_DIR = "dropped_stream"     # under the run's log directory: one file of dropped indices per worker process
# [rows] float64 tensors in every batch the workflow returns: the row's episode's reward from the gym (before any
# shaping and the GRPO normalisation), 1.0 when the gym judged it a success, and 1 / the episode's rows (their
# sum over a batch counts its episodes; a weighted mean over rows is a mean over episodes)
EPISODE_REWARD, EPISODE_SUCCESS, EPISODE_SHARE = "cua_episode_reward", "cua_episode_success", "cua_episode_share"
EPISODE_COLUMNS = (EPISODE_REWARD, EPISODE_SUCCESS, EPISODE_SHARE)


@dataclass
class RunPaths:
    logs: Path
    checkpoints: Path
    tensorboard: Path

    @classmethod
    def of(cls, config: BaseExperimentConfig, trial: str | None = None) -> "RunPaths":
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


# ---- the records the run's processes share ------------------------------------------------------------------
HOST_KEY = "gym_host:"   # per gym host counts: gym_host:<url>:<name> (the workflow's; the summary's lines)


def host_key(url: str, name: str) -> str:
    """The count ``name`` of gym host ``url`` (episodes, drains, groups_drained, episodes_drained)."""
    return f"{HOST_KEY}{url}:{name}"


def host_counts(totals: dict[str, int]) -> dict[str, dict[str, int]]:
    """url -> {name: count} of the per-host counts in ``totals`` (``host_key``)."""
    out: dict[str, dict[str, int]] = {}
    for key, value in totals.items():
        if key.startswith(HOST_KEY):
            url, name = key[len(HOST_KEY):].rsplit(":", 1)
            out.setdefault(url, {})[name] = value
    return out


def read_counts(logs: Path, kind: str | None = None) -> dict[str, int]:
    """The counts every process wrote under ``<logs>/policy_endpoint/`` (of ``kind``, or all), summed."""
    out: dict[str, int] = {}
    for f in sorted((Path(logs) / "policy_endpoint").glob(f"{kind or '*'}-*.json")):
        try:
            for k, v in json.loads(f.read_text()).items():
                out[k] = out.get(k, 0) + int(v)
        except (OSError, ValueError) as exc:
            logger.warning("unreadable endpoint counts %s: %s", f, exc)
    return out


def write_counts(kind: str, stats_dir: str, totals: dict[str, int]) -> None:
    """Replace this process's counts file of ``kind`` in ``stats_dir`` with ``totals`` (atomically; nothing
    without a dir)."""
    if not stats_dir:
        return
    try:
        path = Path(stats_dir) / "policy_endpoint" / f"{kind}-{socket.gethostname()}-{os.getpid()}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(totals))
        os.replace(tmp, path)
    except OSError as exc:
        logger.warning("could not write the workflow's counts to %s: %s", stats_dir, exc)


def read_dropped(logs_dir: str | Path) -> set[int]:
    """Every stream item any process recorded with ``record_dropped`` under ``<logs>/dropped_stream/``."""
    out: set[int] = set()
    for path in sorted((Path(logs_dir) / DROPPED_DIR).glob("*.txt")):
        try:
            out.update(int(line) for line in path.read_text().split() if line.isdigit())
        except OSError as exc:
            logger.warning("could not read dropped stream items from %s: %s", path, exc)
    return out


def record_dropped(logs_dir: str | Path, index: int) -> None:
    """The workflow dropped stream item ``index`` (its group was rejected, trained no row or carried no
    signal): one line in this process's file
    under ``<logs>/dropped_stream/``, where the trainer's loader reads it (``ExactlyOnceLoader``)."""
    path = Path(logs_dir) / DROPPED_DIR / f"{socket.gethostname()}-{os.getpid()}.txt"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(f"{int(index)}\n")
    except OSError as exc:
        logger.warning("could not record dropped stream item %s in %s: %s", index, path, exc)
