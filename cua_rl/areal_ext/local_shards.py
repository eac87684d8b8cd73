"""Read the batch shards a trainer worker holds itself from its own memory, not over its own HTTP server.

Why: in AReaL's single-controller mode an engine call's result stays in the worker that made it (an
``RTensor`` shard in that process's storage) and the controller passes references to the next call. On
the actor that is every step's chain: ``compute_advantages`` returns the whole batch, images included, and
``ppo_update`` takes it back; AReaL fetches each shard over HTTP even when it lives in the same process
(its own docstring on ``rtensor.remove`` says so): the batch is serialized to base64 JSON, sent to itself,
parsed and decoded. For a vision-language batch the images dominate (a multi-turn row carries every
screenshot's ``pixel_values``, float32); a py-spy profile of the CPU recipe's actor had more samples there
than in the backward pass, and reading them from memory cut its ``train_step`` from 26.0 to 14.4 s
(bench/trainer_bench.py, docs/bench/trainer_bench.json).

``enable()`` wraps ``HttpRTensorBackend.fetch``: a shard whose id is in this process's storage is
returned as a copy of the stored tensor (the HTTP path also gives the caller a CPU tensor of its own);
every other shard goes the usual way, in one call, in the original order. Shard ids are random UUIDs, so
an id found in local storage is that shard. Process-wide and idempotent; ``cua_rl.areal_ext.worker``
calls it.
"""

from __future__ import annotations

_enabled = False


def local_first(remote_fetch, stored):
    """A ``fetch(self, shards)`` that takes each shard ``stored(shard_id)`` has (KeyError: not here) as a
    detached CPU copy, what the HTTP path returns, and asks ``remote_fetch`` for the rest in one call,
    keeping the shards' order."""

    def fetch(self, shards):
        found: dict[int, object] = {}
        for i, shard in enumerate(shards):
            try:
                found[i] = stored(shard.shard_id).detach().to("cpu", copy=True)
            except KeyError:   # stored by another process
                pass
        if not found:
            return remote_fetch(self, shards)
        rest = [shard for i, shard in enumerate(shards) if i not in found]
        fetched = iter(remote_fetch(self, rest) if rest else [])
        return [found[i] if i in found else next(fetched) for i in range(len(shards))]

    return fetch


def enable() -> None:
    """Patch AReaL's HTTP tensor backend in this process (see the module docstring)."""
    global _enabled
    if _enabled:
        return
    from areal.infra.rpc import rtensor

    rtensor.HttpRTensorBackend.fetch = local_first(rtensor.HttpRTensorBackend.fetch, rtensor.fetch)
    _enabled = True
