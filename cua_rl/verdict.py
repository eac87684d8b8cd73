"""The run's verdict on learning: did the policy get better at held-out tasks it never trained on?

A run a person can follow ends by saying whether it learned. After a run that finished (its last step's
checkpoint written), the launcher runs ``python -m cua_rl.verdict --config FILE --start DIR [key=value ...]``
(the run's config and overrides; ``--start``: the policy the run started from), which plays the learning yardstick's gated regimes (``GATED``, docs/learning.md
"The yardstick": unseen instances of the trained key sequences, and unseen key sequences) greedily with the
policy the run started from (the SFT warm start, or ``actor.path``) and with its last step, through
``cua_rl.evaluate`` (the same held-out instances every time, the same stack as training), and prints per
regime the success before and after and the rise with its 95% cluster-bootstrap interval over content units
(``cluster_rise``: repeats of one key sequence are not independent). ``verdict.json`` in the run's log
directory keeps it (``print_verdict`` in cua_rl/run/summary.py prints it again in the summary; the learning
bench reads a run's evaluation from it instead of playing the same instances again).

When it applies: the embedded gym on a machine without GPUs (the CPU recipes), training on curriculum family tasks (``task_source.kind: ids``) that have
the gated regimes (the multi-turn recipe, train.sh's default on the CPU); elsewhere the summary says why there
is none (on your own gym: ``cua-eval``). ``verdict.enabled=false`` turns it off; ``verdict.instances`` held-out
instances per regime and ``verdict.concurrency`` episodes at once (64 and 16, the learning gate's, so a gate run's
verdict is the gate's evaluation; about 2 minutes a checkpoint on 2 idle cores, docs/learning.md).

The starting policy's score is kept (``<CUA_RL_HOME>/heldout-scores/verdict-<key>.json``) as its warm start is:
the key hashes what decides it (the starting weights' files, the evaluation's code, ``SCORE_SOURCES``, the
settings an episode reads: sampling, policy endpoint, agent, limits; the tasks, instances and concurrency),
so a second run from the same start evaluates only its own last step.

The verdict says what the numbers say, not the learning gate's whole bar (bench/learning_bench.py THE BAR:
also the biased slices and the rest); one run's rise is one draw, the calibration in docs/learning.md says
how often a run with no signal rises this much.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from cua_rl.local_gym.curriculum import GATED  # the regimes the learning gate and the verdict judge
from cua_rl.run.launch import verdict_tasks  # whether the verdict applies (the launcher asks it first)

if TYPE_CHECKING:
    from cua_rl.config import CUAConfig


logger = logging.getLogger("cua-verdict")

RISE_MIN = 0.10                    # the gate's rise per gated regime (with its interval above 0)
BOOTSTRAP = 2000                   # resamples of the content units for an interval
BIG_FILE = 64 << 20                # starting-weight files above this are keyed by name, size and mtime, not read

# What a checkpoint's held-out score depends on besides the checkpoint: the evaluation's own path (the episode,
# the endpoint, the agent, the gym that renders and scores, the clients, vLLM's configuration, the config's
# loading); not the trainer, the launcher, the monitor, the rows or SFT, whose edits would measure a kept
# score again (about 2 minutes a checkpoint) for nothing.
SCORE_SOURCES = ("evaluate.py", "config.py", "deploy.py", "workflow", "policy", "local_agent", "local_gym", "genv", "mini_agent",
                 "wire", "local_model", "http", "areal_ext/vllm_config.py")
PACKAGE = Path(__file__).resolve().parent
# The pinned warm starts' scores (scripts/pin_warm_starts.py --score), named by their keys: a run from a pinned
# warm start (cua_rl/sft/warm_start.py) plays only its last step, on a fresh machine too
PINNED_SCORES = PACKAGE / "recipes" / "pinned" / "heldout-scores"


def hash_sources(h) -> None:
    """Feed every file of ``SCORE_SOURCES`` (path and bytes) into the hash ``h``."""
    sources = [PACKAGE / rel for rel in SCORE_SOURCES]
    for f in sorted(f for path in sources for f in ([path] if path.is_file() else path.rglob("*"))
                    if f.is_file() and "__pycache__" not in f.parts):
        h.update(str(f.relative_to(PACKAGE)).encode())
        h.update(f.read_bytes())


def hash_weights(h, model: Path) -> None:
    """Feed a model directory's files (weights, config, processor, chat template) into ``h``; the warm start's
    own stamps are left out (its build stamp names paths and times that differ between copies of the same
    weights; a pin's stamp stays with the pin, not its copies)."""
    from cua_rl.sft.warm_start import PINNED, STAMP

    for f in sorted(p for p in model.iterdir() if p.is_file() and p.suffix in (".json", ".safetensors", ".jinja")
                    and p.name not in (STAMP, PINNED)):
        h.update(f.name.encode())
        st = f.stat()
        h.update(f"{st.st_size}:{st.st_mtime_ns}".encode() if st.st_size > BIG_FILE else f.read_bytes())


def cluster_rise(before: list[list], afters: list[list[list]], regime: str | None = None,
                 resamples: int = BOOTSTRAP, seed: int = 0) -> dict:
    """The rise of success from ``before`` to the mean of ``afters`` (one per RL seed) over the instances of
    ``regime`` (all when None), and its 95% interval from a cluster bootstrap over content units
    (evaluate.py's ``outcomes``: [task, seed, successes, regime, content unit]): whole content units are
    resampled, with all their instances, the same draw for every run. Repeats of one key sequence are not
    independent under greedy decoding, so resampling instances alone made the interval up to 2.3x too narrow."""
    import random

    keys = [tuple(o[:2]) for o in before]
    for after in afters:
        if [tuple(o[:2]) for o in after] != keys:
            raise ValueError("the checkpoints were evaluated on different instances")
    clusters: dict[str, list[float]] = {}
    for i, o in enumerate(before):
        if regime is None or (len(o) > 3 and o[3] == regime):
            unit = o[4] if len(o) > 4 else f"{o[0]}:{o[1]}"
            clusters.setdefault(unit, []).append(sum(a[i][2] for a in afters) / len(afters) - o[2])
    if not clusters:
        raise ValueError(f"no instance of regime {regime!r} was evaluated")
    units = list(clusters.values())
    n = sum(len(u) for u in units)
    rng = random.Random(seed)
    means = []
    for _ in range(resamples):
        drawn = [units[rng.randrange(len(units))] for _ in units]
        means.append(sum(sum(u) for u in drawn) / sum(len(u) for u in drawn))
    means.sort()
    return {"rise": round(sum(sum(u) for u in units) / n, 4),
            "ci95": [round(means[int(0.025 * resamples)], 4), round(means[int(0.975 * resamples) - 1], 4)],
            "units": len(units), "instances": n}


def _inputs(config: CUAConfig, tasks: list[str]) -> dict:
    """The settings a held-out episode reads (evaluate.py ``_run``), as JSON-able values."""
    def plain(value):
        return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value

    return {"gconfig": plain(config.gconfig), "policy": plain(config.policy), "agent": config.gbox_mini_agent_agent,
            "action_space": config.gbox_mini_agent_standard_action_space,
            "agent_extra": dict(config.gbox_mini_agent_extra),
            "limits": [config.max_turns, config.max_task_time_seconds, config.max_turn_time_seconds],
            "tasks": tasks, "regimes": list(GATED), "instances": config.verdict.instances,
            "concurrency": config.verdict.concurrency}


def kept_score(config: CUAConfig, tasks: list[str], start: Path) -> Path | None:
    """Where the starting policy's verdict score is kept, or None when ``start`` is not a model directory (the
    pinned warm starts' scores are also in the repository: ``PINNED_SCORES``, which ``judge`` reads too)."""
    from cua_rl import cua_rl_home

    if not start.is_dir():
        return None
    h = hashlib.sha256(json.dumps(_inputs(config, tasks), sort_keys=True, default=str).encode())
    hash_weights(h, start)
    hash_sources(h)
    return Path(cua_rl_home()) / "heldout-scores" / f"verdict-{h.hexdigest()[:16]}.json"


def found_score(kept: Path | None) -> Path | None:
    """The file holding the score kept under ``kept``'s key: this machine's, else the one pinned in the repository
    (``PINNED_SCORES``); None when neither exists."""
    if kept is None:
        return None
    return next((f for f in (kept, PINNED_SCORES / kept.name) if f.is_file()), None)


def _evaluate(config: CUAConfig, tasks: list[str], checkpoints: list[str], logs: Path) -> list[dict]:
    from cua_rl.evaluate import evaluate_checkpoints

    results = evaluate_checkpoints(config, checkpoints, seeds_per_task=config.verdict.instances,
                                   concurrency=config.verdict.concurrency, decodings=("greedy",), log_dir=logs,
                                   regimes=GATED, tasks=tasks, echo=False)
    return [r.__dict__ for r in results]


def judge(config: CUAConfig, start: Path, final: Path, logs: Path) -> dict:
    """Evaluate ``start`` (unless its score is kept) and ``final``, write ``verdict.json`` into ``logs`` and
    return it (``summary``, ``lines``, ``regimes``; ``before``/``after``: evaluate.py's results)."""
    from cua_rl.run.summary import VERDICT

    tasks, why_not = verdict_tasks(config)
    if why_not:
        raise ValueError(f"no verdict for this run: {why_not}")
    started = time.monotonic()
    kept = kept_score(config, tasks, start)
    found = found_score(kept)
    before = json.loads(found.read_text())["score"] if found is not None else None
    before_kept = before is not None
    scores = _evaluate(config, tasks, ([] if before else [str(start)]) + [str(final)], logs)
    if before is None:
        before = scores[0]
        if kept is not None:
            kept.parent.mkdir(parents=True, exist_ok=True)
            kept.write_text(json.dumps({"score": before, "start": str(start),
                                        "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")
    after = scores[-1]
    regimes = {}
    for name in GATED:
        rise = cluster_rise(before["outcomes"], [after["outcomes"]], name)
        regimes[name] = {"before": before["regimes"][name]["success"], "after": after["regimes"][name]["success"],
                         "rise": rise["rise"], "ci95": rise["ci95"], "units": rise["units"],
                         "instances": rise["instances"]}
    summary, lines = describe(regimes)
    source = "pinned in the repository" if found != kept else "kept from an earlier run"
    played = (f"the last step (the starting policy's score {source})" if before_kept else
              "the starting policy and the last step (the starting policy's score now kept for the next run)")
    lines.append(f"measured in {time.monotonic() - started:.0f} s: {played}; verdict.json in the log directory")
    verdict = {"summary": summary, "lines": lines, "regimes": regimes, "instances": config.verdict.instances,
               "concurrency": config.verdict.concurrency, "tasks": tasks, "greedy": True,
               "start_kept": before_kept,
               "seconds": round(time.monotonic() - started, 1), "before": before, "after": after}
    try:
        verdict["in_monitor"] = file_in_monitor(logs, verdict, config.trial_name)
    except Exception:  # noqa: BLE001 - the verdict stands without the monitor's copy; the log says why
        logger.exception("could not file the verdict in the run's Training Monitor")
        verdict["in_monitor"] = False
    (logs / VERDICT).write_text(json.dumps(verdict) + "\n")
    return verdict


def file_in_monitor(logs: Path, verdict: dict, trial: str) -> bool:
    """The verdict in the run's own Training Monitor store (the embedded monitor's ``monitor/monitor.db`` in the
    log directory, which ``cua-monitor serve --data-dir`` shows after the run; ``file_in_store``). False when
    the run had no embedded monitor."""
    from cua_rl.monitor.store import Store, sqlite_url

    db = logs / "monitor" / "monitor.db"
    if not db.is_file():
        return False
    store = Store.open(sqlite_url(db))
    try:
        return file_in_store(store, verdict, trial)
    finally:
        store.close()


def file_in_store(store, verdict: dict, trial: str) -> bool:
    """The verdict on the newest run named ``trial`` of a monitor ``store``: the starting policy as the run's
    baseline (step 0) and the last step as an evaluation at its policy version, each held-out instance a
    rollout (reward = success; regime and content unit in its summary), so the held-out chart shows both; the
    summary and lines on the run (the run page's verdict box). Filing it again changes nothing."""
    import re
    import uuid

    from cua_rl.monitor import views
    from cua_rl.monitor.ingest import parse_batch
    from cua_rl.monitor.records import eval_record, rollout_record

    version = int(re.search(r"globalstep(\d+)$", Path(verdict["after"]["checkpoint"]).name).group(1)) + 1
    run = next((r for r in views.trainings(store) if r.get("trial_name") == trial), None)
    if run is None:
        return False
    tid = run["id"]
    body: dict = {"training": {"training_id": tid, "verdict": {"summary": verdict["summary"],
                                                               "lines": verdict["lines"]}}}
    for result, step, baseline in ((verdict["before"], 0, True), (verdict["after"], version, False)):
        parent = eval_record(tid, step, baseline=baseline, model_path=result["checkpoint"], status="completed",
                             purpose="the run's verdict (cua_rl/verdict.py): held-out greedy")
        body.setdefault(parent.kind, []).append(parent.to_payload())
        link = "baseline_id" if baseline else "eval_id"
        for task, seed, successes, regime, unit in result["outcomes"]:
            rid = uuid.uuid5(uuid.NAMESPACE_URL, f"verdict/{tid}/{step}/{regime}/{task}/{seed}").hex
            body.setdefault("rollouts", []).append(rollout_record(
                rid, status="completed", source_type="baseline" if baseline else "eval", is_eval=True,
                model_path=result["checkpoint"], end_time=parent.fields["start_time"], reward=float(successes),
                task_success=bool(successes), validation_passed=bool(successes),
                summary_json=json.dumps({"task": task, "seed": seed, "regime": regime, "content": unit}),
                **{link: parent.client_id}).to_payload())
    store.ingest(run["project_id"], parse_batch(body))
    return True


def describe(regimes: dict[str, dict]) -> tuple[str, list[str]]:
    """The verdict's summary line and one line per regime."""
    rose = [n for n, r in regimes.items() if r["rise"] >= RISE_MIN and r["ci95"][0] > 0]
    fell = [n for n, r in regimes.items() if r["ci95"][1] < 0]
    if len(rose) == len(regimes):
        summary = (f"LEARNED: held-out greedy success rose by at least {RISE_MIN} in every gated regime, each "
                   f"interval above 0")
    elif fell:
        summary = f"WORSE: held-out greedy success fell in {', '.join(fell)} (interval below 0)"
    elif rose:
        summary = f"MIXED: a clear rise in {', '.join(rose)} only"
    else:
        summary = f"NO CLEAR LEARNING: no gated regime rose by {RISE_MIN} with its interval above 0"
    lines = [f"{name}: {r['before']:.3f} -> {r['after']:.3f}, rise {r['rise']:+.3f} (95% interval "
             f"[{r['ci95'][0]:+.3f}, {r['ci95'][1]:+.3f}] over {r['units']} content units, {r['instances']} "
             f"instances, greedy)" for name, r in regimes.items()]
    return summary, lines


def main(argv: list[str] | None = None) -> int:
    """``python -m cua_rl.verdict --config FILE --start DIR [key=value ...]``: the verdict of the run those
    overrides name (its ``trial_name``), written to ``verdict.json`` and printed (the launcher sends this output
to the run's verdict.log and prints the verdict in its summary); 0 also when it does not apply (the verdict
then says why)."""
    import argparse
    import sys

    from cua_rl.logs import setup_logging
    from cua_rl.run.launch import load_config
    from cua_rl.run.summary import VERDICT, final_checkpoint, print_verdict
    from cua_rl.runs import RunPaths

    parser = argparse.ArgumentParser(prog="python -m cua_rl.verdict", description=main.__doc__)
    parser.add_argument("--config", required=True)
    parser.add_argument("--start", required=True, help="the policy the run started from (a model directory)")
    args, overrides = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    setup_logging()
    config = load_config(args.config, overrides)
    paths = RunPaths.of(config)
    tasks, why_not = verdict_tasks(config)
    final = final_checkpoint(paths.checkpoints) if paths.checkpoints.is_dir() else None
    if why_not or final is None:
        why_not = why_not or "no checkpoint of the last step (saver.freq_steps)"
        logger.info("no verdict: %s", why_not)
        (paths.logs / VERDICT).write_text(json.dumps({"summary": f"none: {why_not}", "lines": []}) + "\n")
        return 0
    logger.info("playing %d held-out instances greedily with %s and %s", config.verdict.instances * len(GATED) *
                len(tasks), final, args.start)
    verdict = judge(config, Path(args.start), final, paths.logs)
    print_verdict(paths.logs)
    return 0 if verdict else 1


if __name__ == "__main__":
    raise SystemExit(main())
