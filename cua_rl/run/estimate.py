"""Memory and length estimate of a run, printed by ``train.sh --dry-run``: will it fit the GPU before it starts?

Why: a run that does not fit finds out minutes in (the model loaded, vLLM started), with an out-of-memory
trace. This is arithmetic over the model's config and the run's config, **an estimate, not a measurement**:
the parameter count is exact (the model is built on PyTorch's meta device, no weights), the rest follows how
AReaL's FSDP engine stores a model (parameters, gradients and AdamW's two states in
``actor.optimizer_dtype``, fp32 by default, plus one copy in ``actor.dtype`` for the forward and backward) and
how a gradient-checkpointed decoder keeps activations (each layer's input, one layer recomputed at a time
with its gradients, the logits of one micro-batch; on the CPU also the attention's score matrices, which a
GPU's flash kernel never stores). ``bench/memory_estimate_bench.py`` compares it with measured peaks on the CPU
at three scaled sizes. The CUDA allocator, NCCL buffers and fragmentation add to it on a GPU.

Length: the longest training row is ``gconfig.max_tokens`` (the policy endpoint refuses longer prompts); a
screenshot costs a number of tokens set by the model's patch size, merge size and its processor's pixel
limits and the policy endpoint's (``policy.max_pixels``), computed here for a 1280x800 screen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cua_rl.config import CUAConfig


GIB = 2**30
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
SCREEN = (1280, 800)


@dataclass(frozen=True)
class Shape:
    """What the estimate needs of a model (from its Hugging Face config)."""

    params: int                 # all parameters, vision tower included
    hidden: int
    layers: int
    intermediate: int
    vocab: int
    heads: int
    patch: int = 16
    merge: int = 2
    screenshot: int | None = None   # a 1280x800 screenshot's tokens by the model's processor, when known

    def tokens_per_screenshot(self) -> int:
        """Tokens of one 1280x800 screenshot: the processor's count, else its sides rounded down to
        patch x merge (no pixel limit)."""
        if self.screenshot:
            return self.screenshot
        factor = self.patch * self.merge
        return (SCREEN[0] // factor) * (SCREEN[1] // factor)


@dataclass(frozen=True)
class Estimate:
    """Bytes per GPU of the training side and the inference side, and the row length. ``reference_weights``: the
    KL penalty's reference model on the actor's GPUs, what stays resident (its stored weights and any cast copy;
    0 without a reference there); ``reference_forward``: one micro-batch's forward of it, which runs while the
    actor's own activations are freed (AReaL computes the reference's logprobs before the update)."""

    weights: int
    grads: int
    optimizer: int
    compute_copy: int
    activations: int
    vllm: int
    colocated: bool
    row_tokens: int
    screenshot_tokens: int
    reference_weights: int = 0
    reference_forward: int = 0

    @property
    def actor(self) -> int:
        return self.weights + self.grads + self.optimizer + self.compute_copy + self.activations

    @property
    def reference(self) -> int:
        return self.reference_weights + self.reference_forward

    @property
    def training(self) -> int:
        """The actor's GPUs while training: the actor and, with a KL penalty, the reference beside it (its forward
        in the room of the actor's activations, which are not alive then)."""
        return self.actor + self.reference_weights + max(0, self.reference_forward - self.activations)

    @property
    def peak(self) -> int:
        """Colocated: AReaL offloads the actor while vLLM works and vLLM while the actor trains, so the larger of
        the two sides (the reference's weights stay on the GPU on both); else the actor's GPUs (vLLM has its
        own)."""
        return max(self.training, self.vllm + self.reference_weights) if self.colocated else self.training

    def lines(self, gpu_gib: float | None, gpu_source: str = "") -> list[str]:
        g = lambda n: f"{n / GIB:.1f}"   # noqa: E731
        actor = (f"actor {g(self.actor)} GiB = weights {g(self.weights)} + gradients {g(self.grads)} + AdamW "
                 f"{g(self.optimizer)} + compute copy {g(self.compute_copy)} + activations {g(self.activations)} "
                 f"(one micro-batch)")
        if self.reference:
            actor += (f"; reference model (KL penalty) beside it: weights {g(self.reference_weights)} GiB resident, "
                      f"forward {g(self.reference_forward)} GiB while the actor's activations are freed")
        if gpu_gib is None:
            memory = f"memory (estimated; the CPU stack, in host memory): {actor}"
        else:
            side = (f"colocated with vLLM on one GPU, each offloaded while the other works: peak {g(self.peak)} "
                    f"GiB ({g(self.training + self.vllm)} if both were resident)" if self.colocated
                    else f"vLLM on GPUs of its own: peak {g(self.peak)} GiB")
            verdict = "fits" if self.peak <= gpu_gib * GIB else "DOES NOT FIT"
            memory = (f"memory (estimated per GPU, not measured on one): {actor}; vLLM {g(self.vllm)} GiB; {side}, "
                      f"{verdict} in {gpu_gib:.0f} GiB ({gpu_source})")
        return [memory,
                f"length: rows up to {self.row_tokens} tokens (gconfig.max_tokens); a 1280x800 screenshot is "
                f"{self.screenshot_tokens} tokens, so at most {self.row_tokens // max(self.screenshot_tokens, 1)} "
                f"screenshots per row"]


