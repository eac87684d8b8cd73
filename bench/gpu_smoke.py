"""GPU smoke check: one training step's worth of our multi-turn rows through AReaL's FSDP engine on a
Qwen3-VL-2B-shaped model with random weights, built offline; prints one JSON object on stdout (logs: stderr).

Why: a GPU machine is lent to this project rarely, for 15 minutes, with no package registry. This script is
prepared so that one call there measures what the CPU cannot: ``tokens_per_s`` and ``peak_memory_gb`` of the
actor's training step (``torch.cuda.max_memory_allocated``) beside ``estimate_gb``, what ``train.sh --dry-run``
predicts for the same shape (``cua_rl/run/estimate.py``, the actor's side: weights, gradients, AdamW, the compute
copy, one micro-batch's activations), and, second part, one weight update by disk (``weight_update_disk``).
The device machine's call, from the repository root, with the wheels of ``scripts/gpu_wheels.sh .whl`` carried
as ``.whl`` (no ``pip install -e``: our tree is the working tree, on PYTHONPATH):

    pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && PYTHONPATH=.:/tmp/site HF_HUB_OFFLINE=1 python bench/gpu_smoke.py --device cuda --model 2b

What runs, in order:
- the recipe (``--recipe``, default ``examples/cua_agent/config.1gpu.yaml``: one GPU) is loaded as training
  loads it (AReaL's ``load_expr_config`` parse into ``CUAConfig``, with its checks), with ``actor.path`` set to the model below and
  ``actor.backend=fsdp:d1``; its ``actor`` section (attention ``sdpa``, bf16 compute over fp32 master weights,
  gradient checkpointing, ``mb_spec.max_tokens_per_mb``, AdamW) is the engine's config as is. On the CPU
  ``actor.dtype=float32``, as ``config.cpu.yaml`` sets it.
- the model: ``--model 2b``: Qwen3-VL-2B-Instruct's dimensions (``QWEN3_VL_2B``: 2,127,532,032 parameters, the
  count ``tests/run/test_gpu_placement.py`` uses) with random weights, written as a bf16 checkpoint, and the
  tiny model's own tokenizer, chat template and processor (``cua_rl/local_model/tiny.py``) at Qwen3-VL's pixel
  limits, so a screenshot costs what it costs the real model (the vocabulary, and so the logits, are the 2B
  model's 151,936 rows; text tokenises a little longer with the tiny BPE). ``--model tiny``: the tiny model.
- rows: ``--episodes`` episodes of ``--turns`` agent turns on synthetic 1280x800 screenshots, each turn the
  agent's own prompt (``local_agent.formats`` qwen3-vl, history of ``sft.history_images`` screenshots), the
  reply a tool call, made into training rows by the SFT/RL row code (``cua_rl.sft.rows.demo_rows``:
  ``policy.prompt_from_messages`` with the recipe's ``policy`` section, i.e. its image budget
  ``policy.max_pixels``, then ``trajectory.episode_rows``), exactly as a warm start's rows are.
- ``--steps`` training steps on all rows (``train_lm`` below: AReaL's ``LMEngine.train_lm`` on the engine's
  ``train_batch``: forward, backward, AdamW step), the first a warm-up;
  ``tokens_per_s`` is the rows' tokens over the later steps' time. First the two patches of the training
  worker (``cua_rl/areal_ext/worker.py``) that such a step goes through: the packed-sequence sdpa and the
  rows' palette-coded images (the others concern the PPO statistics, RPC transfers, LoRA and ports).
- weight update by disk: what AReaL's ``_update_weights_from_disk`` does on the actor's side, timed
  (``engine.save`` in HF format: FSDP's full state dict gathered to the host, cast to bf16, written), and the
  read of that checkpoint back onto the device (``safetensors`` into device memory, in place of vLLM's
  ``load_weights``: no vLLM on that machine). The weight-update decision: docs/cluster.md, "Weight updates".

Carry plan: AReaL 1.0.4's FSDP engine, not plain torch, because its imports fit in the carry: ``import areal``
reaches ``ray`` at module level (a 79 MB wheel), but nothing of Ray runs in a one-process FSDP engine, so when
``ray`` is not importable a stub module stands in for it (``stub_ray``); the rest is ``scripts/gpu_wheels.sh``'s
list (about 20 small wheels, installed with ``--no-deps``). AReaL's pins are knowingly overridden there: it
asks for torch<2.11 and transformers<=5.3.0, the device machine has torch 2.11 and transformers 5.17; the JSON's
``versions`` says what ran.

    python bench/gpu_smoke.py --device cpu --model tiny     # the same code on 2 CPU cores, under a minute
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import io
import json
import logging
import os
import resource
import shutil
import sys
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30
logger = logging.getLogger("gpu_smoke")

# Qwen/Qwen3-VL-2B-Instruct's config.json (text and vision towers), tied embeddings.
QWEN3_VL_2B = {
    "text": dict(hidden_size=2048,  # noqa: C408 - config.json's keys as keywords
                 intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=262144,
                 rms_norm_eps=1e-6, tie_word_embeddings=True,
                 rope_parameters={"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [24, 20, 20],
                                  "mrope_interleaved": True}),
    "vision": dict(depth=24,  # noqa: C408
                   hidden_size=1024, intermediate_size=4096, num_heads=16, out_hidden_size=2048,
                   num_position_embeddings=2304, deepstack_visual_indexes=[5, 11, 17], patch_size=16,
                   spatial_merge_size=2, temporal_patch_size=2, hidden_act="gelu_pytorch_tanh"),
    # Qwen3-VL's processor: shortest_edge/longest_edge in pixels
    "min_pixels": 65536,
    "max_pixels": 16777216,
}


# ---------------------------------------------------------------------------------------------- ray stub
class _Anything(type):
    """A class whose every attribute is another such class: ``ray.remote``, ``ray.util.X`` at import time."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _anything(name)


