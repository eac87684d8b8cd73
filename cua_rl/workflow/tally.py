"""The run's counts on disk: each rollout worker process writes its workflows' counts (episodes evaluated,
episodes lost by cause, groups rejected, and its policy endpoints' turn counts: recorded, verified, refused,
undelivered, ...; ``cua_rl.workflow.worker``) as JSON under ``<logs>/policy_endpoint/``, one file per kind,
host and process; the launcher's summary and the run's health checks add them up (``read``). Kinds ("train",
"eval") are kept apart.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path

from .worker import worker_state

logger = logging.getLogger(__name__)


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
        tmp.write_text(json.dumps(worker_state(kind).totals()))
        os.replace(tmp, path)
    except OSError as exc:
        logger.warning("could not write the workflow's counts to %s: %s", stats_dir, exc)
