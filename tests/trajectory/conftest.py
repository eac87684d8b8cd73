"""Fixtures the trainer's credit tests share (test_multiturn_credit.py, test_mutations.py): config.yaml as a run
loads it, once per module, so a test builds its rows with the trajectory section a run ships with."""

import os

import pytest

from cua_rl.run.launch import load_config


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """config.yaml as a run loads it, once for the module."""
    os.environ.setdefault("CUA_RL_FILEROOT", str(tmp_path_factory.mktemp("fileroot")))
    return load_config("examples/cua_agent/config.yaml", [])


@pytest.fixture(scope="module")
def actor_config(shipped):
    """The shipped actor section: AReaL's ``PPOActorConfig`` a run's actor computes advantages with."""
    return shipped.actor
