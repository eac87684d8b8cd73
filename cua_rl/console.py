"""What the launcher shows of the trainer's output: AReaL's per-step statistics table becomes one line.

Why: AReaL prints a table of about 100 statistics after every step, so a researcher watching a run scrolls
past pages of numbers to find whether reward moves. The launcher copies everything the trainer prints to
``train.log`` unchanged (and AReaL writes the same statistics to TensorBoard); on the console,
``TrainerConsole`` swaps each table for one progress line (step, reward, success, episodes, step time) and
passes every other line through. ``CUA_RL_CONSOLE=full`` turns the filter off.
"""

from __future__ import annotations

import re
import time

ANSI = re.compile(r"\x1b\[[0-9;]*m")
TABLE_START = ("│", "┌", "├", "└", "╭", "╰", "╒", "╞", "╘")   # box drawing: AReaL's tables only
STEP_DONE = re.compile(r"StatsLogger INFO: Epoch \d+/\d+ Step \d+/\d+ Train step (\d+)/\d+ done")
HIDDEN = re.compile(r"StatsLogger INFO:\s*(Stats \(\d+/\d+\):)?\s*$")


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


class TrainerConsole:
    """Feed it the trainer's output line by line; it returns the lines to print."""

    def __init__(self, total_steps: int | None = None, log_file: str = ""):
        self.total_steps = total_steps
        self.log_file = log_file
        self.step: int | None = None
        self.stats: dict[str, float] = {}
        self.last_step_at = time.monotonic()
        self.told_where = False

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
        return [*out, line]

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
        rows, turns = stats.get("ppo_actor/n_seqs"), stats.get("rollout/num_turns")
        if rows and turns:
            parts.append(f"~{rows / turns:.0f} episodes ({rows:.0f} rows)")
        train = sum(stats.get(k, 0.0) for k in ("timeperf/recompute_logp", "timeperf/train_step"))
        if train:
            parts.append(f"train {train:.1f} s")
        parts.append(f"step {wall_s:.0f} s")
        return parts[0] + ": " + ", ".join(parts[1:])
