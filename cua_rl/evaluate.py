"""Held-out success of model checkpoints, through the same stack training uses: on the seeded curriculum
(the learning bench and gate), or on your own gym (``cua-eval``).

    python -m cua_rl.evaluate --config examples/cua_agent/config.cpu.yaml \
        --checkpoints SFT_DIR STEP1_DIR ... [--seeds-per-task 16] [--concurrency 4] [--samples K]
        [--greedy | --both] [--regimes instances,content] [key=value ...]
    cua-eval --gym URL[,URL...] --gym-id ID --checkpoint DIR [--checkpoint DIR ...] [--split eval|train|all]
        [--episodes-per-task N] [--samples K] [--greedy | --both] [--gbox-mini-url URL | --agent embedded]
        [--model-url URL] [--concurrency N] [--config FILE] [--out FILE] [key=value ...]
    cua-eval --suite miniwob[:SPLIT] --checkpoint DIR [--gym URL] [--episodes-per-task N] [--greedy] [--out FILE] ...

``cua-eval`` (``evaluate_on_gym``) plays the tasks of the configured task source on the gym at ``--gym`` (several:
``URL,URL,...`` or ``@FILE``, each episode placed on one host as training places a group: cua_rl/workflow/placement.py)
(``--split``: the eval split, the default, as ``gym_eval_number_range``/``gym_train_ratio`` make it; the train
split; or all), ``--episodes-per-task`` instances of each (instance seeds the curriculum's held-out list gives;
a gym that draws no instances by seed plays the task again), with the agent service at ``--gbox-mini-url`` or
ours (``--agent embedded``), and prints one JSON object per checkpoint and decoding: success over every
episode, per task, pass@K with ``--samples``, mean policy turns, dropped episodes and model errors
(``--out`` writes the list). The model: AReaL's vLLM server (``areal_vllm_server``) started here for the first
checkpoint, on a GPU with a GPU recipe (its ``vllm`` section: ``eval_vllm_config``) or on the CPU, or, with
``--model-url``, one already running (each checkpoint is loaded into it through ``/areal_update_weights``, and it
keeps the last one).

``cua-eval --suite miniwob[:SPLIT]`` (``evaluate_on_suite``) plays a named MiniWoB++ task list
(cua_rl/local_gym/miniwob_suites.py: ``all``, ``browsergym-train``, ``browsergym-test``, ``yardstick``,
``yardstick-train``, ``yardstick-heldout``) on our MiniWoB++ gym (started here unless ``--gym`` names one serving
the same pages), ``--episodes-per-task`` held-out instances of each, and adds ``suite`` to each checkpoint's JSON:
the split and what it is, per task the successes, episodes, rate and two-sided 95% Clopper-Pearson interval
(cua_rl/stats.py) with the task's chance baseline beside it (cua_rl/local_gym/miniwob_chance.json, played by
bench/miniwob_chance.py; null where not measured), the same over the split, and a note that published MiniWoB++
leaderboards mostly use text observations while this agent sees screenshots.

Why a separate path from AReaL's evaluator: the learning gate compares checkpoints written by different runs
(the SFT warm start, every RL step, the negative control) on one fixed set of held-out instances, so one
served model loads each checkpoint in turn instead of each run evaluating itself. Nothing else differs from a
training episode: AReaL's vLLM server (the CPU config), AReaL's ``RemotevLLMEngine``, our policy endpoint
(same prompt, images and sampling as a rollout: ``gconfig``), the agent service and real desktops of the
embedded gym, through ``CUAAgentWorkflow``'s own episode code. Checkpoints are loaded with AReaL's
``/areal_update_weights`` (the route a disk weight update uses).

Instances: for every family task in ``sft.tasks``, ``n`` instances (``--seeds-per-task``) of each of its
family's held-out regimes (``curriculum.regimes``: for key-sequence, unseen instances of the trained key
sequences, unseen key sequences, and the unseen family key-sequence-long; for the others, unseen instances):
seeds no training group or demonstration ever draws (``curriculum.heldout_seeds``, the list the in-training
evaluator plays too), the same list for every checkpoint. An episode the
infrastructure dropped counts as a failure and is reported (``dropped``), and so does one whose model call
failed (``model_errors``).

Per checkpoint: success over every episode, per task, per regime, per slice (``curriculum.slices``: for the
sequence families each confused colour an instance shows, where the warm start's biased demonstrator presses
another key, and ``rest``; for the others ``slip``, an instance the demonstrator has a wrong solution for, and
``clean``), the mean policy turns per episode, and with ``--samples K`` (K sampled episodes per instance;
greedy decoding plays each instance once) pass@K: the share of instances solved at least once. ``outcomes``
lists every instance with its regime and content unit (the learning bench's cluster bootstrap). ``--greedy`` decodes greedily (AReaL's ``gconfig.greedy``: temperature 0)
instead of sampling as in training; ``--both`` does both, a JSON line each (sampled first).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from cua_rl.logs import setup_logging

if TYPE_CHECKING:
    from cua_rl.config import CUAConfig

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
    greedy: bool = False
    mean_turns: float = 0.0                         # policy turns per episode
    slices: dict[str, float] = field(default_factory=dict)   # curriculum.slices' names (module docstring)
    pass_at_k: float | None = None                  # with samples K > 1: instances solved at least once
    samples: int = 1
    # per held-out regime (curriculum.regimes): {"success", "episodes", "slices"}
    regimes: dict[str, dict] = field(default_factory=dict)
    # [task id, seed, successes of its K episodes, regime, content unit] per instance, sorted: the same list for
    # every checkpoint, so two checkpoints can be compared instance by instance (the learning bench's bootstrap)
    outcomes: list[list] = field(default_factory=list)
    # cua-eval --suite: the split played, per-task rates with Clopper-Pearson intervals and chance (suite_report)
    suite: dict | None = None


@dataclass
class Episode:
    task_id: str
    family: str | None              # the curriculum family; None for a gym's own task (no slices)
    seed: int
    success: bool
    turns: int
    regime: str = ""                # the held-out regime it was played in ("" on a gym's own tasks)


def _instance(family: str, seed: int):
    from cua_rl.local_gym.curriculum import make_instance

    return make_instance(family, seed)


def summarize(checkpoint: str, episodes: list[Episode], dropped: int, model_errors: int, seconds: float,
              greedy: bool, samples: int) -> CheckpointResult:
    """One checkpoint's figures from its episodes (module docstring)."""
    def rate(group: list[Episode]) -> float:
        return round(sum(e.success for e in group) / len(group), 4)

    from cua_rl.local_gym.curriculum import slices

    def sliced(group: list[Episode]) -> dict[str, float]:
        by_slice: dict[str, list[Episode]] = {}
        for e in group:
            for name in (slices(_instance(e.family, e.seed)) if e.family else ()):
                by_slice.setdefault(name, []).append(e)
        return {k: rate(g) for k, g in sorted(by_slice.items())}

    by_task: dict[str, list[Episode]] = {}
    by_regime: dict[str, list[Episode]] = {}
    by_instance: dict[tuple[str, int], list[Episode]] = {}
    for e in episodes:
        by_task.setdefault(e.task_id, []).append(e)
        if e.regime:
            by_regime.setdefault(e.regime, []).append(e)
        by_instance.setdefault((e.task_id, e.seed), []).append(e)
    solved = [any(e.success for e in group) for group in by_instance.values()]

    def outcome(task: str, seed: int, group: list[Episode]) -> list:
        content = _instance(group[0].family, seed).content if group[0].family else f"{task}:{seed}"
        return [task, seed, sum(e.success for e in group), group[0].regime, content]

    return CheckpointResult(
        checkpoint=checkpoint, success=rate(episodes), per_task={t: rate(g) for t, g in by_task.items()},
        episodes=len(episodes), dropped=dropped, model_errors=model_errors, seconds=round(seconds, 1),
        greedy=greedy, mean_turns=round(sum(e.turns for e in episodes) / len(episodes), 3),
        slices=sliced(episodes),
        pass_at_k=round(sum(solved) / len(solved), 4) if samples > 1 else None, samples=samples,
        regimes={name: {"success": rate(group), "episodes": len(group), "slices": sliced(group)}
                 for name, group in sorted(by_regime.items())},
        outcomes=[outcome(task, seed, group) for (task, seed), group in sorted(by_instance.items())])


