"""Frozen disk layers of forked VMs, and when each may be deleted.

A fork freezes the parent's overlay: the parent goes on writing to a new overlay over it, and every child gets an
overlay of its own over it (``VMDesktop.freeze``/``thaw``). The frozen overlay is linked (a hard link: the same
file) into the gym's ``vm-layers`` folder, so it outlives the parent's own folder, and every overlay made over it
names that link as its backing file. A layer is held by each machine whose overlay sits directly on it, by each
layer frozen on top of it, and by a fork while it is making children; when the last lets go the link is deleted
and the layer below is let go in turn. Below every layer is a template's overlay, which lives as long as the gym
folder (``backend.template_for``).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

_lock = threading.Lock()


@dataclass(eq=False)
class Layer:
    path: Path                  # the link in the gym's vm-layers folder
    below: "Layer | None"       # the layer this one's overlay was made over (None: a template's overlay)
    users: int = 0


def freeze(overlay: Path, link: Path, below: Layer | None) -> Layer:
    """Link ``overlay`` (a paused machine's, about to be frozen) at ``link`` as a new layer over ``below``. The new
    layer takes over the machine's hold on ``below``; it has no users yet (``hold``)."""
    os.link(overlay, link)
    return Layer(link, below)


def discard(layer: Layer) -> None:
    """Undo a ``freeze`` that was not used (the machine kept its overlay, and its hold on the layer below)."""
    layer.path.unlink(missing_ok=True)


def hold(layer: Layer | None, n: int = 1) -> Layer | None:
    if layer is not None:
        with _lock:
            layer.users += n
    return layer


def release(layer: Layer | None) -> None:
    """Let go of ``layer``: deleted once nothing holds it, and the layers below it let go in turn."""
    while layer is not None:
        with _lock:
            layer.users -= 1
            if layer.users > 0:
                return
        layer.path.unlink(missing_ok=True)
        layer = layer.below
