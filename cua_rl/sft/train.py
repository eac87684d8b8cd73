"""Supervised fine-tuning on training rows with AReaL's own SFT machinery (``FSDPLMEngine.train_lm``).

Why AReaL's engine: the rows are the RL rows' tensor dicts, and ``train_lm`` trains them with AReaL's packed
SFT loss (``compute_packed_sft_loss``: mean negative log-likelihood of the loss-masked tokens) on the same
FSDP engine, micro-batching and checkpoint writer as the PPO actor; nothing converts them. It runs in this
process as a one-rank world (gloo on the CPU; set RANK/WORLD_SIZE/MASTER_* to run under torchrun).
"""

from __future__ import annotations

import logging
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)


@dataclass
class SFTResult:
    checkpoint: str
    rows: int
    steps: int
    loss_before: float             # mean reply-token NLL over all rows before training
    loss_after: float              # the same after training
    step_losses: list[float] = field(default_factory=list)
    train_seconds: float = 0.0     # the optimisation steps only
    total_seconds: float = 0.0     # engine start, steps, evaluations and the checkpoint


def _single_rank_env() -> None:
    """A one-process torch.distributed world unless a launcher (torchrun) already set one up."""
    from cua_rl.http.serve import free_port

    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(free_port()))


def _loss(engine, scope: str) -> float:
    """Mean reply-token NLL of the rows just trained or evaluated, as AReaL's SFT stats report it under ``scope``."""
    stats = engine.export_stats()
    for key in (f"{scope}/loss/avg", f"{scope}/loss"):
        if key in stats:
            return float(stats[key])
    raise KeyError(f"no {scope} loss in AReaL's stats: {sorted(stats)}")


def _evaluate(engine, rows) -> float:
    engine.evaluate_lm([dict(r) for r in rows])
    return _loss(engine, "sft-eval")


def make_engine(model_path: str, lr: float, total_steps: int, rows_per_step: int, experiment: str, trial: str,
                max_tokens_per_mb: int | None = None):
    """AReaL's FSDP SFT engine on ``model_path`` (float32, sdpa with packed-sequence masks on the CPU)."""
    from areal.api import FinetuneSpec
    from areal.api.cli_args import MicroBatchSpec, OptimizerConfig, TrainEngineConfig
    from areal.engine.fsdp_engine import FSDPLMEngine

    from cua_rl.areal_ext.packed_attention import enable_packed_sdpa

    enable_packed_sdpa()   # AReaL packs a micro-batch into one sequence; see cua_rl/areal_ext/packed_attention.py
    _single_rank_env()
    engine = FSDPLMEngine(TrainEngineConfig(
        experiment_name=experiment, trial_name=trial, path=model_path, backend="fsdp:d1", attn_impl="sdpa",
        dtype="float32", mb_spec=MicroBatchSpec(max_tokens_per_mb=max_tokens_per_mb),
        optimizer=OptimizerConfig(lr=lr, warmup_steps_proportion=0.0, weight_decay=0.0, lr_scheduler_type="constant")))
    engine.create_process_group()
    engine.initialize(addr=None, ft_spec=FinetuneSpec(total_train_epochs=1, dataset_size=total_steps * rows_per_step,
                                                      train_batch_size=rows_per_step))
    return engine


def train_rows(rows: list[dict[str, Any]], model_path: str, out_dir: str, *, steps: int, rows_per_step: int,
               lr: float, seed: int = 1, experiment: str = "cua-sft", trial: str = "sft",
               max_tokens_per_mb: int | None = 4096) -> SFTResult:
    """``steps`` optimiser steps over ``rows`` (shuffled with ``seed``, ``rows_per_step`` per step, cycling),
    then an HF checkpoint (weights, tokenizer, processor) in ``out_dir``. ``max_tokens_per_mb`` splits a step
    into micro-batches: AReaL packs a micro-batch into one sequence and CPU attention over it grows with the
    square of its length (8 rows of ~1.8k tokens in one micro-batch: ~34 s a step; 4 rows: ~4 s)."""
    from areal.api.io_struct import SaveLoadMeta
    from transformers import AutoProcessor

    if not rows:
        raise ValueError("no training rows (were any demonstrations recorded?)")
    t0 = time.perf_counter()
    engine = make_engine(model_path, lr, steps, rows_per_step, experiment, trial, max_tokens_per_mb)
    try:
        before = _evaluate(engine, rows)
        order = list(range(len(rows)))
        random.Random(seed).shuffle(order)
        losses, t1 = [], time.perf_counter()
        for step in range(steps):
            pick = [order[(step * rows_per_step + i) % len(order)] for i in range(min(rows_per_step, len(rows)))]
            engine.train_lm([dict(rows[i]) for i in pick])
            engine.step_lr_scheduler()
            losses.append(_loss(engine, "sft"))
            if (step + 1) % max(1, steps // 20) == 0 or step + 1 == steps:   # about 20 progress lines
                per_step = (time.perf_counter() - t1) / (step + 1)
                logger.info("SFT step %d/%d: loss %.4f (%.1f s a step, %.0f s to go)", step + 1, steps,
                            losses[-1], per_step, per_step * (steps - step - 1))
        train_s = time.perf_counter() - t1
        after = _evaluate(engine, rows)
        processor = AutoProcessor.from_pretrained(model_path)
        engine.save(SaveLoadMeta(path=out_dir, weight_format="hf", with_optim=False,
                                 tokenizer=processor.tokenizer, processor=processor))
    finally:
        engine.destroy()
    return SFTResult(out_dir, len(rows), steps, before, after, losses, train_s, time.perf_counter() - t0)