def _row(task) -> dict:
    return {"task_id": task.task_id, "instruction": task.instruction, "name": task.name, "family": task.family}


def curriculum_plays(task_keys: list[str], n: int, only: tuple[str, ...] = ()) -> list[tuple[dict, list[int]]]:
    """(task row, held-out seeds) per held-out regime of each curriculum family task in ``task_keys`` (those
    named in ``only``, when given): ``n`` instances of each regime (``curriculum.regimes``), every row naming
    its ``regime``."""
    from cua_rl.local_gym import load_tasks
    from cua_rl.local_gym.curriculum import heldout_seeds, regimes

    tasks = load_tasks()
    by_family = {t.family: t for t in tasks.tasks if t.family}
    plays = []
    for key in task_keys:
        task = tasks.get(key)
        if task is None or task.family is None:
            raise SystemExit(f"held-out evaluation needs curriculum family tasks; {key!r} is not one")
        for regime in regimes(task.family):
            if only and regime.name not in only:
                continue
            plays.append(({**_row(by_family[regime.family]), "regime": regime.name},
                          heldout_seeds(n, split=regime.split)))
    return plays


async def _evaluate_loaded(workflow, endpoint, plays: list[tuple[dict, list[int]]], concurrency: int,
                           samples: int) -> tuple[list[Episode], int, int]:
    """Every (task row, seed) of ``plays`` ``samples`` times: (the episodes, how many were dropped, how many
    model errors)."""
    from cua_rl.workflow import Dropped, play_episode
    from cua_rl.workflow.placement import play_group

    gate = asyncio.Semaphore(concurrency)
    episodes: list[Episode] = []
    failed = {"dropped": 0, "model_errors": 0}

    async def one(row: dict, index: int, seed: int) -> None:
        async with gate:   # on one gym host, placed when there are several (a drained host's episode plays again)
            (outcome,), _ = await play_group(
                workflow.fleet(row), row.get("gym_base_url") or workflow.gym.base_url, 1,
                lambda url, _i, placement: play_episode(workflow.episode_setup, endpoint,
                                                        {**row, "gym_base_url": url}, index, seed=seed,
                                                        placement=placement))
        if isinstance(outcome, BaseException):
            raise outcome
        success, turns = False, 0
        if isinstance(outcome, Dropped):
            failed["dropped"] += 1
            logger.warning("%s seed %d: dropped (%s: %s); counted as a failure", row["task_id"], seed,
                           outcome.cause, outcome.reason)
        elif str(outcome.info.get("reason", "")).startswith("chat completion"):
            failed["model_errors"] += 1
            turns = len(outcome.turns)
            logger.warning("%s seed %d: the model call failed (%s); counted as a failure", row["task_id"], seed,
                           outcome.info["reason"])
        else:
            success, turns = bool(outcome.info.get("success")), len(outcome.turns)
        episodes.append(Episode(row["task_id"], row.get("family"), seed, success, turns, row.get("regime", "")))

    await asyncio.gather(*(one(row, i, seed) for row, seeds in plays for i, seed in enumerate(seeds)
                           for _ in range(samples)))
    return episodes, failed["dropped"], failed["model_errors"]