def shape_of(model_path: str, min_pixels: int | None = None, max_pixels: int | None = None) -> Shape:
    """The model's shape from its config (a local directory, or a Hub id the machine can read); the
    screenshot's tokens within the policy endpoint's pixel bounds."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    text = getattr(config, "text_config", config)
    vision = getattr(config, "vision_config", None)
    return Shape(params=params, hidden=text.hidden_size, layers=text.num_hidden_layers,
                 intermediate=text.intermediate_size, vocab=text.vocab_size, heads=text.num_attention_heads,
                 patch=getattr(vision, "patch_size", 16), merge=getattr(vision, "spatial_merge_size", 2),
                 screenshot=_screenshot_tokens(model_path, getattr(vision, "spatial_merge_size", 2), min_pixels,
                                               max_pixels))


def _screenshot_tokens(model_path: str, merge: int, min_pixels: int | None, max_pixels: int | None) -> int | None:
    """Tokens of a 1280x800 screenshot as the policy endpoint prepares it (resized at most once onto the model's
    processor grid within ``policy.min_pixels``/``max_pixels`` and the processor's own bounds, then the image
    processor); None when the processor cannot load."""
    try:
        from types import SimpleNamespace

        from PIL import Image
        from transformers import AutoImageProcessor

        from cua_rl.policy.images import DecodedImage
        from cua_rl.policy.prompt import fit_for

        processor = AutoImageProcessor.from_pretrained(model_path)
        fitted = fit_for(SimpleNamespace(image_processor=processor), DecodedImage("", Image.new("RGB", SCREEN),
                                                                                   "estimate"), min_pixels, max_pixels)
        grid = processor(images=[fitted.image], return_tensors="pt")["image_grid_thw"][0]
        return int(grid.prod()) // (merge * merge)
    except Exception:   # noqa: BLE001 - an estimate: fall back to the patch arithmetic
        return None


def estimate(shape: Shape, *, dtype: str, optimizer_dtype: str, tokens_per_mb: int, row_tokens: int,
             dp: int = 1, gpu_memory_utilization: float = 0.0, gpu_gib: float = 0.0,
             colocated: bool = False, adam: bool = True, dense_attention: bool = False,
             reference_dtype: str | None = None) -> Estimate:
    """See the module docstring. ``dp``: the actor's data-parallel size (FSDP shards the stored state);
    ``dense_attention``: attention materialises its score matrices (sdpa's math kernel: the CPU), not a
    flash or memory-efficient kernel (a GPU); ``reference_dtype``: the storage dtype of a KL reference model on
    the actor's GPUs, sharded like the actor (None: no reference there)."""
    store, compute = _DTYPE_BYTES[optimizer_dtype], _DTYPE_BYTES[dtype]
    p = shape.params
    weights, grads = p * store // dp, p * store // dp
    optimizer = 2 * p * store // dp if adam else 0
    compute_copy = p * compute if compute != store else 0   # the cast parameters of forward/backward (upper bound)
    t = tokens_per_mb
    saved = t * shape.hidden * shape.layers * compute                     # each layer's input (checkpointing)
    # the layer recomputed in backward: its activations and their gradients
    one_layer = 2 * t * (10 * shape.hidden + 4 * shape.intermediate) * compute
    scores = 2 * t * t * shape.heads * compute if dense_attention else 0   # scores and softmax, one layer
    logits = t * shape.vocab * (compute + 2 * 4)                          # logits, fp32 log-softmax and its gradient
    reference_weights = reference_forward = 0
    if reference_dtype is not None:   # logprobs only: its weights (and a cast copy if stored wider), one forward
        ref_store = _DTYPE_BYTES[reference_dtype]
        reference_weights = p * ref_store // dp + (p * compute if compute != ref_store else 0)
        reference_forward = (t * (10 * shape.hidden + 4 * shape.intermediate) * compute
                             + t * shape.vocab * (compute + 4) + scores // 2)
    return Estimate(weights=weights, grads=grads, optimizer=optimizer, compute_copy=compute_copy,
                    activations=saved + one_layer + scores + logits, vllm=int(gpu_memory_utilization * gpu_gib * GIB),
                    colocated=colocated, row_tokens=row_tokens, screenshot_tokens=shape.tokens_per_screenshot(),
                    reference_weights=reference_weights, reference_forward=reference_forward)


def _colocated(engine, target: str) -> bool:
    strategy = getattr(engine, "scheduling_strategy", None)
    kind = str(getattr(getattr(strategy, "type", ""), "value", getattr(strategy, "type", "")))
    return kind == "colocation" and getattr(strategy, "target", None) == target


def of_config(config: CUAConfig) -> list[str]:
    """``--dry-run``'s lines for a loaded CUAConfig (or why there is no estimate)."""
    from areal.api.alloc_mode import ModelAllocation

    gpu_gib, gpu_source = _gpu_memory() if config.cluster.n_gpus_per_node else (None, "")

    try:
        shape = shape_of(config.actor.path, config.policy.min_pixels, config.policy.max_pixels)
    except Exception as exc:   # noqa: BLE001 - e.g. a Hub id on a machine without the Hub: say so, go on
        return [f"memory: no estimate (the model config of {config.actor.path} cannot be read here: "
                f"{type(exc).__name__})"]
    colocated = _colocated(config.actor, "rollout") or _colocated(config.rollout, "actor")
    ref = config.ref if config.actor.kl_ctl > 0 else None
    try:
        dp = ModelAllocation.from_str(config.actor.backend, name="actor").parallel.dp_size
    except Exception:   # noqa: BLE001 - an allocation this version cannot parse: assume one shard
        dp = 1
    est = estimate(shape, dtype=config.actor.dtype, optimizer_dtype=config.actor.optimizer_dtype,
                   tokens_per_mb=config.actor.mb_spec.max_tokens_per_mb or config.gconfig.max_tokens,
                   row_tokens=config.gconfig.max_tokens, dp=max(dp, 1),
                   gpu_memory_utilization=config.vllm.gpu_memory_utilization, gpu_gib=gpu_gib or 0.0,
                   colocated=colocated, adam=config.actor.optimizer.type in ("adam", "adamw"),
                   dense_attention=gpu_gib is None,
                   reference_dtype=ref.optimizer_dtype if ref is not None and _colocated(ref, "actor") else None)
    lines = est.lines(gpu_gib, gpu_source)
    if ref is not None and not _colocated(ref, "actor"):
        lines.append("the KL penalty's reference model runs on GPUs of its own (its ref section): not in the figure")
    return lines


def _gpu_memory() -> tuple[float, str]:
    """This machine's first GPU's memory in GiB, else the 80 GiB card the recipes are written for."""
    try:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            return props.total_memory / GIB, f"this machine's {props.name}"
    except Exception:   # noqa: BLE001
        pass
    return 80.0, "an 80 GiB GPU assumed: none here"
