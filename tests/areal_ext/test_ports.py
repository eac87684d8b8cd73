"""AReaL's port picks after the run's seed: two runs with one seed must not pick the same ports
(cua_rl/areal_ext/ports.py). Shown at the cause, in one process: AReaL's seeding as the trainer and each worker
do it, then its ``find_free_ports``, twice."""

import random

from areal.utils import network, seeding

from cua_rl.areal_ext import ports


def _picks_after_the_seed() -> tuple[list[int], float]:
    """Two ports picked right after AReaL seeds with seed 1, and the seeded stream's next draw after them."""
    seeding.set_random_seed(1, key="trainer0")
    picked = network.find_free_ports(2)
    return picked, random.random()


def test_two_runs_with_one_seed_pick_different_ports_and_keep_their_seeded_stream(monkeypatch):
    monkeypatch.setattr(network, "random", random)   # AReaL as it ships (another test may have enabled the fix)
    first, first_next = _picks_after_the_seed()
    second, second_next = _picks_after_the_seed()
    assert first == second, "AReaL as it ships picks the seed's ports: the defect this fix is for"

    ports.enable()
    ports.enable()   # idempotent
    assert isinstance(network.random, random.SystemRandom)
    first, first_next_fixed = _picks_after_the_seed()
    second, second_next_fixed = _picks_after_the_seed()
    assert first != second, (first, second)
    # the port draws no longer take numbers from the run's seeded stream (the rollout worker orders a step's
    # trajectories with it): after the seed, its next number is the seed's own, whatever the ports were
    seeding.set_random_seed(1, key="trainer0")
    assert first_next_fixed == second_next_fixed == random.random()
