"""The launcher's placement tests' fixture: AReaL's scheduler with no process behind it (tests/run/placement.py
places roles through it)."""

import time

import pytest
from areal.api.scheduler_api import Worker
from areal.infra.scheduler import local


class _NeverRun:
    """Stands in for a worker process: alive, never started."""

    pid, returncode = 0, None

    def poll(self):
        return None


@pytest.fixture
def no_processes(monkeypatch):
    """AReaL's scheduler with the process layer stood in for: a spawned worker is never run, a forked one (a
    colocation with ``fork``) inherits its target's GPUs, as ``LocalScheduler._fork_single_worker`` does."""
    started: list[list[str]] = []
    monkeypatch.setattr(local, "run_with_streaming_logs", lambda cmd, *a, **kw: started.append(cmd) or _NeverRun())
    monkeypatch.setattr(local.time, "sleep", lambda s: None)   # the scheduler's wait for a worker to die at start

    async def fork(self, session, role, idx, target_wi, target_role, command=None):
        worker = Worker(id=f"{role}/{idx}", ip="127.0.0.1", worker_ports=["0"], engine_ports=[])
        return local.WorkerInfo(worker=worker, process=None, role=role, gpu_devices=target_wi.gpu_devices,
                                created_at=time.time(), log_file="", env_vars={})

    monkeypatch.setattr(local.LocalScheduler, "_fork_single_worker", fork)
    return started
