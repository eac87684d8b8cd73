"""What each trained step did, told once: one console line, one line of ``metrics.jsonl``, and ``trained/*`` in the
step's statistics.

Why from the trained batch: AReaL 1.0.4 exports its rollout statistics (``rollout/reward``...) when a step
commits, so they describe whichever episodes finished since the last commit, not the episodes the step trained:
with read-ahead (``max_head_offpolicyness``) a step could show 32 episodes, the next none ("no rollout
statistics this step"), and a step's reward belonged to another step. Here every training row carries its
episode's outcome (``cua_rl.runs.EPISODE_COLUMNS``, written by the workflow); the trainer's ``prepare_batch``
hands the batch it is about to train to ``StepProgress.trained``, and the commit of that step reports exactly
those episodes: their raw success and gym reward (before shaping and the GRPO normalisation), how many, in how
many groups and rows.

The line, printed by the trainer (so ``python -m cua_rl.train`` shows it too; the launcher's console passes it
and draws its progress bar from it, cua_rl/run/console.py)::

    [cua-rl] step 3/16: success 0.625, reward 0.656 (16 episodes, 4 groups, 58 rows); 24 s, elapsed 1m20s, ETA 5m12s

Numbering: console step N is AReaL's ``global_step`` N-1, which writes the checkpoint ``...globalstep{N-1}`` and
turns policy version N-1 into N (the Training Monitor's step rows are policy versions). ``metrics.jsonl`` (in
the run's log directory, tinker-cookbook's convention) holds ``step`` (N), ``global_step`` (N-1), ``policy_version``
(N), the ``trained/*`` values, the timings and every statistic AReaL committed for the step.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from pathlib import Path
from typing import Any

from cua_rl.runs import EPISODE_REWARD, EPISODE_SHARE, EPISODE_SUCCESS

logger = logging.getLogger("cua_rl.trainer.progress")

METRICS = "metrics.jsonl"
PREFIX = "trained/"


def _local(value):
    """A tensor of a trained batch: in single-controller mode an RTensor the rollout worker holds."""
    return value.to_local() if hasattr(value, "to_local") else value


def trained_outcome(batch: list[dict[str, Any]]) -> dict[str, float] | None:
    """The episodes a batch of trajectories (one per GRPO group) trains: ``episodes``, ``groups``, ``rows`` and,
    averaged over episodes, ``reward`` and ``success``. None when its rows carry no outcome (a workflow of
    another kind)."""
    episodes = reward = success = 0.0
    rows = 0
    for traj in batch:
        if not isinstance(traj, dict) or any(k not in traj for k in (EPISODE_REWARD, EPISODE_SUCCESS, EPISODE_SHARE)):
            return None
        share = _local(traj[EPISODE_SHARE]).reshape(-1).double()
        episodes += float(share.sum())
        reward += float((share * _local(traj[EPISODE_REWARD]).reshape(-1).double()).sum())
        success += float((share * _local(traj[EPISODE_SUCCESS]).reshape(-1).double()).sum())
        rows += int(share.numel())
    if not episodes:
        return None
    return {"episodes": round(episodes), "groups": len(batch), "rows": rows,
            "reward": reward / episodes, "success": success / episodes}


def clock(seconds: float) -> str:
    """``45s``, ``3m05s``, ``1h02m``."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def step_line(step: int, total: int | None, outcome: dict[str, float] | None, step_s: float, elapsed_s: float,
              eta_s: float | None) -> str:
    """The console's line for trained step ``step`` (1-based) of ``total``."""
    head = f"[cua-rl] step {step}" + (f"/{total}" if total else "")
    if outcome is None:
        what = "no episode outcome in the trained rows"
    else:
        what = (f"success {outcome['success']:.3f}, reward {outcome['reward']:.3f} ({_count(outcome['episodes'], 'episode')}, "
                f"{_count(outcome['groups'], 'group')}, {_count(outcome['rows'], 'row')})")
    timing = f"{clock(step_s)}, elapsed {clock(elapsed_s)}" + (f", ETA {clock(eta_s)}" if eta_s is not None else "")
    return f"{head}: {what}; {timing}"


# The step line read back (the console's progress bar, the benches' step times): one definition beside its writer.
STEP_LINE = re.compile(r"^\[cua-rl\] step (?P<step>\d+)(?:/(?P<total>\d+))?: (?:success (?P<success>[0-9.]+), reward "
                       r"(?P<reward>[0-9.-]+) \((?P<episodes>\d+) episodes?, (?P<groups>\d+) groups?, (?P<rows>\d+) "
                       r"rows?\)|no episode outcome in the trained rows); (?P<seconds>\w+), elapsed (?P<elapsed>\w+)")