async def _evaluate_all(workflow, engine, model_url: str, checkpoints: list[str],
                        plays: list[tuple[dict, list[int]]], concurrency: int, samples: int,
                        decodings: tuple[str, ...], echo: bool = True) -> list[CheckpointResult]:
    """Every checkpoint in turn, in one event loop: the engine's and the endpoint's sessions are bound to the
    loop that first used them (a loop per checkpoint failed every later request with HTTP 500)."""
    from cua_rl.http.client import async_client

    endpoint = workflow.policy_endpoint(engine)
    sampling = endpoint.gconfig
    results = []
    async with async_client(timeout=300) as client:
        for checkpoint in checkpoints:
            # AReaL's disk weight update route: the served model becomes this checkpoint. The first one too,
            # though the server started with it, so every checkpoint is served the same way.
            r = await client.post(model_url + "/areal_update_weights", json={"model_path": str(checkpoint)})
            if r.status_code != 200:
                raise RuntimeError(f"vLLM could not load {checkpoint}: HTTP {r.status_code} {r.text[:300]}")
            for decoding in decodings:
                greedy = decoding == "greedy"
                endpoint.gconfig = sampling.new(greedy=greedy)   # no episode is in flight between passes
                results.append(await _one_pass(workflow, endpoint, checkpoint, plays, concurrency,
                                               1 if greedy else samples, greedy, echo))
    return results


