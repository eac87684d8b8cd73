"""The applications a task may open, and how each is started inside the sandbox.

Why a registry: task files name an app and its arguments; the command line, the X window class the gym
waits for, and the defaults that make screenshots stable (fonts, colours) live here, in one place.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class AppKind:
    argv: tuple[str, ...]
    wm_class: str          # WM_CLASS class the window manager reports once the window is up
    files: tuple[tuple[str, str], ...] = ()   # (path relative to HOME, text) the app needs, e.g. its script


APPS: dict[str, AppKind] = {
    "mousepad": AppKind(("mousepad",), "Mousepad"),
    # No bell at all (a visual one of no duration): the X server refuses an untrusted client's Bell
    # (desktop.STILL_CARETS) and xterm exits on that refusal, so a printf '\a' would close the terminal.
    "xterm": AppKind(("xterm", "-fa", "DejaVu Sans Mono", "-fs", "13", "-bg", "white", "-fg", "black",
                      "-geometry", "100x30", "-title", "Terminal", "-vb", "-xrm", "XTerm*visualBellDelay: 0"),
                     "XTerm"),
    "pcmanfm": AppKind(("pcmanfm",), "Pcmanfm"),
    # The seeded curriculum's window (curriculum.py); apps start in HOME, so the script path is relative.
    "board": AppKind(("wish", ".board/board.tcl", "-name", "board"), "Board",
                     files=((".board/board.tcl", (Path(__file__).parent / "board.tcl").read_text()),)),
}


def app_command(name: str, args: list[str]) -> str:
    """Shell-quoted command line of one app (run in the background by the sandbox launcher)."""
    kind = APPS[name]
    return " ".join(shlex.quote(a) for a in (*kind.argv, *args))
