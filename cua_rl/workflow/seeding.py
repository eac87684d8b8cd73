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
held-out instance ``k * group_size + i``. The count restarts at every policy version, so each evaluation of a
run plays the same instances (its curve compares like with like), none of which a training group draws.

Which seeds a gym gets depends on what it declares it takes (``seed_bits``, a field of its task objects:
seeds in 0..2**seed_bits-1; docs/protocols.md 1.2). A gym that declares at least ``CURRICULUM_BITS`` (ours: 53)
plays ``cua_rl.local_gym.curriculum.heldout_seeds``, the one list every evaluation of our gyms reads
(``cua_rl.evaluate`` too; they start at 2**40), and trains on 31-bit hashes. Any other gym (one that declares
nothing is taken to take 31 bits: a signed 32-bit integer, numpy's ``RandomState``) gets seeds within what it
takes: training hashes below 2**(b-1), held-out seeds from 2**(b-1), with b its bits capped at 31; before, the
2**40 held-out seeds failed every evaluation on a 32-bit gym, and a gym that wraps seeds replayed training
instances as held out (issue 83 item 3). Several eval rows of one task dealt to different rollout workers would
each count from 0 and repeat instances: an eval set lists each task once.

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
    bits = seed_bits(data)
    if is_eval:
        return heldout(_nth_group(engine, task_id, groups_run) * group_size, group_size, bits)
    if isinstance(data.get(STREAM_KEY), int):
        return [instance_seed(base, "stream", task_id, 0, data[STREAM_KEY], bits)] * group_size
    version = _version(engine)
    return [instance_seed(base, "train", task_id, version, _nth_group(engine, task_id, groups_run),
                          bits)] * group_size


# A gym that declares no seed_bits is taken to take this many: any gym's integer type holds a 31-bit seed.
DEFAULT_BITS = 31
# Seed bits a gym must declare to play the curriculum's held-out seeds (held-out content starts at 2**41; the
# lists are far shorter than 2**41 seeds); our gyms declare 53 (cua_rl.local_gym.curriculum.SEED_BITS).
CURRICULUM_BITS = 42


def seed_bits(data: dict[str, Any]) -> int:
    """The seed bits the task row's gym declares (``seed_bits`` of its task object, docs/protocols.md 1.2), else
    ``DEFAULT_BITS``; a declaration that is no integer in 2..63 counts as none."""
    bits = data.get("seed_bits")
    if isinstance(bits, int) and not isinstance(bits, bool) and 2 <= bits <= 63:
        return bits
    return DEFAULT_BITS


def _split_bit(bits: int) -> int:
    """Training seeds lie below 2**split, held-out ones (of a gym that cannot take the curriculum's) from it."""
    return min(DEFAULT_BITS, bits - 1)


def heldout(offset: int, n: int, bits: int = CURRICULUM_BITS) -> list[int]:
    """``n`` held-out instance seeds from ``offset`` for a gym that takes ``bits``-bit seeds: the curriculum's
    one list where they fit (imported here, on the eval path only: it loads the embedded gym's package), else
    ``2**split + offset + i``, above every training seed of such a gym and below ``2**bits``."""
    if bits >= CURRICULUM_BITS:
        from cua_rl.local_gym.curriculum import heldout_seeds

        return heldout_seeds(n, offset)
    start = 2 ** _split_bit(bits)
    if start + offset + n > 2 ** bits:
        raise ValueError(f"{offset + n} held-out seeds do not fit a gym of {bits}-bit seeds")
    return [start + offset + i for i in range(n)]


def _version(engine: Any) -> int:
    return engine.get_version() if hasattr(engine, "get_version") else 0


def _nth_group(engine: Any, task_id: str, groups_run: collections.Counter[tuple[str, int]]) -> int:
    """How many groups of ``task_id`` this worker started before at the engine's policy version (counted)."""
    key = (task_id, _version(engine))
    nth = groups_run[key]
    groups_run[key] += 1
    return nth


def instance_seed(base: int, phase: str, task_id: str, version: int, nth: int, bits: int = CURRICULUM_BITS) -> int:
    """A reproducible seed for one group below ``2**split`` of a gym of ``bits``-bit seeds: 31 bits for a gym
    that takes the curriculum's held-out seeds (our gyms: the seeds they were calibrated with), 30 for one of 31
    bits, whose held-out seeds take the upper half."""
    digest = hashlib.sha256(f"{base}:{phase}:{task_id}:{version}:{nth}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & (2 ** _split_bit(bits) - 1)
