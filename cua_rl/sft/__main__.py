"""``python -m cua_rl.sft --config CONFIG.yaml [key=value ...]``: warm-start a model by SFT on demonstrations.

Reads the same ``CUAConfig`` as training (``sft:`` section; ``actor.path`` is the model, ``policy`` decides
the prompt exactly as the policy endpoint will, ``gbox_mini_agent_agent`` the prompt format), records the
scripted solutions of the curriculum tasks on real desktops (the embedded gym unless ``gym_base_url`` is
set), trains and writes an HF checkpoint; prints one JSON line with the figures. RL then starts from it:
``train.sh actor.path=<checkpoint>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from cua_rl.logs import keep_stdlib_logging

logger = logging.getLogger("cua_rl.sft")


def _model_dir(config: CUAConfig) -> str:
    """``actor.path``; the embedded tiny model is built offline when it is the one asked for and missing."""
    from cua_rl.config import resolve_tiny_model_dir

    path = Path(os.path.expanduser(config.actor.path))
    if path == Path(resolve_tiny_model_dir(config)):
        from cua_rl.local_model.tiny import build_tiny, is_current

        if not is_current(path):
            build_tiny(path)
    return str(path)


def _output_dir(config: CUAConfig) -> str:
    if config.sft.output_dir:
        return os.path.expanduser(config.sft.output_dir)
    return os.path.join(config.cluster.fileroot, config.experiment_name, config.trial_name, "sft")


@contextlib.contextmanager
def _gym(config: CUAConfig):
    """(url, gym id) of the configured gym, or of an embedded one for the duration."""
    if config.gym_base_url:   # the demonstrations play on one host: a fleet's first
        yield config.gym_urls[0], config.gym_id
        return
    from cua_rl.local_gym import start_gym_server

    with start_gym_server(port=0, max_executions=4, pool_size=1) as gym:
        yield gym.url, gym.gym_id


def run(config: CUAConfig) -> dict:
    from transformers import AutoProcessor

    from cua_rl.local_gym import load_tasks
    from cua_rl.local_gym.curriculum import seeds
    from cua_rl.policy import EndpointSettings
    from cua_rl.sft import demo_rows, record_demos, train_rows

    cfg = config.sft
    tasks = [load_tasks().get(key) for key in cfg.tasks]
    bad = [key for key, task in zip(cfg.tasks, tasks) if task is None or task.family is None]
    if bad:
        raise SystemExit(f"sft.tasks must name curriculum family tasks; not: {bad}")
    model = _model_dir(config)
    t0 = time.perf_counter()
    with _gym(config) as (url, gym_id):
        demos = asyncio.run(record_demos(url, gym_id, tasks, seeds("train", cfg.demos_per_task, cfg.seed_offset),
                                         config.gbox_mini_agent_agent, cfg.history_images,
                                         error_rate=cfg.demo_error_rate, max_turns=config.max_turns))
    demo_s = time.perf_counter() - t0
    processor = AutoProcessor.from_pretrained(model)
    settings = EndpointSettings.from_dict(asdict(config.policy))
    rows = [row for demo in demos
            for row in demo_rows(processor, processor.tokenizer, settings, demo, config.trajectory.export_style)]
    result = train_rows(rows, model, _output_dir(config), steps=cfg.steps, rows_per_step=cfg.rows_per_step,
                        lr=cfg.lr, seed=cfg.seed, experiment=config.experiment_name, trial=config.trial_name,
                        max_tokens_per_mb=cfg.max_tokens_per_mb)
    return {"demonstrations": len(demos), "wrong_demonstrations": sum(d.erroneous for d in demos),
            "demo_seconds": round(demo_s, 1), **asdict(result)}


def main(argv: list[str]) -> None:
    from areal.api.cli_args import load_expr_config

    from cua_rl.config import CUAConfig, hydra_overrides

    keep_stdlib_logging()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config, _ = load_expr_config(hydra_overrides(argv), CUAConfig)
    print(json.dumps(run(config)))


if __name__ == "__main__":
    main(sys.argv[1:])
