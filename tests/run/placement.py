"""Where a run's roles land on the GPUs through AReaL's own ``LocalScheduler`` (shared by test_gpu_placement.py and
test_gpu_first_try.py: test modules import no other test module; the ``no_processes`` fixture is conftest.py's).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from areal.api.alloc_mode import ModelAllocation
from areal.api.cli_args import SchedulingSpec, SchedulingStrategy
from areal.api.scheduler_api import Job
from areal.infra.scheduler import local


def _jobs(config) -> dict[str, Job]:
    """The ``Job`` of each role, as AReaL's controllers build it."""
    jobs = {}
    for role, engine in (("actor", config.actor), ("critic", config.critic),
                         ("ref", config.ref if config.actor.kl_ctl > 0 else None)):
        if engine is not None:   # TrainController.initialize
            world = ModelAllocation.from_str(engine.backend, name=role).parallel.world_size
            jobs[role] = Job(role=role, replicas=world, tasks=list(engine.scheduling_spec),
                             scheduling_strategy=engine.scheduling_strategy)
    rollout = ModelAllocation.from_str(config.rollout.backend, name="rollout").parallel
    spec = SchedulingSpec(**asdict(config.rollout.scheduling_spec[0]))   # RolloutController.initialize
    if spec.gpu > 0:
        spec.gpu = rollout.tp_size * rollout.pp_size
    jobs["rollout"] = Job(role="rollout", replicas=rollout.dp_size, tasks=[spec] * rollout.dp_size,
                          scheduling_strategy=config.rollout.scheduling_strategy)
    eval_spec = SchedulingSpec(**{**asdict(spec), "gpu": 0})   # PPOTrainer._init_rollout(is_eval=True)
    jobs["eval-rollout"] = Job(role="eval-rollout", replicas=rollout.dp_size, tasks=[eval_spec] * rollout.dp_size,
                               scheduling_strategy=SchedulingStrategy(type="colocation", target="rollout"))
    return jobs


def creation_orders(config) -> list[list[str]]:
    """The orders a run creates its roles in. AReaL's ``PPOTrainer``: actor, critic, ref, then the rollout. Our
    ``Trainer`` (cua_rl/trainer/trainer.py) starts the rollout beside the actor when the rollout is not colocated
    with it (``_overlap_start``): the two allocate in either order (or interleaved, under one lock), then the
    critic and the ref."""
    jobs = _jobs(config)
    train = [r for r in ("critic", "ref") if r in jobs]
    areal = ["actor", *train, "rollout", "eval-rollout"]
    strategy = config.rollout.scheduling_strategy
    if strategy.type == "colocation" and strategy.target == "actor":
        return [areal]
    return [areal, ["actor", "rollout", *train, "eval-rollout"], ["rollout", "actor", *train, "eval-rollout"]]


def areal_placement(config, log_dir: Path, order: list[str]) -> dict[str, list[list[int]]]:
    """Each role's workers' GPUs, created in ``order`` with the jobs AReaL's controllers build."""
    scheduler = local.LocalScheduler(gpu_devices=list(range(config.cluster.n_gpus_per_node)), log_dir=str(log_dir))
    jobs = _jobs(config)
    for role in order:
        scheduler.create_workers(jobs[role])
    placed = {}
    for role in order:
        target = scheduler._colocated_roles.get(role)
        workers = scheduler._workers.get(role) or scheduler._workers[target]
        placed[role] = [w.gpu_devices for w in workers]
    return placed


def _colocation_root(config, role: str) -> str:
    """The role a role's GPUs belong to: itself, or (following colocations) the role it is colocated with."""
    engines = {"actor": config.actor, "ref": config.ref, "critic": config.critic, "rollout": config.rollout}
    seen = "rollout" if role == "eval-rollout" else role   # the eval rollout shares the rollout's servers
    while seen in engines and engines[seen] is not None and engines[seen].scheduling_strategy.type == "colocation":
        seen = engines[seen].scheduling_strategy.target
    return seen


def shared_without_colocation(config, placed) -> list[tuple[str, str, int]]:
    """(role, role, GPU) for each GPU two roles hold that are not colocated with one another."""
    owner: dict[int, tuple[str, str]] = {}
    clashes = []
    for role, gpus in placed.items():
        root = _colocation_root(config, role)
        for gpu in {g for worker in gpus for g in worker}:
            if gpu in owner and owner[gpu][1] != root:
                clashes.append((owner[gpu][0], role, gpu))
            owner.setdefault(gpu, (role, root))
    return clashes