async def _one_pass(workflow, endpoint, checkpoint, plays, concurrency, samples, greedy,
                    echo: bool = True) -> CheckpointResult:
    started = time.monotonic()
    episodes, dropped, model_errors = await _evaluate_loaded(workflow, endpoint, plays,
                                                             concurrency, samples)
    result = summarize(str(checkpoint), episodes, dropped, model_errors, time.monotonic() - started,
                       greedy, samples)
    logger.info("held-out success %.3f%s %s regimes %s slices %s, %.2f turns (%d episodes, %d dropped, %d model "
                "errors, %.0f s): %s", result.success, " (greedy)" if greedy else "", result.per_task,
                {k: v["success"] for k, v in result.regimes.items()}, result.slices, result.mean_turns, result.episodes, result.dropped, result.model_errors,
                result.seconds, checkpoint)
    if echo:
        print(json.dumps(result.__dict__), flush=True)
    return result


def evaluate_checkpoints(config: CUAConfig, checkpoints: list[str], *, seeds_per_task: int = 16, concurrency: int = 4,
                         samples: int = 1, decodings: tuple[str, ...] = ("sampled",),
                         log_dir: str | Path | None = None, prefix_caching: bool = False,
                         regimes: tuple[str, ...] = (), tasks: list[str] | None = None,
                         echo: bool = True) -> list[CheckpointResult]:
    """Held-out success of each checkpoint (see the module docstring), in the order given; each result is
    also printed as a JSON line as soon as it is known.

    ``prefix_caching``: every episode's prompt starts with the same system prompt and tool list (about 1,600
    of a one-turn prompt's 1,700 tokens), which vLLM then computes once per checkpoint instead of once per
    episode. Safe here, unlike in training: the weights change only between checkpoints, with no request in
    flight, and AReaL's weight-update route clears the cache. Off by default: with it on, the learning gate
    failed twice in a row on 2026-11-26 (docs/notes/learning-history.md) and its held-out scores had not been compared with
    it off on the same checkpoints beyond 2 x 64 episodes (on 0.78/0.81, off 0.72/0.75).

    ``tasks``: the family tasks to play (default ``sft.tasks``); ``echo=False`` prints no JSON line (the run's
    verdict keeps the console quiet)."""
    from cua_rl.local_agent.server import start_agent_server
    from cua_rl.local_gym.server import start_gym_server

    if not checkpoints:
        raise ValueError("no checkpoints to evaluate")
    tasks = list(config.sft.tasks) if tasks is None else tasks
    plays = curriculum_plays(tasks, seeds_per_task, regimes)
    if not plays:
        raise SystemExit(f"no held-out regime named {regimes} for the tasks {tasks}")
    with start_gym_server(gym_id="desktop", pool_size=concurrency, max_executions=concurrency) as gym, \
            start_agent_server() as agent:
        return _run(config, checkpoints, plays, gym=(gym.url, gym.gym_id),
                    agent_url=agent.url, concurrency=concurrency, samples=samples, decodings=decodings,
                    log_dir=log_dir, prefix_caching=prefix_caching, echo=echo)