def _anything(name: str) -> type:
    def __call__(self, *args, **kwargs):   # a decorator returns what it decorates
        return args[0] if len(args) == 1 and not kwargs and callable(args[0]) else self
    return _Anything(name, (), {"__init__": lambda self, *a, **k: None, "__call__": __call__})


class _RayStub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name, "stand-in for ray (bench/gpu_smoke.py): not installed here")
        module.__path__ = []

        def attr(name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _anything(name)
        module.__getattr__ = attr
        return module

    def exec_module(self, module):
        pass


def stub_ray() -> bool:
    """Stand a stub in for ``ray`` when it is not installed (AReaL imports it at module level; a one-process
    FSDP engine never calls it). Returns whether the stub is in place."""
    if importlib.util.find_spec("ray") is not None:
        return False
    sys.meta_path.insert(0, _RayStub())
    return True


# ---------------------------------------------------------------------------------------------- model
def build_model(kind: str, out: Path, device: str) -> Path:
    """The checkpoint directory of ``kind`` ('tiny' or '2b'); see the module docstring."""
    from cua_rl.local_model.tiny import TinySpec, build_tiny

    if kind == "tiny":
        return build_tiny(out)
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    build_tiny(out, spec=TinySpec(min_pixels=QWEN3_VL_2B["min_pixels"], max_pixels=QWEN3_VL_2B["max_pixels"]))
    (out / "tiny_spec.json").unlink()   # no longer the tiny model
    base = Qwen3VLConfig.from_pretrained(out).to_dict()
    base["text_config"].update(QWEN3_VL_2B["text"])
    base["vision_config"].update(QWEN3_VL_2B["vision"])
    base["tie_word_embeddings"] = True
    config = Qwen3VLConfig.from_dict(base)
    t0 = time.perf_counter()
    with torch.device(device):
        model = Qwen3VLForConditionalGeneration._from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out)
    logger.info("wrote a random Qwen3-VL-2B-shaped checkpoint (%d parameters) in %.1f s",
                sum(p.numel() for p in model.parameters()), time.perf_counter() - t0)
    del model
    return out


# ---------------------------------------------------------------------------------------------- rows
def screenshot(seed: int, size: tuple[int, int] = (1280, 800)) -> str:
    """A PNG data URL of a desktop-like frame: a few windows and buttons, placed by ``seed``."""
    import random

    from PIL import Image, ImageDraw

    from cua_rl.local_agent.runner import png_data_url

    rng = random.Random(seed)
    img = Image.new("RGB", size, (40, 60, 90))
    draw = ImageDraw.Draw(img)
    for _ in range(6):
        x, y = rng.randrange(size[0] - 300), rng.randrange(size[1] - 200)
        draw.rectangle([x, y, x + rng.randrange(120, 300), y + rng.randrange(60, 200)],
                       fill=tuple(rng.randrange(256) for _ in range(3)), outline=(0, 0, 0))
        draw.text((x + 8, y + 8), f"Button {rng.randrange(100)}", fill=(0, 0, 0))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return png_data_url(buf.getvalue())


