"""Held-out success of model checkpoints on the seeded curriculum, through the same stack training uses.

    python -m cua_rl.evaluate --config examples/cua_agent/config.cpu.yaml \
        --checkpoints SFT_DIR STEP1_DIR ... [--seeds-per-task 16] [--concurrency 4] [key=value ...]

Why a separate path from AReaL's evaluator: the learning gate compares checkpoints written by different runs
(the SFT warm start, every RL step, the negative control) on one fixed set of held-out instances, so one
served model loads each checkpoint in turn instead of each run evaluating itself. Nothing else differs from a
training episode: AReaL's vLLM server (the CPU config), AReaL's ``RemotevLLMEngine``, our policy endpoint
(same prompt, images and sampling as a rollout: ``gconfig``), the agent service and real desktops of the
embedded gym, through ``CUAAgentWorkflow``'s own episode code. Checkpoints are loaded with AReaL's
``/areal_update_weights`` (the route a disk weight update uses).

Instances: ``curriculum.seeds("heldout", n)`` for every family task in ``sft.tasks``: seeds no training
group ever draws, the same list for every checkpoint. An episode the infrastructure dropped counts as a
failure and is reported (``dropped``), and so does one whose model call failed (``model_errors``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from cua_rl.logs import setup_logging

logger = logging.getLogger("cua-evaluate")


@dataclass
class CheckpointResult:
    checkpoint: str
    success: float                                  # over every held-out episode
    per_task: dict[str, float] = field(default_factory=dict)
    episodes: int = 0
    dropped: int = 0                                # the infrastructure dropped the episode (a failure)
    model_errors: int = 0                           # the agent's model call failed (HTTP error; a failure)
    seconds: float = 0.0


def _curriculum_rows(task_keys: list[str]) -> list[dict]:
    from cua_rl.local_gym import load_tasks

    rows = []
    for key in task_keys:
        task = load_tasks().get(key)
        if task is None or task.family is None:
            raise SystemExit(f"held-out evaluation needs curriculum family tasks; {key!r} is not one")
        rows.append({"task_id": task.task_id, "instruction": task.instruction, "name": task.name})
    return rows


async def _evaluate_loaded(workflow, endpoint, rows: list[dict], seeds: list[int], concurrency: int) -> dict:
    """Every (task, seed) once; returns successes and drops per task id."""
    from cua_rl.workflow import Dropped

    gate = asyncio.Semaphore(concurrency)
    counts = {row["task_id"]: {"success": 0, "episodes": 0, "dropped": 0, "model_errors": 0} for row in rows}

    async def one(row: dict, index: int, seed: int) -> None:
        async with gate:
            outcome = await workflow._episode(endpoint, row, index, seed=seed)
        c = counts[row["task_id"]]
        c["episodes"] += 1
        if isinstance(outcome, Dropped):
            c["dropped"] += 1
            logger.warning("%s seed %d: dropped (%s: %s); counted as a failure", row["task_id"], seed,
                           outcome.cause, outcome.reason)
        elif str(outcome.info.get("reason", "")).startswith("chat completion"):
            c["model_errors"] += 1
            logger.warning("%s seed %d: the model call failed (%s); counted as a failure", row["task_id"], seed,
                           outcome.info["reason"])
        elif outcome.info.get("success"):
            c["success"] += 1

    await asyncio.gather(*(one(row, i, seed) for row in rows for i, seed in enumerate(seeds)))
    return counts


async def _evaluate_all(workflow, engine, model_url: str, checkpoints: list[str], rows: list[dict],
                        heldout: list[int], concurrency: int) -> list[CheckpointResult]:
    """Every checkpoint in turn, in one event loop: the engine's and the endpoint's sessions are bound to the
    loop that first used them (a loop per checkpoint failed every later request with HTTP 500)."""
    from cua_rl.http.client import async_client

    endpoint = workflow._policy(engine)
    results = []
    async with async_client(timeout=300) as client:
        for checkpoint in checkpoints:
            # AReaL's disk weight update route: the served model becomes this checkpoint. The first one too,
            # though the server started with it, so every checkpoint is served the same way.
            r = await client.post(model_url + "/areal_update_weights", json={"model_path": str(checkpoint)})
            if r.status_code != 200:
                raise RuntimeError(f"vLLM could not load {checkpoint}: HTTP {r.status_code} {r.text[:300]}")
            started = time.monotonic()
            counts = await _evaluate_loaded(workflow, endpoint, rows, heldout, concurrency)
            episodes = sum(c["episodes"] for c in counts.values())
            result = CheckpointResult(
                checkpoint=str(checkpoint),
                success=round(sum(c["success"] for c in counts.values()) / episodes, 4),
                per_task={t: round(c["success"] / c["episodes"], 4) for t, c in counts.items()},
                episodes=episodes, dropped=sum(c["dropped"] for c in counts.values()),
                model_errors=sum(c["model_errors"] for c in counts.values()), seconds=round(time.monotonic() - started, 1))
            logger.info("held-out success %.3f %s (%d episodes, %d dropped, %d model errors, %.0f s): %s",
                        result.success, result.per_task, episodes, result.dropped, result.model_errors,
                        result.seconds, checkpoint)
            print(json.dumps(result.__dict__), flush=True)
            results.append(result)
    return results


def evaluate_checkpoints(config, checkpoints: list[str], *, seeds_per_task: int = 16, concurrency: int = 4,
                         log_dir: str | Path | None = None, prefix_caching: bool = False) -> list[CheckpointResult]:
    """Held-out success of each checkpoint (see the module docstring), in the order given; each result is
    also printed as a JSON line as soon as it is known.

    ``prefix_caching``: every episode's prompt starts with the same system prompt and tool list (about 1,600
    of a one-turn prompt's 1,700 tokens), which vLLM then computes once per checkpoint instead of once per
    episode. Safe here, unlike in training: the weights change only between checkpoints, with no request in
    flight, and AReaL's weight-update route clears the cache. Off by default: with it on, the learning gate
    failed twice in a row on 2026-11-26 (docs/learning.md) and its held-out scores had not been compared with
    it off on the same checkpoints beyond 2 x 64 episodes (on 0.78/0.81, off 0.72/0.75)."""
    from areal.api.cli_args import InferenceEngineConfig
    from areal.engine.vllm_remote import RemotevLLMEngine

    from cua_rl.local_agent.server import start_agent_server
    from cua_rl.local_gym.curriculum import seeds
    from cua_rl.local_gym.server import start_gym_server
    from cua_rl.local_model.vllm_server import VLLMServer
    from cua_rl.workflow import AgentTarget, CUAAgentWorkflow, EpisodeLimits, GymTarget, ModelTarget

    if not checkpoints:
        raise ValueError("no checkpoints to evaluate")
    rows = _curriculum_rows(list(config.sft.tasks))
    heldout = seeds("heldout", seeds_per_task)
    log_path = Path(log_dir) / "evaluate-vllm.log" if log_dir else None
    with start_gym_server(gym_id="desktop", pool_size=concurrency, max_executions=concurrency) as gym, \
            start_agent_server() as agent, VLLMServer(checkpoints[0], log_path=log_path, prefix_caching=prefix_caching) as model:
        engine = RemotevLLMEngine(InferenceEngineConfig(backend="vllm:d1", max_concurrent_rollouts=concurrency,
                                                        request_timeout=300, setup_timeout=60))
        engine.initialize(addr=model.addr)
        try:
            workflow = CUAAgentWorkflow(
                gconfig=config.gconfig, model=ModelTarget(path=checkpoints[0]),
                gym=GymTarget(base_url=gym.url, gym_id=gym.gym_id),
                agent=AgentTarget(base_url=agent.url, agent=config.gbox_mini_agent_agent,
                                  action_space=config.gbox_mini_agent_standard_action_space, poll_interval_s=0.25),
                limits=EpisodeLimits(max_turns=config.max_turns, max_task_time_seconds=config.max_task_time_seconds,
                                     max_turn_time_seconds=config.max_turn_time_seconds),
                policy=config.policy, group_size=1, is_eval=True)
            results = asyncio.run(_evaluate_all(workflow, engine, model.url, checkpoints, rows, heldout, concurrency))
        finally:
            engine.destroy()
    return results


def _split_argv(argv: list[str]) -> tuple[list[str], dict[str, int], list[str]]:
    """(checkpoints, options, config args): ``--checkpoints A B ...`` up to the next option or key=value;
    ``--seeds-per-task N`` and ``--concurrency N``; the rest is AReaL's ``--config FILE key=value ...``."""
    usage = ("usage: python -m cua_rl.evaluate --config CONFIG --checkpoints DIR [DIR ...] [--seeds-per-task N] "
             "[--concurrency N] [key=value ...]")
    if "--checkpoints" not in argv:
        raise SystemExit(usage)
    i = argv.index("--checkpoints")
    j = i + 1
    while j < len(argv) and not argv[j].startswith("--") and "=" not in argv[j]:
        j += 1
    checkpoints, rest = argv[i + 1:j], argv[:i] + argv[j:]
    options, config_args, k = {}, [], 0
    while k < len(rest):
        name = rest[k].removeprefix("--").replace("-", "_")
        if rest[k] in ("--seeds-per-task", "--concurrency"):
            if k + 1 >= len(rest) or not rest[k + 1].isdigit() or int(rest[k + 1]) < 1:
                raise SystemExit(f"{rest[k]} needs a positive integer\n{usage}")
            options[name] = int(rest[k + 1])
            k += 2
        else:
            config_args.append(rest[k])
            k += 1
    if not checkpoints:
        raise SystemExit(usage)
    return checkpoints, options, config_args


def main(argv: list[str]) -> None:
    from areal.api.cli_args import load_expr_config

    from cua_rl.config import CUAConfig

    setup_logging()
    checkpoints, options, config_args = _split_argv(argv)
    config, _ = load_expr_config(config_args, CUAConfig)
    evaluate_checkpoints(config, checkpoints, **options)


if __name__ == "__main__":
    main(sys.argv[1:])