def evaluate_on_gym(config: CUAConfig, checkpoints: list[str], *, split: str = "eval", episodes_per_task: int = 1,
                    concurrency: int = 4, samples: int = 1, decodings: tuple[str, ...] = ("sampled",),
                    model_url: str | None = None, log_dir: str | Path | None = None) -> list[CheckpointResult]:
    """``cua-eval``: each checkpoint on the tasks of ``config``'s task source on the gym at
    ``config.gym_base_url`` (module docstring)."""
    from cua_rl.local_agent.server import start_agent_server
    from cua_rl.workflow.seeding import heldout, seed_bits

    if not checkpoints:
        raise ValueError("no checkpoints to evaluate")
    rows = _gym_rows(config, split)
    logger.info("evaluating %d checkpoint(s) on %d task(s) of gym %s at %s (%s split), %d episode(s) each",
                len(checkpoints), len(rows), config.gym_id, config.gym_base_url, split, episodes_per_task * samples)
    with contextlib.ExitStack() as stack:
        agent_url = config.gbox_mini_agent_base_url
        if config.agent_service == "embedded":
            agent_url = stack.enter_context(start_agent_server()).url
        return _run(config, checkpoints, [(row, heldout(0, episodes_per_task, seed_bits(row))) for row in rows],
                    gym=(config.gym_base_url, config.gym_id), agent_url=agent_url, concurrency=concurrency,
                    samples=samples, decodings=decodings, log_dir=log_dir, model_url=model_url)


def suite_report(result: CheckpointResult, split: str, tasks: list[str]) -> dict:
    """``result``'s ``suite`` entry (module docstring): per task and over the split, successes of episodes with
    their Clopper-Pearson interval, and each task's chance baseline."""
    from cua_rl.local_gym.miniwob_suites import chance, describe
    from cua_rl.stats import rate_with_interval

    per_task = {}
    for task in tasks:
        mine = [o for o in result.outcomes if o[0] == task]
        successes, n = sum(o[2] for o in mine), len(mine) * result.samples
        per_task[task] = {**rate_with_interval(successes, n), "chance": chance(task)}
    total = sum(v["successes"] for v in per_task.values()), sum(v["n"] for v in per_task.values())
    return {"suite": "miniwob", "split": split, "about": describe(split), "decoding": "greedy" if result.greedy
            else "sampled", "overall": rate_with_interval(*total), "per_task": per_task}


def suite_rows(config: CUAConfig, split: str) -> tuple[list[str], list[dict]]:
    """The split's task names and their task rows on the gym at ``config.gym_base_url`` (which must serve them)."""
    from cua_rl.dataset import aload_tasks, task_row
    from cua_rl.local_gym.miniwob_suites import split_tasks

    served = {t.id: t for t in asyncio.run(aload_tasks(config))}
    names = split_tasks(split, sorted(served))
    return names, [task_row(served[name], config.gym_base_url, config.gym_id) for name in names]


def evaluate_on_suite(config: CUAConfig, checkpoints: list[str], split: str, *, episodes_per_task: int = 4,
                      concurrency: int = 4, samples: int = 1, decodings: tuple[str, ...] = ("sampled",),
                      model_url: str | None = None, log_dir: str | Path | None = None) -> list[CheckpointResult]:
    """``cua-eval --suite miniwob:SPLIT``: each checkpoint on the split's tasks (module docstring), on the gym at
    ``config.gym_base_url`` or on our MiniWoB++ gym started for the evaluation."""
    from cua_rl.local_agent.server import start_agent_server
    from cua_rl.local_gym.curriculum import heldout_seeds

    if not checkpoints:
        raise ValueError("no checkpoints to evaluate")
    with contextlib.ExitStack() as stack:
        if not config.gym_base_url:
            from cua_rl.local_gym.server import start_gym_server

            gym = stack.enter_context(start_gym_server(gym_id="miniwob", pool_size=concurrency,
                                                       max_executions=concurrency))
            config.gym_base_url, config.gym_id = gym.url, gym.gym_id
        names, rows = suite_rows(config, split)
        logger.info("evaluating %d checkpoint(s) on miniwob:%s (%d tasks) at %s, %d episode(s) each", len(checkpoints),
                    split, len(rows), config.gym_base_url, episodes_per_task * samples)
        agent_url = config.gbox_mini_agent_base_url
        if config.agent_service == "embedded":
            agent_url = stack.enter_context(start_agent_server()).url
        results = _run(config, checkpoints, [(row, heldout_seeds(episodes_per_task)) for row in rows],
                       gym=(config.gym_base_url, config.gym_id), agent_url=agent_url, concurrency=concurrency,
                       samples=samples, decodings=decodings, log_dir=log_dir, model_url=model_url, echo=False)
    for result in results:
        result.suite = suite_report(result, split, names)
        logger.info("%s (%s): %s", result.suite["about"], result.suite["decoding"], result.checkpoint)
        for task, row in result.suite["per_task"].items():
            target = ((row["chance"] or {}).get("target") or {}).get("rate")
            logger.info("  %-24s %3d of %-3d %.3f [%.3f, %.3f]   chance (random target) %s", task, row["successes"],
                        row["n"], row["rate"], *row["cp95"], "not measured" if target is None else f"{target:.3f}")
        print(json.dumps(result.__dict__), flush=True)
    return results