def episode(index: int, turns: int, history_images: int):
    """One agent episode without a gym: the agent's prompts (its own format, on synthetic screens) and the
    tool calls it replies with, as ``cua_rl.sft.demos.play_turn`` records them; the last turn terminates."""
    from cua_rl.local_agent.formats import HistoryStep, PromptContext, get_format
    from cua_rl.sft.demos import Demonstration, DemoTurn, qwen3_vl_reply

    fmt = get_format("qwen3-vl")
    ctx = PromptContext(instruction=f"Open the settings and enable option {index}.", space="pc",
                        history_images=history_images, screen=(1280, 800))
    demo = Demonstration(f"smoke-{index}", index, ctx.instruction, reward=1.0)
    history: list = []
    for t in range(turns):
        shot = screenshot(1000 * index + t)
        messages = fmt.build_messages(ctx, history, shot, None)
        action = None if t == turns - 1 else {"type": "click", "x": 0.1 + 0.8 * t / turns, "y": 0.5}
        reply = qwen3_vl_reply(action)
        parsed = fmt.parse({"role": "assistant", "content": reply}, ctx)
        history.append(HistoryStep(step=t + 1, screenshot=shot, feedback=None, reply=reply,
                                   summary=fmt.summarize(parsed)))
        demo.turns.append(DemoTurn(messages, reply))
    return demo


def make_rows(config, model_dir: Path, episodes: int, turns: int) -> list[dict]:
    from dataclasses import asdict

    from transformers import AutoProcessor

    from cua_rl.policy import EndpointSettings
    from cua_rl.sft.rows import demo_rows

    processor = AutoProcessor.from_pretrained(model_dir)
    settings = EndpointSettings.from_dict(asdict(config.policy))
    return [row for i in range(episodes)
            for row in demo_rows(processor, processor.tokenizer, settings, episode(i, turns, config.sft.history_images),
                                 config.trajectory.export_style)]


def row_tokens(row: dict) -> int:
    return int(row["input_ids"].numel())


# ---------------------------------------------------------------------------------------------- engine
def load_recipe(recipe: str, model_dir: Path, device: str, fileroot: str):
    from areal.api.cli_args import parse_cli_args, to_structured_cfg
    from omegaconf import OmegaConf

    from cua_rl.config import CUAConfig, hydra_overrides

    overrides = [f"actor.path={model_dir}", "actor.backend=fsdp:d1", f"cluster.fileroot={fileroot}",
                 "trial_name=smoke", "existing_run=overwrite"]
    if device == "cpu":
        overrides.append("actor.dtype=float32")   # as config.cpu.yaml
    # load_expr_config's parse and checks, without its side effects (it saves the config through AReaL's
    # stats logger, whose module imports wandb, swanlab, trackio and tensorboardX: not on the GPU machine)
    cfg, _ = parse_cli_args(["--config", recipe, *hydra_overrides(overrides)])
    return OmegaConf.to_object(to_structured_cfg(cfg, config_cls=CUAConfig))


def make_engine(config, total_rows: int):
    """AReaL's FSDP engine (``FSDPEngine``) with the recipe's ``actor`` section, one rank. The base engine, not
    ``FSDPLMEngine``: that one's SFT helper lives in ``areal.trainer``, whose package imports every trainer and
    with them datasets, wandb, swanlab, trackio and tensorboardX (tens of MB more to carry)."""
    from areal.api import FinetuneSpec
    from areal.engine.fsdp_engine import FSDPEngine

    from cua_rl.sft.train import _single_rank_env

    _single_rank_env()
    engine = FSDPEngine(config.actor)
    engine.create_process_group()
    engine.initialize(addr=None, ft_spec=FinetuneSpec(total_train_epochs=1, dataset_size=total_rows,
                                                      train_batch_size=total_rows))
    return engine


def sft_loss(logprobs, entropy, input_, **_):
    """AReaL's ``compute_packed_sft_loss`` less its statistics: mean NLL of the loss-masked tokens."""
    import torch

    mask = input_["loss_mask"].bool()
    return -torch.where(mask, logprobs, 0).sum() / (1e-5 + mask.count_nonzero())


