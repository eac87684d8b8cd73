"""What the launcher shows of the trainer's output: a short console a person can follow.

Why: the trainer's output mixes AReaL's table of about 100 statistics after every step, AReaL's and vLLM's
start-up chatter, and, copied in by AReaL's local scheduler, every line the rollout workers log: a 16-step run
printed 2,049 lines, 1,954 of them per-episode lines (execution created, evaluated, terminated). The launcher
copies all of it to ``train.log`` unchanged (and the rollout workers' lines are in ``rollout.log`` too); on the
console, ``TrainerConsole`` keeps:

- the trainer's own ``[cua-rl]`` lines: one per trained step (``[cua-rl] step N/T: success, reward, time,
  ETA``, printed by the trainer from the batch it trained: cua_rl/trainer/progress.py), the health checks'
  (a warning that trips again on a later step is said once; at the end, one line lists the steps it tripped
  again, each step's own line staying in ``train.log``);
- AReaL's start-up milestones, one line each with the seconds since the trainer started;
- the trainer's own logger (``cua-train``), and ``cua_rl`` log lines at WARNING and above (at INFO they are the
  workers' per-episode lines);
- every ERROR and CRITICAL line, whatever its format; a traceback as its last line (the exception) plus where
  the whole of it is (``train.log``).

AReaL's statistics table is dropped: every value of it is in the step's line of ``metrics.jsonl`` (and in
TensorBoard's event files). ``CUA_RL_CONSOLE=full`` turns the filter off.

On a terminal (``cua_rl.progress``) the start-up and the steps also get a progress bar with the elapsed time
and ETA; the step lines print above it. Elsewhere (a file, a pipe, CI) only the plain lines.
"""

from __future__ import annotations

import re
import time

from cua_rl.progress import Progress
from cua_rl.trainer.progress import read_step_line

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
SHOWN_LEVELS = ("WARNING", *LOUD)
# AReaL's start-up milestones, shown by a quiet console as one line each (start-up takes minutes on a CPU).
MILESTONES = (
    (re.compile(r"TrainController INFO: TrainController initialization complete"), "training engine ready"),
    (re.compile(r"vLLMEngine INFO: Launching vLLM server"), "vLLM starting"),
    (re.compile(r"Starting vLLM server on (\S+)"), "vLLM serving at {0}"),
    (re.compile(r"RolloutController INFO: All engines are initialized"), "inference engine ready; rollouts begin"),
)
# A Python traceback, as printed after "Traceback (most recent call last):": its frames are indented; chained
# ones are joined by these lines; the first other line is the exception.
TRACEBACK = "Traceback (most recent call last):"
CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
HEALTH_WARNING = re.compile(r"^\[cua-rl\] health step (\d+): (\S+) .*; warn\): ")


def worth_showing(plain: str) -> bool:
    """Whether a quiet console shows this line (ANSI codes removed): every ERROR, our lines worth a person's
    attention (``cua_rl`` at WARNING and above, the trainer's ``cua-train`` logger, ``[cua-rl]`` lines)."""
    m = PY_LINE.match(plain)
    if m:
        return m.group(1) in LOUD or (m.group(2).split(".")[0] == "cua_rl" and m.group(1) in SHOWN_LEVELS)
    m = AREAL_LINE.match(plain)
    if m:   # our trainer's own logger ("cua-train") writes in AReaL's format
        return m.group(2) in LOUD or m.group(1).startswith("cua")
    m = VLLM_LINE.match(plain)
    if m:
        return m.group(1) in LOUD
    return plain.startswith("[cua-rl]")