_CLOCK = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def seconds_of(clock_text: str) -> float:
    """``clock``'s text back to seconds (``1m05s`` -> 65.0)."""
    m = _CLOCK.match(clock_text)
    if not m or not clock_text:
        raise ValueError(f"not a clock: {clock_text!r}")
    h, mnt, sec = (int(g or 0) for g in m.groups())
    return float(3600 * h + 60 * mnt + sec)


def read_step_line(line: str) -> dict[str, Any] | None:
    """A step line's values (``step``, ``total``, ``success``, ``reward``, ``episodes``, ``groups``, ``rows``,
    ``seconds``, ``elapsed``; None where the line has none), or None for any other line."""
    m = STEP_LINE.match(line.strip())
    if m is None:
        return None
    out: dict[str, Any] = {k: (None if v is None else float(v) if k in ("success", "reward") else int(v))
                           for k, v in m.groupdict().items() if k not in ("seconds", "elapsed")}
    out["seconds"], out["elapsed"] = seconds_of(m.group("seconds")), seconds_of(m.group("elapsed"))
    return out


class StepProgress:
    """The trainer's record of each step: ``start`` when training begins, ``trained(batch)`` from
    ``prepare_batch``, ``committed(global_step, stats)`` at AReaL's commit of the step."""

    def __init__(self, logs_dir: str | Path | None, total_steps: int | None = None) -> None:
        self.path = Path(logs_dir) / METRICS if logs_dir else None
        self.total = total_steps
        self.first_step: int | None = None
        self.started = self.last = time.monotonic()
        self.durations: list[float] = []
        self.pending: dict[str, float] | None = None

    def start(self, total_steps: int | None, start_global_step: int = 0) -> None:
        """Training begins at ``start_global_step`` (after a resume: the step after the recover point)."""
        self.total = total_steps
        self.first_step = start_global_step
        self.started = self.last = time.monotonic()

    def trained(self, batch: list[dict[str, Any]]) -> None:
        """The batch the coming step trains (read now: AReaL clears the batch's tensors before the commit)."""
        try:
            self.pending = trained_outcome(batch)
        except Exception as exc:  # noqa: BLE001  the report must never cost the step
            logger.warning("could not read the trained batch's episode outcomes: %s: %s", type(exc).__name__, exc)
            self.pending = None

    def stats(self) -> dict[str, float]:
        """``trained/*`` for the step's statistics (TensorBoard, W&B, the monitor's update record)."""
        if self.pending is None:
            return {}
        return {PREFIX + k: float(v) for k, v in self.pending.items()}

    def committed(self, global_step: int, stats: dict[str, Any]) -> str:
        """Step ``global_step + 1`` is committed with ``stats``: its metrics line appended, its console line
        returned."""
        now = time.monotonic()
        step_s, elapsed = now - self.last, now - self.started
        self.last = now
        self.durations.append(step_s)
        step = global_step + 1
        eta = None
        if self.total:
            # the first step of a run also waits for the first rollouts: the mean of the later ones predicts better
            recent = self.durations[1:] or self.durations
            eta = (self.total - step) * sum(recent) / len(recent)
        outcome, self.pending = self.pending, None
        self._append(step, global_step, outcome, stats, step_s, elapsed, eta)
        return step_line(step, self.total, outcome, step_s, elapsed, eta)

    def _append(self, step: int, global_step: int, outcome: dict[str, float] | None, stats: dict[str, Any],
                step_s: float, elapsed: float, eta: float | None) -> None:
        if self.path is None:
            return
        record: dict[str, Any] = {"step": step, "global_step": global_step, "policy_version": step,
                                  "time": round(time.time(), 3), "step_seconds": round(step_s, 3),
                                  "elapsed_seconds": round(elapsed, 3)}
        if eta is not None:
            record["eta_seconds"] = round(eta, 1)
        for key, value in stats.items():
            try:
                number = float(value)
            except (TypeError, ValueError):
                continue
            if math.isfinite(number):
                record[key] = number
        if outcome is not None:
            record.update({PREFIX + k: v for k, v in outcome.items()})
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")
        except OSError as exc:
            logger.warning("could not append the step's metrics to %s: %s", self.path, exc)


def read_metrics(logs_dir: str | Path) -> list[dict[str, Any]]:
    """The run's ``metrics.jsonl`` records, one per committed step (a torn last line is skipped)."""
    out = []
    try:
        lines = (Path(logs_dir) / METRICS).read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out