def train_lm(engine, rows: list[dict]) -> None:
    """One step as AReaL's ``LMEngine.train_lm`` takes it: the rows batched, the loss mask shifted onto the
    predicted tokens, ``train_batch`` (micro-batches packed up to ``mb_spec.max_tokens_per_mb``, forward,
    backward, optimizer step)."""
    import torch
    from areal.utils.data import batched_call

    def step(data):
        engine.train()
        data["loss_mask"] = torch.roll(data["loss_mask"].bool(), shifts=-1, dims=-1)
        engine.train_batch(input_=data, loss_fn=sft_loss, loss_weight_fn=lambda x: x["loss_mask"].count_nonzero())
    batched_call(step, [dict(r) for r in rows], unpack=False)


def rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Memory:
    """Peak memory of the training side: the GPU's allocated bytes, or on the CPU the process's peak RSS over
    its RSS before the engine was built (as bench/memory_estimate_bench.py measures)."""

    def __init__(self, device: str):
        import torch

        self.device, self.torch = device, torch
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        self.before = rss()

    def peak_gb(self) -> float:
        if self.device == "cuda":
            return self.torch.cuda.max_memory_allocated() / GIB
        return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - self.before) / GIB


def sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def train_steps(engine, rows: list[dict], steps: int, device: str) -> list[float]:
    seconds = []
    for step in range(steps):
        sync(device)
        t0 = time.perf_counter()
        train_lm(engine, rows)
        engine.step_lr_scheduler()
        sync(device)
        seconds.append(time.perf_counter() - t0)
        logger.info("step %d/%d: %.2f s", step + 1, steps, seconds[-1])
    return seconds


def weight_update_disk(engine, out: Path, device: str) -> dict:
    """The actor's side of AReaL's disk weight update (``engine.save`` in HF format, what
    ``_update_weights_from_disk`` calls), then the checkpoint read back into device memory."""
    import torch
    from areal.api.io_struct import SaveLoadMeta
    from safetensors.torch import load_file

    sync(device)
    t0 = time.perf_counter()
    engine.save(SaveLoadMeta(path=str(out), weight_format="hf", with_optim=False,
                             tokenizer=engine.tokenizer, processor=engine.processor))
    save_s = time.perf_counter() - t0
    files = sorted(out.glob("*.safetensors"))
    t1 = time.perf_counter()
    loaded = 0
    for f in files:
        tensors = load_file(str(f), device="cuda" if device == "cuda" else "cpu")
        loaded += sum(t.numel() * t.element_size() for t in tensors.values())
        del tensors
    sync(device)
    load_s = time.perf_counter() - t1
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"save_s": round(save_s, 2), "load_s": round(load_s, 2), "total_s": round(save_s + load_s, 2),
            "bytes": sum(f.stat().st_size for f in files), "loaded_bytes": loaded,
            "what": "actor: engine.save(hf) as AReaL's _update_weights_from_disk; rollout side: the safetensors "
                    "read into device memory (no vLLM on this machine)"}


def estimate_gb(config, model_dir: Path, device: str) -> float:
    """``cua_rl/run/estimate.py`` for this shape and recipe: the actor's side (no vLLM runs here)."""
    from cua_rl.run.estimate import estimate, shape_of

    shape = shape_of(str(model_dir), config.policy.min_pixels, config.policy.max_pixels)
    est = estimate(shape, dtype=config.actor.dtype, optimizer_dtype=config.actor.optimizer_dtype,
                   tokens_per_mb=config.actor.mb_spec.max_tokens_per_mb or config.gconfig.max_tokens,
                   row_tokens=config.gconfig.max_tokens, dp=1,
                   adam=config.actor.optimizer.type in ("adam", "adamw"), dense_attention=device == "cpu")
    return est.actor / GIB


def versions(ray_stubbed: bool) -> dict:
    import areal
    import torch
    import transformers

    return {"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__,
            "areal": areal.__version__, "ray": "stub (bench/gpu_smoke.py)" if ray_stubbed else "installed"}


# ---------------------------------------------------------------------------------------------- main
def run(args) -> dict:
    import torch

    t_start = time.perf_counter()
    stubbed = stub_ray()
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here (use --device cpu --model tiny)")
    if device == "cpu":
        torch.set_num_threads(args.threads)
    from cua_rl.areal_ext import compact_images
    from cua_rl.areal_ext.packed_attention import enable_packed_sdpa

    enable_packed_sdpa()       # the training worker's patches that a train_lm step goes through
    compact_images.enable()
    work = Path(tempfile.mkdtemp(prefix="gpu-smoke-", dir=args.workdir))
    try:
        return _measure(args, device, stubbed, work, t_start)
    finally:
        if args.workdir is None:   # the checkpoint (4 GiB at 2B) and the saved weights go with it
            shutil.rmtree(work, ignore_errors=True)