def _gym_rows(config: CUAConfig, split: str) -> list[dict]:
    from cua_rl.dataset import aload_tasks, choose_splits, task_row

    if split not in ("eval", "train", "all"):
        raise SystemExit(f"--split must be eval, train or all, got {split!r}")
    tasks = asyncio.run(aload_tasks(config))
    train, evaluation = choose_splits(tasks, config)
    picked = {"eval": evaluation, "train": train, "all": train + evaluation}[split]
    if not picked:
        raise SystemExit(f"the {split} split of gym {config.gym_id!r} is empty ({len(tasks)} task(s); "
                         f"gym_eval_number_range={config.gym_eval_number_range!r}, "
                         f"gym_train_ratio={config.gym_train_ratio}): pick another --split or range")
    return [task_row(t, config.gym_base_url, config.gym_id) for t in picked]


def _run(config: CUAConfig, checkpoints: list[str], plays: list[tuple[dict, list[int]]], *, gym: tuple[str, str],
         agent_url: str, concurrency: int, samples: int, decodings, log_dir, prefix_caching: bool = False,
         model_url: str | None = None, echo: bool = True) -> list[CheckpointResult]:
    """The model (a vLLM server started for the first checkpoint, on a GPU or the CPU: ``eval_vllm_config``; or
    the one at ``model_url``), AReaL's engine on it, the workflow pointed at ``gym`` and ``agent_url``, and every
    checkpoint evaluated in turn."""
    from areal.api.cli_args import InferenceEngineConfig
    from areal.engine.vllm_remote import RemotevLLMEngine

    from cua_rl.local_model.vllm_server import VLLMServer
    from cua_rl.workflow import CUAAgentWorkflow, MonitorTarget, workflow_kwargs

    with contextlib.ExitStack() as stack:
        if model_url:
            url = model_url.rstrip("/")
        else:
            log_path = Path(log_dir) / "evaluate-vllm.log" if log_dir else None
            url = stack.enter_context(VLLMServer(checkpoints[0], log_path=log_path, prefix_caching=prefix_caching,
                                                 vllm_config=eval_vllm_config(config, checkpoints[0],
                                                                              prefix_caching))).url
        engine = RemotevLLMEngine(InferenceEngineConfig(backend="vllm:d1", max_concurrent_rollouts=concurrency,
                                                        request_timeout=300, setup_timeout=60))
        engine.initialize(addr=url.split("://", 1)[-1])
        try:
            # the run's own mapping (workflow_kwargs), pointed at this gym, agent and checkpoint; nothing is
            # reported to a monitor or counted in a run's logs, and rows are built the default way
            kwargs = workflow_kwargs(config, config.gconfig, 1, is_eval=True)
            kwargs.update(model=dataclasses.replace(kwargs["model"], path=checkpoints[0]),
                          gym=dataclasses.replace(kwargs["gym"], base_url=gym[0], gym_id=gym[1]),
                          agent=dataclasses.replace(kwargs["agent"], base_url=agent_url, poll_interval_s=0.25),
                          monitor=MonitorTarget.off(), trajectory=None, stats_dir="", seed=1)
            workflow = CUAAgentWorkflow(**kwargs)
            return asyncio.run(_evaluate_all(workflow, engine, url, checkpoints, plays, concurrency,
                                             samples, tuple(decodings), echo))
        finally:
            engine.destroy()


