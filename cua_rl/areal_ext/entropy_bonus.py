"""An entropy term in the actor's loss (``entropy_bonus`` in the config), which AReaL 1.0.4 does not have.

Why: a policy that collapses onto one answer stops exploring, and GRPO then sees groups whose episodes all do
the same (the Windows example's run lost its entropy from 4.3 to 0.11 within 30 rollouts; its authors added an
entropy coefficient and a KL penalty). AReaL logs each token's entropy (``ppo_actor/update/entropy``) but does
not train on it. With a coefficient ``c`` > 0, each micro-batch's loss becomes

    loss - c * mean(entropy over its trained tokens)

so the gradient also raises the entropy of the distribution each trained token was sampled from. The term is
in every step's statistics as ``ppo_actor/update/entropy_bonus/avg`` (``c`` times the mean entropy over the
step's trained tokens, what was subtracted; AReaL's ``entropy/avg`` times ``c``). The KL penalty to a reference model is AReaL's own (``actor.kl_ctl`` with a ``ref`` model;
``CUAConfig`` gives the run one when ``kl_ctl`` > 0 and no ``ref`` is set: docs/policy-and-training.md).

How: AReaL's actor calls its module-level ``grpo_loss_fn`` for every micro-batch (``PPOActor._ppo_update``),
with the entropy as the engine computed it, still attached to the graph (AReaL detaches its own copy);
``enable()`` wraps that function in the training worker (cua_rl/areal_ext/worker.py), reading ``c`` from
``CUA_RL_ENTROPY_BONUS`` that ``cua_rl/train.py`` sets from the config before the workers start.
"""

from __future__ import annotations

import functools
import math
import os

ENV = "CUA_RL_ENTROPY_BONUS"


def coefficient(environ=os.environ) -> float:
    """The coefficient in ``environ`` (0 when unset); a bad value is an error naming the variable."""
    raw = environ.get(ENV, "")
    if not raw:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{ENV} must be a number >= 0, got {raw!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{ENV} must be a number >= 0, got {raw!r}")
    return value


def with_entropy_bonus(loss_fn, coef: float):
    """``loss_fn`` (AReaL's ``grpo_loss_fn`` signature: logprobs, entropy, input_data, ...) minus ``coef`` times
    the mean entropy over the micro-batch's trained tokens (``input_data["loss_mask"]``)."""
    from areal.utils import stats_tracker

    @functools.wraps(loss_fn)
    def loss_with_bonus(logprobs, entropy, input_data, *args, **kwargs):
        loss = loss_fn(logprobs, entropy, input_data, *args, **kwargs)
        if not entropy.requires_grad:
            raise RuntimeError("entropy_bonus: the engine's entropy carries no gradient here (AReaL's vocab-parallel "
                               "path detaches it); set entropy_bonus=0 or train without tensor parallelism")
        mask = input_data["loss_mask"].bool()
        mean = (entropy.float() * mask).sum() / mask.sum().clamp(min=1)
        # per token over the trained ones, as AReaL's own entropy statistic (its loss fn set that denominator)
        stats_tracker.stat(entropy_bonus=coef * entropy.detach().float(), denominator="n_valid_tokens")
        return loss - coef * mean

    return loss_with_bonus


def enable(environ=os.environ) -> bool:
    """Wrap AReaL's actor loss in this process when ``CUA_RL_ENTROPY_BONUS`` > 0; whether it did."""
    coef = coefficient(environ)
    if coef == 0:
        return False
    from areal.trainer.ppo import actor

    if not getattr(actor.grpo_loss_fn, "_cua_rl_entropy_bonus", False):
        actor.grpo_loss_fn = with_entropy_bonus(actor.grpo_loss_fn, coef)
        actor.grpo_loss_fn._cua_rl_entropy_bonus = True
    return True
