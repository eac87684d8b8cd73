"""LoRA on a vision-language actor: the one place AReaL 1.0.4's FSDP engine misses PEFT's wrapper.

Why: for Qwen-VL models the engine computes the 3-D (M-RoPE) position ids with
``self.model.model.compute_3d_position_ids(...)``. Without LoRA ``self.model`` is the
``...ForConditionalGeneration`` and ``.model`` its inner ``...Model``, which has that method; with
``actor.use_lora`` ``self.model`` is PEFT's ``PeftModel``, whose ``.model`` resolves to the
``...ForConditionalGeneration`` itself, which has not: every ``compute_logp`` failed with "object has no
attribute 'compute_3d_position_ids'" (found on the first LoRA run of the CPU stack). ``enable()`` gives the
outer classes a method that hands the call to their inner model, so both paths reach the same code. Only in a
run with LoRA on (``CUA_RL_LORA``, set by ``cua_rl/train.py``): other workers skip importing the model classes.
"""

from __future__ import annotations

import os

ENV = "CUA_RL_LORA"

CLASSES = ("Qwen3VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration", "Qwen2VLForConditionalGeneration")


def _delegate(self, *args, **kwargs):
    return self.model.compute_3d_position_ids(*args, **kwargs)


def enable(environ=os.environ) -> list[str]:
    """With ``CUA_RL_LORA=1``, add the delegating method where it is missing; the class names patched."""
    if environ.get(ENV) != "1":
        return []
    import transformers

    patched = []
    for name in CLASSES:
        cls = getattr(transformers, name, None)
        if cls is not None and not hasattr(cls, "compute_3d_position_ids"):
            cls.compute_3d_position_ids = _delegate
            patched.append(name)
    return patched
