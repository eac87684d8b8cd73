"""What this process's workflows did, counted for the launcher's summary: episodes evaluated, episodes lost
(by cause) and groups rejected, beside every policy endpoint's turn counts (recorded, verified, refused,
undelivered, ...), written as JSON under ``<logs>/policy_endpoint/`` (``cua_rl.run.summary`` adds them up).

Why process-wide: AReaL builds a new workflow object for every submitted task
(``RemoteInfEngine._resolve_workflow``), so each group has its own endpoint; counting per object reported 17
verified turns for a 20-step run. Kinds ("train", "eval") are kept apart.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import socket
from pathlib import Path

logger = logging.getLogger(__name__)

# The live counts of every policy endpoint built in this process, per kind; registered when it is built.
_ENDPOINT_TOTALS: collections.defaultdict[str, list[dict[str, int]]] = collections.defaultdict(list)
# Episodes of this process per kind: episodes_evaluated, episodes_lost (and episodes_lost_<cause>),
# groups_rejected.
_EPISODES: collections.defaultdict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)


def register_endpoint(kind: str, totals: dict[str, int]) -> None:
    """Count ``totals`` (an endpoint's live counts) in this process's ``kind`` from now on."""
    _ENDPOINT_TOTALS[kind].append(totals)


def count_group(kind: str, evaluated: int, lost_causes: list[str], rejected: bool) -> None:
    """One group's episodes: how many were evaluated, the cause of each one lost, whether it was rejected."""
    counts = _EPISODES[kind]
    counts["episodes_evaluated"] += evaluated
    counts["episodes_lost"] += len(lost_causes)
    for cause in lost_causes:
        counts[f"episodes_lost_{cause}"] += 1
    counts["groups_rejected"] += rejected


def totals(kind: str) -> dict[str, int]:
    """This process's episode counts and its endpoints' turn counts of ``kind``, summed."""
    out: dict[str, int] = dict(_EPISODES[kind])
    for counts in _ENDPOINT_TOTALS[kind]:
        for k, v in counts.items():
            out[k] = out.get(k, 0) + v
    return out


def read(logs: Path, kind: str | None = None) -> dict[str, int]:
    """The counts every process wrote under ``<logs>/policy_endpoint/`` (of ``kind``, or all), summed."""
    out: dict[str, int] = {}
    for f in sorted((Path(logs) / "policy_endpoint").glob(f"{kind or '*'}-*.json")):
        try:
            for k, v in json.loads(f.read_text()).items():
                out[k] = out.get(k, 0) + int(v)
        except (OSError, ValueError) as exc:
            logger.warning("unreadable endpoint counts %s: %s", f, exc)
    return out


def write(kind: str, stats_dir: str) -> None:
    """Replace this process's counts file of ``kind`` in ``stats_dir`` (atomically; nothing without a dir)."""
    if not stats_dir:
        return
    try:
        path = Path(stats_dir) / "policy_endpoint" / f"{kind}-{socket.gethostname()}-{os.getpid()}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(totals(kind)))
        os.replace(tmp, path)
    except OSError as exc:
        logger.warning("could not write the workflow's counts to %s: %s", stats_dir, exc)
