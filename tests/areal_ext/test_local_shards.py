"""The trainer worker reads the batch shards it holds from its own memory (cua_rl/areal_ext/local_shards.py).

AReaL's real shard storage (``areal.infra.rpc.rtensor``) holds the local shards; the fetch from another
process is a stand-in that records what it was asked for (the HTTP path itself is AReaL's, exercised by
every training run: tests/e2e/test_learning_gate.py).
"""

import uuid

import torch
from areal.infra.rpc import rtensor

from cua_rl.areal_ext.local_shards import local_first


def _remote(tensors):
    asked = []

    def fetch(self, shards):
        asked.append([s.shard_id for s in shards])
        return [tensors[s.shard_id] for s in shards]

    return fetch, asked


def test_local_shards_come_from_memory_as_copies_and_the_rest_in_one_remote_call_in_order():
    mine = {str(uuid.uuid4()): torch.arange(6.0) + k for k in range(2)}
    theirs = {str(uuid.uuid4()): torch.full((3,), -1.0 - k) for k in range(2)}
    for sid, t in mine.items():
        rtensor.store(sid, t)
    try:
        remote, asked = _remote(theirs)
        fetch = local_first(remote, rtensor.fetch)
        a, b = mine
        c, d = theirs
        order = [c, a, d, b]
        got = fetch(None, [rtensor.TensorShardInfo(sid, "10.0.0.9:1") for sid in order])
        assert asked == [[c, d]]                     # only the other process's shards went out, once
        for sid, tensor in zip(order, got, strict=True):
            assert torch.equal(tensor, {**mine, **theirs}[sid])
        got[1].add_(100)                              # the caller owns what it got, as over HTTP
        assert torch.equal(rtensor.fetch(a), torch.arange(6.0))

        asked.clear()
        assert [t.tolist() for t in fetch(None, [rtensor.TensorShardInfo(b, "")])] == [(torch.arange(6.0) + 1).tolist()]
        assert asked == []                            # all here: no remote call
        fetch(None, [rtensor.TensorShardInfo(d, "")])
        assert asked == [[d]]
    finally:
        for sid in mine:
            rtensor.remove(sid)