def _split_argv(argv: list[str]) -> tuple[list[str], dict[str, int], list[str]]:
    """(checkpoints, options, config args): ``--checkpoints A B ...`` up to the next option or key=value;
    ``--seeds-per-task N``, ``--concurrency N``, ``--samples K``, ``--greedy`` or ``--both``, ``--regimes A,B``;
    the rest is AReaL's ``--config FILE key=value ...``."""
    usage = ("usage: python -m cua_rl.evaluate --config CONFIG --checkpoints DIR [DIR ...] [--seeds-per-task N] "
             "[--concurrency N] [--samples K] [--greedy | --both] [--regimes A,B] [key=value ...]")
    if "--checkpoints" not in argv:
        if "--checkpoint" in argv:   # the gym mode's flag, without --gym
            raise SystemExit(f"--checkpoint is cua-eval's, with --gym URL --gym-id ID; the curriculum mode takes "
                             f"--checkpoints DIR [DIR ...]\n{usage}")
        raise SystemExit(usage)
    i = argv.index("--checkpoints")
    j = i + 1
    while j < len(argv) and not argv[j].startswith("--") and "=" not in argv[j]:
        j += 1
    checkpoints, rest = argv[i + 1:j], argv[:i] + argv[j:]
    options, config_args, k = {}, [], 0
    while k < len(rest):
        name = rest[k].removeprefix("--").replace("-", "_")
        if rest[k] in ("--greedy", "--both"):
            options["decodings"] = ("greedy",) if rest[k] == "--greedy" else ("sampled", "greedy")
            k += 1
        elif rest[k] == "--regimes":
            if k + 1 >= len(rest) or rest[k + 1].startswith("-"):
                raise SystemExit(f"--regimes needs regime names, e.g. instances,content\n{usage}")
            options["regimes"] = tuple(r for r in rest[k + 1].split(",") if r)
            k += 2
        elif rest[k] in ("--seeds-per-task", "--concurrency", "--samples"):
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


CURRICULUM_HELP = """\
the other mode, without --gym: the seeded curriculum's held-out instances (the learning bench's yardstick):
  python -m cua_rl.evaluate --config CONFIG --checkpoints DIR [DIR ...] [--seeds-per-task N] [--concurrency N]
      [--samples K] [--greedy | --both] [--regimes A,B] [key=value ...]
  --checkpoints (plural) takes the directories after it; --checkpoint (repeated) is this mode's, with --gym.
  docs/learning.md says what it prints."""


def eval_vllm_config(config: CUAConfig, checkpoint: str, prefix_caching: bool = False):
    """The vLLM config of the server ``cua-eval`` starts for ``checkpoint``: None (``VLLMServer``'s CPU server) for a
    CPU recipe (``cluster.n_gpus_per_node`` 0), else the recipe's own ``vllm`` section on one GPU
    (``gpu_vllm_config``): the server a training run's rollout uses, so a checkpoint is scored as it was sampled."""
    if not config.cluster.n_gpus_per_node:
        return None
    from cua_rl.local_model.vllm_server import gpu_vllm_config

    return gpu_vllm_config(config.vllm, checkpoint, prefix_caching=prefix_caching)


def _gym_parser():
    import argparse

    ap = argparse.ArgumentParser(prog="cua-eval", description="Held-out success of checkpoints on your gym "
                                 "(JSON per checkpoint). Other arguments are Hydra overrides of the config.",
                                 epilog=CURRICULUM_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gym", default="", help="gym server base URL (genv API); several: URL,URL,... or @FILE "
                    "(one URL a line), each episode placed on one host. Needed unless --suite (which starts our "
                    "MiniWoB++ gym when no --gym is given)")
    ap.add_argument("--gym-id", default="", help="the gym's id (with --suite: miniwob unless given)")
    ap.add_argument("--suite", default="", help="miniwob[:SPLIT]: a named MiniWoB++ task list instead of the gym's "
                    "own split (SPLIT: all, browsergym-train, browsergym-test, yardstick, yardstick-train, "
                    "yardstick-heldout); per-task Clopper-Pearson intervals and chance baselines in the JSON")
    ap.add_argument("--checkpoint", action="append", required=True, help="a model directory (repeatable)")
    ap.add_argument("--config", default="", help="recipe (default: config.yaml with a GPU, config.cpu.yaml without)")
    ap.add_argument("--split", default="eval", choices=("eval", "train", "all"),
                    help="the gym's own split (without --suite; a suite names its tasks itself)")
    ap.add_argument("--episodes-per-task", type=int, default=4, metavar="N",
                    help="instances of each task to play (seeds from the held-out list; default 4)")
    ap.add_argument("--samples", type=int, default=1, help="sampled episodes per instance (pass@K)")
    decoding = ap.add_mutually_exclusive_group()
    decoding.add_argument("--greedy", action="store_true", help="greedy decoding instead of sampling")
    decoding.add_argument("--both", action="store_true", help="sampled, then greedy")
    ap.add_argument("--gbox-mini-url", default=None, help="the agent service (default: the config's)")
    ap.add_argument("--agent", choices=("external", "embedded"), default=None,
                    help="embedded: start our agent service here")
    ap.add_argument("--model-url", default=None, help="a running AReaL vLLM server (default: start one for the first checkpoint: on a GPU with a GPU "
                    "recipe, the recipe's vllm section; else on the CPU)")
    ap.add_argument("--concurrency", type=int, default=4, metavar="N",
                    help="episodes played at once, each its own gym execution (default 4)")
    ap.add_argument("--out", default="", help="also write the results (a JSON list) here")
    return ap