class TrainerConsole:
    """Feed it the trainer's output line by line; it returns the lines to print (and moves ``progress``'s bar
    on a terminal)."""

    def __init__(self, total_steps: int | None = None, log_file: str = "", quiet: bool = False,
                 progress: Progress | None = None):
        self.total_steps = total_steps
        self.quiet = quiet
        self.log_file = log_file
        self.progress = progress
        self.in_table = False
        self.started = time.monotonic()
        self.milestones_shown: set[str] = set()
        self.traceback: dict | None = None   # the traceback being read: whether hidden, its exception line
        self.hidden_log_line = False         # the last log line was one the console hides
        self.warned: dict[str, list[int]] = {}   # health warning -> the steps it tripped again (not shown)

    def feed(self, line: str) -> list[str]:
        plain = ANSI.sub("", line).rstrip("\r\n")
        out = self._traceback(plain) if self.quiet else []
        if out is None:   # the line belongs to a traceback
            return []
        stripped = plain.strip()
        if self.in_table and (stripped.startswith(TABLE_START) or HIDDEN.search(stripped)):
            return out
        self.in_table = bool(STEP_DONE.search(stripped))
        if self.in_table or HIDDEN.search(stripped):
            return out
        warning = HEALTH_WARNING.match(stripped)
        if warning and self.quiet:
            name = warning.group(2)
            if name in self.warned:   # said already: only its step is kept, for close()
                self.warned[name].append(int(warning.group(1)))
                return out
            self.warned[name] = []
        step = read_step_line(stripped) if stripped.startswith("[cua-rl] step ") else None
        if step:
            self._step(step)
        shown = not self.quiet or worth_showing(stripped)
        self.hidden_log_line = not shown and bool(PY_LINE.match(stripped) or AREAL_LINE.match(stripped)
                                                  or VLLM_LINE.match(stripped))
        if not shown:
            return [*out, *self._milestone(stripped)]
        return [*out, line]

    def close(self) -> list[str]:
        """Lines still owed at the end of the output (a traceback that ended it; the health warnings that
        tripped again)."""
        again = [f"[cua-rl] health: {name} tripped again at step{'s' if len(steps) > 1 else ''} "
                 f"{', '.join(map(str, steps))} (said once above; each step's line is in {self.log_file or 'train.log'})"
                 for name, steps in self.warned.items() if steps]
        return [*self._end_traceback(), *again]

    # ---- tracebacks: their last line, and where the rest is -----------------------------------------
    def _traceback(self, plain: str) -> list[str] | None:
        """None when ``plain`` is part of a traceback (kept back); else the lines owed before it (a finished
        traceback's summary)."""
        if plain.startswith(TRACEBACK):
            if self.traceback is None:   # the traceback of a log line the console hides stays hidden too
                self.traceback = {"hidden": self.hidden_log_line, "exception": None}
            self.traceback["exception"] = None   # a chained one: its own exception is the last word
            return None
        if self.traceback is None:
            return []
        inside = not plain.strip() or plain.startswith((" ", "\t"))
        if self.traceback["exception"] is None:
            if not inside:
                self.traceback["exception"] = plain.strip()
            return None
        if inside or plain.startswith(CHAINED):
            return None   # between chained tracebacks, or the exception's message going on
        return self._end_traceback()

    def _end_traceback(self) -> list[str]:
        tb, self.traceback = self.traceback, None
        if tb is None or tb["hidden"]:
            return []
        where = f" (the whole traceback: {self.log_file})" if self.log_file else ""
        return [f"[cua-rl] traceback: {tb['exception'] or 'cut off'}{where}"]

    # ---- progress ----------------------------------------------------------------------------------------
    def _milestone(self, plain: str) -> list[str]:
        for i, (pattern, text) in enumerate(MILESTONES):
            m = pattern.search(plain)
            if m and text not in self.milestones_shown:
                self.milestones_shown.add(text)
                shown = text.format(*m.groups())
                if self.progress is not None and self.progress.tty:
                    self._startup_bar(i + 1, shown)
                    return []
                return [f"[cua-rl] {shown} ({time.monotonic() - self.started:.0f} s)"]
        return []

    def _startup_bar(self, done: int, note: str) -> None:
        p = self.progress
        if done == 1 or not p.showing:
            p.phase("start-up", len(MILESTONES), unit="milestones", done=done - 1, stages=True)
        p.advance(done, note)
        if done == len(MILESTONES):   # the steps' bar from here: it shows the first step's time while it runs
            p.phase("steps", self.total_steps, unit="steps")

    def _step(self, line: dict) -> None:
        if self.progress is None or not self.progress.tty:
            return
        step, total = line["step"], line["total"] or self.total_steps
        if not self.progress.showing:
            self.progress.phase("steps", total, unit="steps", done=step - 1)
        self.progress.advance(step, "" if line["success"] is None else f"success {line['success']:.3f}", total=total)
