"""After each weight update, does each model server serve other weights than before? A fingerprint of what it
serves, compared across the update.

Why: AReaL labels every output with the version it believes the server serves. A server that acknowledged an
update and kept its old weights (a worker extension that ignores it, a load that failed without an error, an
adapter the engine does not apply) goes on sampling the old policy under the new label, and the trainer's
logprob gap shows it only once the two policies have drifted apart (0.055 after four steps in the CPU
recipe: docs/health.md). This asks each server directly: the prompt logprobs of a fixed canary of token ids
(``/v1/completions`` with ``prompt_logprobs``; vLLM computes those without its prefix cache, so no KV of the
old weights is reused), before training and after every update. A real optimizer step changes them; values
equal within ``UNCHANGED`` after an update whose step was real mean the server did not take the weights.
The check can miss (a GPU's batch-dependent bf16 arithmetic moves the values by itself, so an ignored update
may look changed). It also trips when an update is too small to survive the cast to the server's dtype: the
served policy then truly did not change (docs/health.md).

With LoRA the canary asks for the adapter of the version being served (``name-vN``, AReaL's name for it): the
base model, which an adapter's update leaves as it was, would always look unchanged. The trainer
(``cua_rl.trainer.trainer``) probes once before training and after the inference side resumes from each update (AReaL
pauses the engines for the update, the save and the statistics; a probe while paused would wait for the
resume). The verdict is the ``weights_unchanged`` health check.
"""

from __future__ import annotations

import logging
import math
from typing import Callable

import httpx

from cua_rl.http.retry import error_detail

logger = logging.getLogger(__name__)

CANARY = tuple(range(100, 133))     # 33 token ids, valid in any vocabulary we serve (the tiny model's: ~1k)
UNCHANGED = 1e-6                    # largest |difference| still read as the same weights (float32 reruns: 0)
# the smallest SGD step (learning rate x clipped gradient norm) that is probed: 100 times below the CPU recipes'
# typical step (0.05 x 0.2), far above one that rounding noise makes (2e-9 seen)
MIN_SGD_STEP = 1e-4
PROBE_TIMEOUT_S = 60.0


def fingerprint(addr: str, timeout_s: float = PROBE_TIMEOUT_S, model: str | None = None) -> tuple[float, ...] | None:
    """The canary's prompt logprobs served at ``host:port`` (``model``: a served adapter's name; None: the
    base model), or None when it did not answer usefully."""
    payload = {"prompt": list(CANARY), "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0, "logprobs": 0}
    if model:
        payload["model"] = model
    try:
        response = httpx.post(f"http://{addr}/v1/completions", json=payload, timeout=timeout_s)
        if response.status_code >= 400:
            raise ValueError(error_detail(response))
        positions = response.json()["choices"][0]["prompt_logprobs"]
        values = []
        for token, position in zip(CANARY[1:], positions[1:], strict=True):
            entry = position.get(str(token)) or position.get(token)
            values.append(float(entry["logprob"] if isinstance(entry, dict) else entry))
    except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as exc:
        logger.warning("weight probe: %s did not give the canary's prompt logprobs: %s: %s", addr,
                       type(exc).__name__, exc)
        return None
    return tuple(values) if all(math.isfinite(v) for v in values) else None


def adapter_probe(lora_name: str, version: Callable[[], int]) -> Callable[[str], tuple[float, ...] | None]:
    """``fingerprint`` of the LoRA adapter serving ``version()`` (AReaL's name for it: ``<lora_name>-v<N>``)."""
    from areal.api.io_struct import get_versioned_lora_name

    return lambda addr: fingerprint(addr, model=get_versioned_lora_name(lora_name, version()))


def real_update(stats: dict[str, float], optimizer: str = "adam", clip: float | None = None) -> bool:
    """Whether the step's optimizer step changed the weights enough for the canary to show it (AReaL's statistics
    of the actor's update).

    With SGD the step moves the weights by the learning rate times the gradient (its norm clipped at ``clip``,
    AReaL's ``gradient_clipping``), so a gradient of rounding noise moves them by nothing the canary can see: a
    policy that has become near-deterministic on its own samples gives such gradients (every chosen token's
    probability near 1; a shuffled-reward control's step 14 of 2026-11-29: grad norm 4.7e-8, a step of 2e-9,
    which stopped a healthy run as "weights unchanged"). Such a step is not probed (``MIN_SGD_STEP``). Adam's
    step is about the learning rate per weight whatever the gradient's size, so any gradient above 0 counts."""
    grad = stats.get("ppo_actor/update/grad_norm")
    lr = stats.get("ppo_actor/update/lr", 0.0)
    if not (stats.get("ppo_actor/update/update_successful", 0.0) > 0 and lr > 0
            and grad is not None and math.isfinite(grad) and grad > 0):
        return False
    if optimizer.lower() == "sgd":
        return lr * (min(grad, clip) if clip and clip > 0 else grad) >= MIN_SGD_STEP
    return True


class WeightProbe:
    """``baseline()`` before training; ``after_update(real)`` after each update: how many servers serve the same
    canary logprobs as before it (None when nothing could be compared)."""

    def __init__(self, addrs: Callable[[], list[str]], probe: Callable[[str], tuple | None] = fingerprint) -> None:
        self.addrs, self.probe = addrs, probe
        self._last: dict[str, tuple] = {}

    def baseline(self) -> None:
        for addr in self.addrs():
            if (fp := self.probe(addr)) is not None:
                self._last[addr] = fp

    def after_update(self, real: bool) -> tuple[int, int] | None:
        """(servers unchanged, servers compared) across this update, or None when none was compared."""
        unchanged = compared = 0
        for addr in self.addrs():
            fp, before = self.probe(addr), self._last.get(addr)
            if fp is None:
                continue
            self._last[addr] = fp
            if real and before is not None:
                compared += 1
                unchanged += max(abs(a - b) for a, b in zip(fp, before, strict=True)) <= UNCHANGED
        return (unchanged, compared) if compared else None