def gym_main(argv: list[str]) -> int:
    """``cua-eval``: parse, load the config as the launcher does, evaluate, print and write the JSON."""
    from cua_rl.run.cli import hydra_str
    from cua_rl.run.launch import RECIPES, apply_process_defaults, has_gpu, load_config

    args, overrides = _gym_parser().parse_known_args(argv)
    if any(o.startswith("-") for o in overrides):
        _gym_parser().error(f"unknown option(s): {[o for o in overrides if o.startswith('-')]}")
    split = None
    if args.suite:
        from cua_rl.local_gym.miniwob_suites import SuiteError, parse_suite

        try:
            _, split = parse_suite(args.suite)
        except SuiteError as e:
            _gym_parser().error(str(e))
        args.gym_id = args.gym_id or "miniwob"
    elif not args.gym or not args.gym_id:
        _gym_parser().error("--gym URL and --gym-id ID are required (or --suite miniwob[:SPLIT])")
    apply_process_defaults()
    setup_logging()
    config_file = args.config or str(RECIPES / ("config.yaml" if has_gpu() else "config.cpu.yaml"))
    overrides = [f"gym_base_url={hydra_str(args.gym)}", f"gym_id={hydra_str(args.gym_id)}", *overrides]
    if args.gbox_mini_url:
        overrides.append(f"gbox_mini_agent_base_url={args.gbox_mini_url}")
    if args.agent:
        overrides.append(f"agent_service={args.agent}")
    config = load_config(config_file, overrides)
    decodings = ("greedy",) if args.greedy else ("sampled", "greedy") if args.both else ("sampled",)
    if split is not None:
        results = evaluate_on_suite(config, args.checkpoint, split, episodes_per_task=args.episodes_per_task,
                                    concurrency=args.concurrency, samples=args.samples, decodings=decodings,
                                    model_url=args.model_url)
    else:
        results = evaluate_on_gym(config, args.checkpoint, split=args.split,
                                  episodes_per_task=args.episodes_per_task, concurrency=args.concurrency,
                                  samples=args.samples, decodings=decodings, model_url=args.model_url)
    if args.out:
        Path(args.out).write_text(json.dumps([r.__dict__ for r in results], indent=2))
    return 0


def main(argv: list[str] | None = None) -> int | None:
    """``python -m cua_rl.evaluate --config ... --checkpoints ...`` (the curriculum), or with ``--gym`` (and as
    ``cua-eval``) a gym's own tasks."""
    argv = sys.argv[1:] if argv is None else argv
    if "--gym" in argv or "--suite" in argv or "-h" in argv or "--help" in argv:
        return gym_main(argv)
    from areal.api.cli_args import load_expr_config

    from cua_rl.config import CUAConfig, hydra_overrides

    setup_logging()
    checkpoints, options, config_args = _split_argv(argv)
    config, _ = load_expr_config(hydra_overrides(config_args), CUAConfig)
    evaluate_checkpoints(config, checkpoints, **options)
    return 0


if __name__ == "__main__":
    sys.exit(main())
