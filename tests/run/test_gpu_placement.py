"""Where a run's engines land on the GPUs, through AReaL's own local scheduler (issue 59 item 4).

AReaL's ``LocalScheduler`` hands GPUs out round-robin in the order the trainer creates its roles (actor, critic,
ref, then rollout; ``PPOTrainer.__init__``), and never refuses: a role that finds every GPU taken wraps onto GPU
0 again. With ``actor.kl_ctl > 0`` on config.yaml (8 GPUs: vLLM d4 + FSDP d4), a reference model that copied the
actor's separate placement took GPUs 4-7, and vLLM's four servers wrapped onto the actor's GPUs 0-3, where their
0.85 memory share cannot be met.

Here each role's workers are created as AReaL's controllers create them (the ``Job`` of ``TrainController`` and
``RolloutController.initialize``, the eval rollout's colocation of ``PPOTrainer._init_rollout``) through the real
``LocalScheduler.create_workers`` on a node of ``cluster.n_gpus_per_node`` GPUs, in AReaL's order and in our
``Trainer``'s (which starts the rollout beside the actor, before the reference: a reference on GPUs of its own
then wraps onto the actor's and vLLM's). No process starts: the two
places that would start one are stood in for (a worker process that is never run, and a forked worker, which
inherits its target's GPUs as AReaL's does); the GPU allocation and the colocation rules are AReaL's code.
"""

from __future__ import annotations

import pytest

from cua_rl import deploy
from cua_rl.run.launch import RECIPES, load_config
from placement import areal_placement, creation_orders, shared_without_colocation

# A KL penalty as a run may set it: with token group weights (cua_rl.deploy.check_kl_weight refuses it with equal)
KL = ["actor.kl_ctl=0.05", "trajectory.group_weight=tokens"]


def test_right_data_4_with_a_kl_penalty_on_8_gpus_vllm_keeps_gpus_of_its_own(tmp_path, monkeypatch, no_processes):
    monkeypatch.setenv("CUA_RL_FILEROOT", str(tmp_path))
    config = load_config(str(RECIPES / "config.yaml"), KL)
    orders = creation_orders(config)
    assert len(orders) == 3   # AReaL's order and our Trainer's two (the rollout started beside the actor)
    for i, order in enumerate(orders):
        placed = areal_placement(config, tmp_path / f"logs{i}", order)
        assert shared_without_colocation(config, placed) == [], f"AReaL's placement, order {order}: {placed}"
        training = {g for role in ("actor", "ref") for worker in placed[role] for g in worker}
        serving = {g for worker in placed["rollout"] for g in worker}
        assert len(training) == len(serving) == 4 and not training & serving, (order, placed)
        assert placed["ref"] == placed["actor"], "the reference is not on the actor's GPUs"
    assert len(no_processes) == 3 * 8, "one (never run) process per actor and vLLM worker, none for the reference"


def test_right_data_4_the_one_gpu_recipe_colocates_in_an_order_areal_can_create(tmp_path, monkeypatch, no_processes):
    """config.1gpu.yaml, with and without the KL penalty: every role on GPU 0, each by a colocation AReaL can make
    (its target created before it), none by wrapping round."""
    monkeypatch.setenv("CUA_RL_FILEROOT", str(tmp_path))
    for i, overrides in enumerate(([], KL)):
        config = load_config(str(RECIPES / "config.1gpu.yaml"), overrides)
        for j, order in enumerate(creation_orders(config)):   # colocated: our Trainer keeps AReaL's order
            placed = areal_placement(config, tmp_path / f"logs{i}-{j}", order)
            assert shared_without_colocation(config, placed) == [], placed
            assert {g for gpus in placed.values() for worker in gpus for g in worker} == {0}, placed


def test_right_data_4_the_estimate_counts_the_reference(tmp_path, monkeypatch):
    """The dry run's memory figure for the actor's GPUs includes the reference model when the KL penalty is on
    (Qwen3-VL-2B's shape, entered by hand: the Hub is unreachable here)."""
    from cua_rl.run import estimate

    shape = estimate.Shape(params=2_127_532_032, hidden=2048, layers=28, intermediate=6144, vocab=151_936,
                           heads=16, screenshot=1000)
    monkeypatch.setenv("CUA_RL_FILEROOT", str(tmp_path))
    monkeypatch.setattr(estimate, "shape_of", lambda *a, **kw: shape)
    monkeypatch.setattr(estimate, "_gpu_memory", lambda: (80.0, "an 80 GiB GPU assumed"))
    figure = lambda lines: float(lines[0].split(": peak ")[1].split(" GiB")[0])   # noqa: E731
    for recipe in ("config.yaml", "config.1gpu.yaml"):
        plain = estimate.of_config(load_config(str(RECIPES / recipe), []))
        with_ref = estimate.of_config(load_config(str(RECIPES / recipe), KL))
        assert "reference" not in plain[0] and "reference" in with_ref[0], with_ref[0]
        # the reference's weights alone, bf16 and sharded like the actor's, are at least 0.2 GiB per GPU here
        assert figure(with_ref) >= figure(plain) + 0.2, (recipe, plain[0], with_ref[0])



def test_a_layout_areal_would_wrap_or_cannot_create_is_refused_and_a_reference_of_its_own_is_kept(
        tmp_path, monkeypatch, no_processes):
    """What the scheduler would do silently (wrap round onto taken GPUs) or only at start (a colocation with a
    role not created yet) is refused when the config loads, naming why; a reference given GPUs of its own keeps
    them where the node has enough, and vLLM still gets GPUs nobody else holds."""
    from areal.api.cli_args import SchedulingStrategy

    from cua_rl.run.launch import ConfigError

    monkeypatch.setenv("CUA_RL_FILEROOT", str(tmp_path))
    with pytest.raises(ConfigError, match="which AReaL does not create before it"):
        load_config(str(RECIPES / "config.1gpu.yaml"), ["rollout.scheduling_strategy.type=separation",
                                                        "+actor.scheduling_strategy.type=colocation",
                                                        "+actor.scheduling_strategy.target=rollout"])
    config = load_config(str(RECIPES / "config.yaml"), KL)
    config.ref.scheduling_strategy = SchedulingStrategy(type="separation")
    with pytest.raises(ValueError, match="need 12 GPUs and the node has 8"):
        deploy.check_placement(config)
    config.cluster.n_gpus_per_node = 12
    deploy.check_placement(config)
    for i, order in enumerate(creation_orders(config)):
        placed = areal_placement(config, tmp_path / f"logs{i}", order)
        assert shared_without_colocation(config, placed) == [], (order, placed)
        assert len({g for worker in placed["ref"] for g in worker}) == 4, (order, placed)
