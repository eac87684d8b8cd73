"""Progress on the launcher's console: a tqdm bar on a terminal, plain lines elsewhere.

Why: a run has phases of known length that take minutes on a CPU (the trainer's start-up milestones, the SFT
warm start's demonstrations and steps, the training steps). On a terminal each phase gets one bar with its
elapsed time and ETA, redrawn in place. Written to a file or a pipe (CI, ``nohup``, ``| tee``), a bar's
carriage returns would garble the log, so there the callers print their few plain lines instead, and this
module draws nothing (``Progress.tty`` says which).

One bar at a time. Lines printed while it shows (``write``) go above it; so do the launcher's own log lines
(its console handler is pointed through the bar while it shows), and a ticker thread keeps the bar's clock
running between updates.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import TextIO


class _AboveTheBar:
    """A log handler's stream, written above the bar while one shows."""

    def __init__(self, stream: TextIO, progress: "Progress") -> None:
        self.stream, self.progress = stream, progress

    def write(self, text: str) -> int:
        self.progress.write(text.rstrip("\n"), self.stream) if text.strip() else None
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


class Progress:
    """``phase(name, total)`` opens a bar (a terminal only), ``advance(done, note)`` moves it, ``end()`` closes
    it; ``write(line)`` prints a line (above the bar while one shows)."""

    TICK_S = 1.0

    def __init__(self, out: TextIO | None = None, tty: bool | None = None) -> None:
        self.out = out or sys.stdout
        self.tty = _isatty(self.out) if tty is None else tty
        self._bar = None
        self.name: str | None = None   # the phase whose bar shows
        self._lock = threading.RLock()
        self._ticker: threading.Thread | None = None
        self._stop = threading.Event()
        self._handlers: list[tuple[logging.StreamHandler, TextIO]] = []

    @property
    def showing(self) -> bool:
        return self._bar is not None

    # a phase counted in stages (the start-up's milestones): no rate, no bar, the stage's name
    STAGES = "{desc}: {n}/{total}{postfix} [{elapsed}]"   # tqdm's postfix comes with its ", "
    BAR = "{desc}: {percentage:3.0f}%|{bar}| {n}/{total} [{elapsed}<{remaining}{postfix}]"

    def phase(self, name: str, total: int | None, unit: str = "it", done: int = 0, stages: bool = False) -> None:
        """A bar for ``name`` (``total`` None: a counter without ETA; ``stages``: named stages, no rate or bar);
        nothing when not on a terminal."""
        if not self.tty:
            return
        from tqdm import tqdm

        with self._lock:
            self._close_bar()
            form = self.STAGES if stages else self.BAR if total else "{desc}: {n_fmt} {unit} [{elapsed}{postfix}]"
            self._bar = tqdm(total=total, initial=done, desc=name, unit=unit, file=self.out, leave=True,
                             dynamic_ncols=True, bar_format=form)
            self.name = name
            self._redirect_logging()
            if self._ticker is None:
                self._stop.clear()
                self._ticker = threading.Thread(target=self._tick, name="progress-tick", daemon=True)
                self._ticker.start()

    def advance(self, done: int, note: str = "", total: int | None = None) -> None:
        with self._lock:
            if self._bar is None:
                return
            if total is not None and total != self._bar.total:
                self._bar.total = total
            if note:
                self._bar.set_postfix_str(note, refresh=False)
            self._bar.update(done - self._bar.n)

    def write(self, line: str, stream: TextIO | None = None) -> None:
        """``line`` on its own line: above the bar while one shows."""
        stream = stream or self.out
        with self._lock:
            if self._bar is None:
                stream.write(line + "\n")
                stream.flush()
                return
            from tqdm import tqdm

            tqdm.write(line, file=stream)

    def end(self) -> None:
        """Close the bar (it stays on screen as the phase's last state)."""
        with self._lock:
            self._close_bar()
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(2 * self.TICK_S)
            self._ticker = None

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar, self.name = None, None
        for handler, stream in self._handlers:
            handler.setStream(stream)
        self._handlers = []

    def _redirect_logging(self) -> None:
        """The root's console handlers that write to a terminal: through the bar while it shows."""
        for handler in logging.getLogger().handlers:
            if type(handler) is logging.StreamHandler and _isatty(handler.stream):
                self._handlers.append((handler, handler.setStream(_AboveTheBar(handler.stream, self))))

    def _tick(self) -> None:
        while not self._stop.wait(self.TICK_S):
            with self._lock:
                if self._bar is not None:
                    self._bar.refresh()


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


_CONSOLE: Progress | None = None


def console() -> Progress:
    """The process's progress display on its standard output."""
    global _CONSOLE
    if _CONSOLE is None:
        _CONSOLE = Progress()
    return _CONSOLE
