"""Instance seeds: which instance of a task each GRPO group plays.

Every episode of a group creates its execution with the same ``options.seed``, so a gym that generates
instances (MiniWoB++, the curriculum families) gives the whole group one instance and GRPO compares like with
like; different groups get different seeds. Seeds are derived, never drawn: from the experiment ``seed``, the
task and the row's stream index (``cua_stream_index``: the position the trainer's loader gave it, unique
across the run and every rollout worker, and the same again on resume; AReaL deals rows to its workers
round-robin, so a count kept per process would give groups of one task on different workers the same
instance). Rows without one (a workflow driven outside the trainer) fall back to the rollout worker's count of
groups per task and policy version (``WorkerState.groups_run``). Eval groups: the task alone, so every evaluation sees the same
instances. A row's own integer ``seed`` wins. Gyms that ignore the seed are unaffected.
"""

from __future__ import annotations

import collections
import hashlib
from typing import Any

from cua_rl.runs import STREAM_KEY

def group_seed(base: int, engine: Any, data: dict[str, Any], *, is_eval: bool,
               groups_run: collections.Counter[tuple[str, int]]) -> int:
    """The one instance seed of the group for task row ``data`` (see the module docstring); ``groups_run``:
    the worker's training groups started per (task, policy version), for rows without a stream index."""
    if isinstance(data.get("seed"), int) and not isinstance(data.get("seed"), bool):
        return data["seed"]
    task_id = str(data["task_id"])
    if is_eval:
        return instance_seed(base, "eval", task_id, 0, 0)
    if isinstance(data.get(STREAM_KEY), int):
        return instance_seed(base, "stream", task_id, 0, data[STREAM_KEY])
    version = engine.get_version() if hasattr(engine, "get_version") else 0
    nth = groups_run[(task_id, version)]
    groups_run[(task_id, version)] += 1
    return instance_seed(base, "train", task_id, version, nth)


def instance_seed(base: int, phase: str, task_id: str, version: int, nth: int) -> int:
    """A reproducible 31-bit seed for one group (31 bits: safe for any gym's integer type)."""
    digest = hashlib.sha256(f"{base}:{phase}:{task_id}:{version}:{nth}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF
