"""Ports for AReaL's workers and servers drawn from the operating system's randomness, not from the run's seed.

Why: AReaL's ``areal.utils.network.find_free_ports`` picks its random ports with Python's global generator, which
AReaL seeds with the run's seed just before (the trainer at start-up, every RPC worker when it is configured).
Two runs with one seed started together on one machine (a sweep over learning rates, two lanes of our test
suite) therefore drew the same ports for their workers and their vLLM servers: each port was free when checked,
both runs bound it, one worker failed, and its scheduler's next request reached the other run's worker. Seen in
our suite: a learning-gate run stopped at start-up with "Engine 'rollout/0' already exists" (it had asked the
other run's rollout worker to create its engine). ``enable()`` gives that module a generator of its own seeded
by the operating system, in the process it is called in: the trainer (``cua_rl.trainer.Trainer``) and every
RPC or Ray worker (``cua_rl.areal_ext.worker``). Port draws then no longer consume the run's seeded global
stream (which AReaL's rollout worker also uses to order a step's trajectories); the ports themselves never
affected training.
"""

from __future__ import annotations

import random


def enable() -> None:
    """Idempotent; every caller of ``find_free_ports``, however it imported it, draws from the new generator."""
    from areal.utils import network

    if not isinstance(network.random, random.SystemRandom):
        network.random = random.SystemRandom()
