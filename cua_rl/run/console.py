"""What the launcher shows of the trainer's output: AReaL's per-step statistics table becomes one line.

Why: AReaL prints a table of about 100 statistics after every step, so a researcher watching a run scrolls
past pages of numbers to find whether reward moves. The launcher copies everything the trainer prints to
``train.log`` unchanged (and AReaL writes the same statistics to TensorBoard); on the console,
``TrainerConsole`` swaps each table for one progress line (step, reward, success, episodes, step time).

Quiet (the launcher's default) also keeps back what only matters when digging: AReaL's and vLLM's INFO and
WARNING lines (start-up, memory, placement, CPU-backend advice), library output without a log level (progress
bars, Python warnings, the rollout workers' retry notes). It shows the progress lines, our own ``cua_rl``
log lines and every ERROR. Nothing is lost: all of it is in ``train.log``, and when the trainer fails the
launcher prints that file's last lines. ``CUA_RL_CONSOLE=full`` turns the filter off.
"""

from __future__ import annotations

import re
import time

ANSI = re.compile(r"\x1b\[[0-9;]*m")
TABLE_START = ("│", "┌", "├", "└", "╭", "╰", "╒", "╞", "╘")   # box drawing: AReaL's tables only
STEP_DONE = re.compile(r"StatsLogger INFO: Epoch \d+/\d+ Step \d+/\d+ Train step (\d+)/\d+ done")
HIDDEN = re.compile(r"StatsLogger INFO:\s*(Stats \(\d+/\d+\):)?\s*$")
# The level of a log line in the three formats the trainer's output mixes: ours and Python's default
# ("2026-01-01 10:00:00,123 INFO name: ..."), AReaL's ("(AReaL) 20260101-10:00:00.123 Name INFO: ..."),
# vLLM's ("(EngineCore pid=1) WARNING 01-01 10:00:00 [file.py:1] ...").
PY_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[,.]\d+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) ([\w.]+):")
AREAL_LINE = re.compile(r"^\(AReaL\) \S+ (.*?) (DEBUG|INFO|WARNING|ERROR|CRITICAL):")
VLLM_LINE = re.compile(r"^\((?:APIServer|EngineCore|Worker)[^)]*\) (DEBUG|INFO|WARNING|ERROR|CRITICAL)\b")
LOUD = ("ERROR", "CRITICAL")
# AReaL's start-up milestones, shown by a quiet console as one line each (start-up takes minutes on a CPU).
MILESTONES = (
    (re.compile(r"TrainController INFO: TrainController initialization complete"), "training engine ready"),
    (re.compile(r"vLLMEngine INFO: Launching vLLM server"), "vLLM starting"),
    (re.compile(r"Starting vLLM server on (\S+)"), "vLLM serving at {0}"),
    (re.compile(r"RolloutController INFO: All engines are initialized"), "inference engine ready; rollouts begin"),
)


def worth_showing(plain: str) -> bool:
    """Whether a quiet console shows this line (ANSI codes removed): every ERROR, our own log lines."""
    m = PY_LINE.match(plain)
    if m:
        return m.group(1) in LOUD or m.group(2).split(".")[0] == "cua_rl"
    m = AREAL_LINE.match(plain)
    if m:   # our trainer's own logger ("cua-train") writes in AReaL's format
        return m.group(2) in LOUD or m.group(1).startswith("cua")
    m = VLLM_LINE.match(plain)
    if m:
        return m.group(1) in LOUD
    return plain.startswith("[cua-rl]")


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


class TrainerConsole:
    """Feed it the trainer's output line by line; it returns the lines to print."""

    def __init__(self, total_steps: int | None = None, log_file: str = "", quiet: bool = False):
        self.total_steps = total_steps
        self.quiet = quiet
        self.log_file = log_file
        self.step: int | None = None
        self.stats: dict[str, float] = {}
        self.started = self.last_step_at = time.monotonic()
        self.told_where = False
        self.milestones_shown: set[str] = set()

    def feed(self, line: str) -> list[str]:
        plain = ANSI.sub("", line).strip()
        if plain.startswith(TABLE_START) and self.step is not None:
            self._collect(plain)
            return []
        out = self._flush()
        m = STEP_DONE.search(plain)
        if m:
            self.step = int(m.group(1))
            return out
        if HIDDEN.search(plain):
            return out
        if self.quiet and not worth_showing(plain):
            return [*out, *self._milestone(plain)]
        return [*out, line]

    def _milestone(self, plain: str) -> list[str]:
        for pattern, text in MILESTONES:
            m = pattern.search(plain)
            if m and text not in self.milestones_shown:
                self.milestones_shown.add(text)
                return [f"[cua-rl] {text.format(*m.groups())} ({time.monotonic() - self.started:.0f} s)"]
        return []

    def close(self) -> list[str]:
        """Lines still owed at the end of the output (a table the trainer printed last)."""
        return self._flush()

    def _collect(self, row: str) -> None:
        cells = [c.strip() for c in row.strip("│").split("│")]
        for key, value in zip(cells[0::2], cells[1::2]):
            number = _number(value)
            if key and number is not None:
                self.stats[key] = number

    def _flush(self) -> list[str]:
        if self.step is None or not self.stats:
            return []
        now = time.monotonic()
        line = self.progress_line(self.step, self.total_steps, self.stats, now - self.last_step_at)
        self.last_step_at, self.step, self.stats = now, None, {}
        out = [line]
        if not self.told_where:
            self.told_where = True
            where = f"{self.log_file} and " if self.log_file else ""
            out.append(f"[cua-rl] (AReaL's full statistics of every step: {where}TensorBoard)")
        return out

    @staticmethod
    def progress_line(step: int, total: int | None, stats: dict[str, float], wall_s: float) -> str:
        parts = [f"[cua-rl] step {step}" + (f"/{total}" if total else "")]
        for key, label in (("rollout/reward", "reward"), ("rollout/task_success", "success")):
            if key in stats:
                parts.append(f"{label} {stats[key]:.3f}")
        # one row per turn, or per episode (trajectory.export_style: concat): the workflow records which
        rows = stats.get("ppo_actor/n_seqs")
        per_episode = stats.get("rollout/rows_per_episode") or stats.get("rollout/num_turns")
        if rows and per_episode:
            parts.append(f"~{rows / per_episode:.0f} episodes ({rows:.0f} rows)")
        if "rollout/reward" not in stats:   # AReaL exported no rollout statistics with this step
            parts.append("no rollout statistics this step")
        train = sum(stats.get(k, 0.0) for k in ("timeperf/recompute_logp", "timeperf/train_step"))
        if train:
            parts.append(f"train {train:.1f} s")
        parts.append(f"step {wall_s:.0f} s")
        return parts[0] + ": " + ", ".join(parts[1:])