def _measure(args, device: str, stubbed: bool, work: Path, t_start: float) -> dict:
    model_dir = build_model(args.model, work / "model", device)
    config = load_recipe(args.recipe, model_dir, device, str(work / "fileroot"))
    rows = make_rows(config, model_dir, args.episodes, args.turns)
    lengths = [row_tokens(r) for r in rows]
    if max(lengths) > config.gconfig.max_tokens:
        raise SystemExit(f"a row of {max(lengths)} tokens is over gconfig.max_tokens {config.gconfig.max_tokens}: "
                         f"fewer --turns or a smaller image budget")
    logger.info("%d rows, %d tokens (longest %d)", len(rows), sum(lengths), max(lengths))
    memory = Memory(device)
    engine = make_engine(config, len(rows))
    try:
        params = sum(p.numel() for p in engine.model.parameters())   # this rank's shard: all of it at d1
        seconds = train_steps(engine, rows, args.steps, device)
        peak = memory.peak_gb()
        update = weight_update_disk(engine, work / "weights", device) if args.weight_update else None
    finally:
        engine.destroy()
    timed = seconds[1:] or seconds
    tokens = sum(lengths)
    result = {
        "bench": "gpu_smoke", "device": _device_name(device), "model": args.model,
        "params": params,
        "recipe": _relative(args.recipe), "attn_impl": config.actor.attn_impl, "dtype": config.actor.dtype,
        "optimizer_dtype": config.actor.optimizer_dtype,
        "gradient_checkpointing": config.actor.gradient_checkpointing,
        "max_tokens_per_mb": config.actor.mb_spec.max_tokens_per_mb, "policy_max_pixels": config.policy.max_pixels,
        "rows": len(rows), "episodes": args.episodes, "turns": args.turns, "tokens_per_step": tokens,
        "longest_row": max(lengths), "steps": args.steps, "step_seconds": [round(s, 3) for s in seconds],
        "tokens_per_s": round(tokens * len(timed) / sum(timed), 1),
        "peak_memory_gb": round(peak, 3), "estimate_gb": round(estimate_gb(config, model_dir, device), 3),
        "weight_update_disk": update, "seconds": round(time.perf_counter() - t_start, 1),
        "versions": versions(stubbed),
    }
    return result


def _relative(path: str) -> str:
    p = Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else path


def _device_name(device: str) -> str:
    import torch

    if device == "cuda":
        return torch.cuda.get_device_name(0)
    return f"cpu ({torch.get_num_threads()} threads)"


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--model", choices=["2b", "tiny"], default="2b")
    ap.add_argument("--recipe", default=str(ROOT / "examples/cua_agent/config.1gpu.yaml"))
    ap.add_argument("--episodes", type=int, default=None, help="episodes of rows, one row per turn (cuda 4, cpu 2)")
    ap.add_argument("--turns", type=int, default=None, help="agent turns per episode (cuda 4, cpu 2)")
    ap.add_argument("--steps", type=int, default=None,
                    help="training steps on all rows, the first a warm-up (cuda 3, cpu 2)")
    ap.add_argument("--no-weight-update", dest="weight_update", action="store_false",
                    help="skip the second part (one weight update by disk)")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads (--device cpu)")
    ap.add_argument("--workdir", default=None,
                    help="where the checkpoint and logs go, kept (default: a temporary directory, removed)")
    args = ap.parse_args(argv)
    small = args.device == "cpu"   # 2 cores: within 3 minutes
    for key, gpu, cpu in (("episodes", 4, 2), ("turns", 4, 2), ("steps", 3, 2)):
        if getattr(args, key) is None:
            setattr(args, key, cpu if small else gpu)
    return args


@contextlib.contextmanager
def stdout_to_stderr():
    """Everything written to stdout meanwhile (Python or C, AReaL's and the libraries' prints) goes to stderr,
    so stdout carries only the JSON; yields the real stdout."""
    sys.stdout.flush()
    real = os.dup(1)
    os.dup2(2, 1)
    try:
        with os.fdopen(os.dup(real), "w") as out, contextlib.redirect_stdout(sys.stderr):
            yield out
    finally:
        sys.stdout.flush()
        os.dup2(real, 1)
        os.close(real)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    sys.path.insert(0, str(ROOT))
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with stdout_to_stderr() as out:
        result = run(args)
        print(json.dumps(result, indent=1), file=out, flush=True)


if __name__ == "__main__":
    main()
