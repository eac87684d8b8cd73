"""The pinned SFT warm starts (cua_rl/recipes/pinned/warm-starts; scripts/pin_warm_starts.py) as the tests' runs
use them: ``train.sh`` trains from the pinned checkpoint itself. (A user's run of a pinned recipe copies the pin
when its sources match, cua_rl/sft/warm_start.py; the tests name it, so a stale pin still trains them.)

The learning gate's run also judges itself (cua_rl/verdict.py), and its verdict plays the warm start on the
held-out instances unless that score is kept under its key (``<CUA_RL_HOME>/heldout-scores/verdict-<key>.json``:
the warm start's files, the evaluation's code, the episode settings). A fresh machine, and every CI run after a
change to the evaluation's code, measured it again: about 4 minutes on 2 cores (docs/learning.md, "The run's verdict"). The pinned
warm start's score is pinned too (cua_rl/recipes/pinned/heldout-scores, ``scripts/pin_warm_starts.py --score``),
where the verdict also looks (``cua_rl.verdict.PINNED_SCORES``); a score whose key no longer matches is simply
not found and the run measures it, as before (``test_the_pinned_warm_starts_score_is_the_one_the_gates_run_keeps`` says
so at once, in the quick tier). Greedy held-out play is a function of the weights and the instance: the pinned
warm start scored the same on both machines it was measured on (an AMD EPYC in session 29's calibration and an
Intel Xeon in session 31: each regime's success and each slice's alike; docs/learning.md)."""

from pathlib import Path

from cua_rl.sft.warm_start import PINS as PINNED
from cua_rl.verdict import PINNED_SCORES  # noqa: F401 - the tests name both pinned folders from here

GATE_RECIPE = "multiturn"     # the learning gate's (tests/e2e/test_learning_gate.py)
GATE_EPISODES = 64            # the gate's held-out instances per gated regime, each played once greedily


def pinned(recipe: str) -> Path:
    """The pinned warm start of ``recipe`` ("multiturn" or "learn")."""
    path = PINNED / recipe
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no pinned warm start {path}: python scripts/pin_warm_starts.py {recipe}")
    return path


def trains_from_pinned(recipe: str) -> list[str]:
    """The ``train.sh`` overrides of a run that trains from the pinned warm start of ``recipe``."""
    return [f"actor.path={pinned(recipe)}", "sft.warm_start=false"]


def gate_verdict(instances: int = GATE_EPISODES, concurrency: int = 16):
    """The learning gate's verdict as its run computes it: (config, tasks, starting checkpoint) of the multi-turn
    recipe from the pinned warm start; ``instances`` per regime, ``concurrency`` episodes at once (the gate's
    EPISODES and the bench's default)."""
    from cua_rl.run.launch import RECIPES, load_config, verdict_tasks

    config = load_config(str(RECIPES / "config.multiturn.yaml"),
                         [*trains_from_pinned(GATE_RECIPE), f"verdict.instances={instances}",
                          f"verdict.concurrency={concurrency}"])
    tasks, why_not = verdict_tasks(config)
    assert not why_not, why_not
    return config, tasks, pinned(GATE_RECIPE)


def gate_score_file(instances: int = GATE_EPISODES, concurrency: int = 16) -> Path:
    """Where the learning gate's run keeps the pinned warm start's verdict score: the path ``cua_rl.verdict``
    computes for ``gate_verdict``."""
    from cua_rl import verdict

    return verdict.kept_score(*gate_verdict(instances, concurrency))

