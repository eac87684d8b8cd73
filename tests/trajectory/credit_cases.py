"""The multi-turn credit tests' constructed episodes and groups, and each episode's pull as AReaL's actor computes
it (shared by test_multiturn_credit.py and test_mutations.py: test modules import no other test module)."""

from areal.trainer.ppo.actor import PPOActor
from areal.utils.data import concat_padded_tensors

from cua_rl.policy.records import Turn
from cua_rl.trajectory import EpisodeOutcome, group_batch

PROMPT, OUTPUT = 10, 40


def episode_of(turns: int, reward: float) -> EpisodeOutcome:
    turn = Turn(prompt_ids=[1] * PROMPT, output_ids=[2] * OUTPUT, output_logprobs=[-0.5] * OUTPUT,
                output_versions=[0] * OUTPUT)
    return EpisodeOutcome(turns=[turn] * turns, reward=reward)


GROUPS = [[episode_of(3, 1.0)] + [episode_of(20, 0.0)] * 3] + [[episode_of(20, 0.0)] * 4] * 3


def episode_pulls(actor_config, trajectory, **options) -> list[list[float]]:
    """Each episode's summed advantage over its trained tokens, as AReaL's actor computes it, per group; the rows
    built as ``trajectory`` (config.yaml's section: what a run trains on) builds them, but for ``options``."""
    batches = [group_batch(g, **{**trajectory.group_options(), **options}) for g in GROUPS]
    data = concat_padded_tensors(batches)
    out = PPOActor(actor_config, engine=None)._compute_advantages(data)
    per_row = (out["advantages"] * out["loss_mask"]).sum(-1).tolist()
    pulls, row = [], 0
    for group in GROUPS:
        pulls.append([])
        for episode in group:
            pulls[-1].append(sum(per_row[row:row + len(episode.turns)]))
            row += len(episode.turns)
    return pulls
