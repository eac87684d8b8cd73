"""Instance seeds: which instance of a task each episode plays.

Training: every episode of a group creates its execution with the same ``options.seed``, so a gym that
generates instances (MiniWoB++, the curriculum families) gives the whole group one instance and GRPO compares
like with like; different groups get different seeds. Seeds are derived, never drawn: from the experiment
``seed``, the task and the row's stream index (``cua_stream_index``: the position the trainer's loader gave it,
unique across the run and every rollout worker, and the same again on resume; AReaL deals rows to its workers
round-robin, so a count kept per process would give groups of one task on different workers the same
instance). Rows without one (a workflow driven outside the trainer) fall back to the rollout worker's count of
groups per task and policy version (``WorkerState.groups_run``).

Evaluation: an eval group is no GRPO group (nothing trains on it), it estimates success; so every episode of it
plays its own held-out instance: episode ``i`` of the ``k``-th eval group of a task at one policy version plays
held-out instance ``k * group_size + i`` of ``cua_rl.local_gym.curriculum.heldout_seeds``, the one list every
evaluation reads (``cua_rl.evaluate`` too). The count restarts at every policy version, so each evaluation of a
run plays the same instances (its curve compares like with like), none of which a training group draws (those
are 31-bit hashes; held-out seeds start at 2**40). Several eval rows of one task dealt to different rollout
workers would each count from 0 and repeat instances: an eval set lists each task once.

A row's own integer ``seed`` wins (every episode of the group plays it). Gyms that ignore the seed are
unaffected.
"""

from __future__ import annotations

import collections
import hashlib
from typing import Any

from cua_rl.runs import STREAM_KEY


def group_seeds(base: int, engine: Any, data: dict[str, Any], group_size: int, *, is_eval: bool,
                groups_run: collections.Counter[tuple[str, int]]) -> list[int]:
    """The instance seed of each of the ``group_size`` episodes of the group for task row ``data`` (the module
    docstring); ``groups_run``: the worker's groups started per (task, policy version) of this kind."""
    if isinstance(data.get("seed"), int) and not isinstance(data.get("seed"), bool):
        return [data["seed"]] * group_size
    task_id = str(data["task_id"])
    if is_eval:
        return heldout(_nth_group(engine, task_id, groups_run) * group_size, group_size)
    if isinstance(data.get(STREAM_KEY), int):
        return [instance_seed(base, "stream", task_id, 0, data[STREAM_KEY])] * group_size
    version = _version(engine)
    return [instance_seed(base, "train", task_id, version, _nth_group(engine, task_id, groups_run))] * group_size


def heldout(offset: int, n: int) -> list[int]:
    """``n`` held-out instance seeds from ``offset``: the curriculum's one list (imported here, on the eval
    path only: it loads the embedded gym's package)."""
    from cua_rl.local_gym.curriculum import heldout_seeds

    return heldout_seeds(n, offset)


def _version(engine: Any) -> int:
    return engine.get_version() if hasattr(engine, "get_version") else 0


def _nth_group(engine: Any, task_id: str, groups_run: collections.Counter[tuple[str, int]]) -> int:
    """How many groups of ``task_id`` this worker started before at the engine's policy version (counted)."""
    key = (task_id, _version(engine))
    nth = groups_run[key]
    groups_run[key] += 1
    return nth


def instance_seed(base: int, phase: str, task_id: str, version: int, nth: int) -> int:
    """A reproducible 31-bit seed for one group (31 bits: safe for any gym's integer type)."""
    digest = hashlib.sha256(f"{base}:{phase}:{task_id}:{version}:{nth}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF
