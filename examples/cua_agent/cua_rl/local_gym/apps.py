"""The applications a task may open, and how each is started inside the sandbox.

Why a registry: task files name an app and its arguments; the command line, the X window class the gym
waits for, and the defaults that make screenshots stable (fonts, colours) live here, in one place.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass


@dataclass(frozen=True)
class AppKind:
    argv: tuple[str, ...]
    wm_class: str          # WM_CLASS class the window manager reports once the window is up


APPS: dict[str, AppKind] = {
    "mousepad": AppKind(("mousepad",), "Mousepad"),
    "xterm": AppKind(("xterm", "-fa", "DejaVu Sans Mono", "-fs", "13", "-bg", "white", "-fg", "black",
                      "-geometry", "100x30", "-title", "Terminal"), "XTerm"),
    "pcmanfm": AppKind(("pcmanfm",), "Pcmanfm"),
}


def app_command(name: str, args: list[str]) -> str:
    """Shell-quoted command line of one app (run in the background by the sandbox launcher)."""
    kind = APPS[name]
    return " ".join(shlex.quote(a) for a in (*kind.argv, *args))
