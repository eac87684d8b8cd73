"""Does it learn? SFT warm start, GRPO from it, the same GRPO with shuffled rewards; held-out success of each.

Prints one JSON object and writes a PNG plot of the curves (``--recipe multiturn``: the multi-turn recipe's
figures, see ``_multiturn``). Every stage is the user's own command:
  1. the warm start ``train.sh`` builds when ``sft.warm_start`` is on (``python -m cua_rl.sft``: scripted
     demonstrations, AReaL's SFT engine), kept under ``<CUA_RL_HOME>/warm-starts`` and reused;
  2. ``train.sh --config CONFIG``: GRPO from that warm start (found by train.sh itself, as in a user's run;
     ``actor.path=<dir>`` with ``--warm-start DIR``) through the whole embedded stack (real desktops, agent
     service, policy endpoint, AReaL's vLLM server on the CPU, AReaL's trainer), one checkpoint per step;
  3. the same command with ``trajectory.shuffle_rewards=true``: the negative control (each group's rewards
     dealt to its episodes at random, so which episode succeeded is lost; it must not rise);
  4. ``python -m cua_rl.evaluate``: held-out success of the warm start and of the checkpoints (one
     served vLLM model loading each in turn; instances at seeds no training group draws; sampling as in
     training, ``gconfig``).

JSON: ``success_before`` (warm start), ``success_after`` (last RL step), ``rise``, ``curve`` (held-out
success per evaluated step, step 0 = warm start), ``control`` (its curve and final success), ``sft`` (loss
figures), ``baseline`` (where the warm start's score came from), ``wall_s`` per stage, and what was run.

The warm start's held-out score is kept beside it (``<warm start>/heldout/<key>.json``), as the warm start
itself is kept: the key hashes everything that decides that score (the warm start, every Python file of
``cua_rl``, the recipe's YAML files, the overrides, the instance count and concurrency), so any change to
them measures it again; ``--fresh-baseline`` always does.

Usage: python bench/learning_bench.py [--recipe onestep|multiturn] [--config CFG] [--steps N]
       [--rl-seeds N] [--samples K] [--greedy-only] [--controls A,B] [--control-seeds N] [--mutations A,B|all] [--seeds-per-task N] [--eval-every K] [--eval-concurrency N] [--no-control] [--warm-start DIR]
       [--fresh-baseline] [--workdir DIR] [--out JSON]
       [--plot PNG]
       [key=value ...]   (Hydra overrides for every stage, e.g. actor.optimizer.lr=3e-4)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cua_rl.trainer.health import STOP_MARK
from cua_rl.run.launch import load_config   # the config the stages will see, loaded as the launcher does
from cua_rl.sft.warm_start import STAMP, ensure_warm_start

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "cua_agent"
# --recipe: the config each names, and how its checkpoints are decoded in evaluation
RECIPES = {"onestep": (EXAMPLE / "config.learn.yaml", ("sampled",)),
           "multiturn": (EXAMPLE / "config.multiturn.yaml", ("sampled", "greedy"))}
REUSE_RUNS = False                # --reuse-runs
BOOTSTRAP = 2000                  # resamples of the held-out instances for rise_ci95
# --recipe multiturn: the negative controls, each a GRPO run from the same warm start with one override
CONTROLS = {"shuffled_rewards": "trajectory.shuffle_rewards=true",          # which episode succeeded is lost
            "shuffled_screenshots": "trajectory.shuffle_screenshots=true"}  # which screen an action saw is lost
# --mutations: known defects switched on (cua_rl/trajectory/mutations.py says what each does), each a GRPO run
# from the same warm start that the learning gate must fail
MUTATIONS = {"negate_advantages": "trajectory.mutation=negate_advantages",   # pushed away from what succeeded
             # updates never reach vLLM: the test double of a vLLM worker that ignores them (as health_bench.py)
             "stale_weights": "vllm.worker_extension_cls=tests.doubles.stale_vllm.IgnoresWeightUpdates",
             "shift_loss_mask": "trajectory.mutation=shift_loss_mask",       # the loss mask one token late
             "batch_recentring": "trajectory.mutation=batch_recentring",     # issue 33 (a) back on
             "token_weighting": "trajectory.equal_episode_weight=false"}     # issue 33 (b) back on

# The learning gate's bar: CI's gate (tests/training/test_learning_gate.py) judges its one run with
# ``gate_failures``, and the bench judges every run with it, the controls and mutations included (they must
# fail). A rise of held-out greedy success of at least MARGIN with its paired interval above 0. From the warm
# start of one machine (yellow 0.16) 12 steps gave +0.34 and +0.35 (yellow 0.95); from another's (yellow 0.035)
# GRPO is slower and varies more: +0.36, +0.33 and +0.12 at step 16 (yellow 0.82, 0.77, 0.28; the interval of
# the last [0.06, 0.18]), +0.09 at step 12. The shuffled-rewards and shuffled-screenshots controls went -0.05
# and -0.07 (interval [-0.12, -0.03]), yellow to 0.00 (docs/learning.md). The gate asks for a rise that is
# real and a gain on the slice where the warm start is wrong, not for how fast a run gets there.
MARGIN = 0.1
# the yellow slice: the warm start is wrong there (greedy 0.16, 0.035 and 0.21 measured, three machines: the SFT
# is not bit-reproducible across machines; the bound was 0.2 until the third, whose GRPO run then flipped the slice
# 0.21 -> 0.96 with every other bar met), and must gain. SLIP_BEFORE is the warm start's, not the run's: wrong on
# at least 70% of the slice, so a gain of SLIP_GAIN there is a flip, not a sharpening.
SLIP_BEFORE, SLIP_GAIN = 0.3, 0.2
# How far the sampled rollouts' success may fall from the first third of the policy versions to the last: the
# one-turn recipe's collapse fell to about 0 (docs/learning.md); from the more biased warm start one 16-step run
# fell 0.72 -> 0.49 (one version at 0.25) while its greedy success still rose 0.56 -> 0.68.
COLLAPSE = 0.3
# How far greedy success may fall on the rest (the instances the warm start already solves: 0.986): GRPO runs
# kept 0.92-1.00 there; the loss mask shifted by one token flipped the yellow slice too but fell to 0.70, which
# the rise and the slice alone did not catch (added after that mutation run, session 9).
CLEAN_SLIP = 0.15


def _run(cmd: list[str], log: Path, env: dict[str, str]) -> float:
    """Run one stage to completion, output to ``log``; its wall time. A failed stage stops the bench."""
    print(f"[learning-bench] {' '.join(cmd[:6])} ... (log {log})", file=sys.stderr, flush=True)
    started = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            rc = proc.wait()
        except BaseException:  # Ctrl-C or SIGTERM (see main): stop the stage, which ends its own servers
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise
    if rc != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"stage failed (exit {rc}): {' '.join(cmd)}\n--- {log} (tail) ---\n{tail}")
    return round(time.monotonic() - started, 1)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


STEP_DIR = re.compile(r"globalstep(\d+)$")


def step_checkpoints(checkpoints: Path) -> dict[int, Path]:
    """{global step (1-based): HF checkpoint dir} of one run (AReaL's Saver names them ...globalstepN)."""
    found = {}
    for config in checkpoints.rglob("config.json"):
        m = STEP_DIR.search(config.parent.name)
        if m:
            found[int(m.group(1)) + 1] = config.parent
    return dict(sorted(found.items()))


def _rl(label: str, config: str, warm: Path | None, steps: int, work: Path, env: dict,
        extra: list[str]) -> tuple[float, dict]:
    """One RL run: the user's command. ``warm``: a warm start given with ``--warm-start``; None = the one
    train.sh finds (or builds) itself from the config, as a user's run does."""
    start = [f"actor.path={warm}", "sft.warm_start=false"] if warm is not None else []
    cmd = ["bash", str(EXAMPLE / "train.sh"), "--config", config, *start,
           f"total_train_steps={steps}", f"trial_name={label}", "existing_run=overwrite", *extra]
    user = os.environ.get("USER") or __import__("getpass").getuser()
    where = work / "fileroot" / "checkpoints" / user / _experiment(config, extra) / label
    done = re.search(r"training finished in (\d+) s", (work / f"{label}.log").read_text(errors="replace")) \
        if REUSE_RUNS and (work / f"{label}.log").is_file() else None
    if done and len(step_checkpoints(where)) >= steps:
        print(f"[learning-bench] {label}: reusing the finished run in {where}", file=sys.stderr, flush=True)
        seconds = float(done.group(1))
    else:
        seconds = _run(cmd, work / f"{label}.log", env)
    ckpts = step_checkpoints(where)
    if len(ckpts) < steps:
        raise SystemExit(f"{label}: {len(ckpts)} step checkpoints written, {steps} expected")
    return seconds, ckpts


def baseline_file(warm: Path, config: str, extra: list[str], seeds_per_task: int, concurrency: int) -> Path:
    """Where the warm start's held-out score is kept: under the warm start, named by a hash of everything
    that decides it (see the module docstring)."""
    h = hashlib.sha256()
    h.update(f"{warm.resolve()}|{extra}|{seeds_per_task}|{concurrency}".encode())
    files = sorted((ROOT / "cua_rl").rglob("*.py")) + sorted(Path(config).parent.glob("*.yaml")) + [Path(config)]
    for f in files:
        h.update(str(f.relative_to(ROOT) if f.is_relative_to(ROOT) else f).encode())
        h.update(f.read_bytes())
    return warm / "heldout" / f"{h.hexdigest()[:16]}.json"


def _experiment(config: str, extra: list[str]) -> str:
    return load_config(config, extra).experiment_name


def paired_rise(before: list[list], afters: list[list[list]], resamples: int = BOOTSTRAP,
                seed: int = 0) -> dict:
    """The rise of success from ``before`` to the mean of ``afters`` (one per RL seed), instance by instance
    (evaluate.py's ``outcomes``: [task, seed, successes] in the same order for every checkpoint), and its
    paired bootstrap 95% interval: the instances are resampled, the same draw for every run."""
    import random

    keys = [tuple(o[:2]) for o in before]
    for after in afters:
        if [tuple(o[:2]) for o in after] != keys:
            raise ValueError("the checkpoints were evaluated on different instances")
    diffs = [sum(after[i][2] for after in afters) / len(afters) - before[i][2] for i in range(len(keys))]
    rng = random.Random(seed)
    means = sorted(sum(diffs[rng.randrange(len(diffs))] for _ in diffs) / len(diffs) for _ in range(resamples))
    return {"rise": round(sum(diffs) / len(diffs), 4),
            "ci95": [round(means[int(0.025 * resamples)], 4), round(means[int(0.975 * resamples) - 1], 4)]}


# Student's t, two-sided 95%, for 1..9 degrees of freedom
T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262)


def across_seeds(rises: list[float]) -> list[float]:
    """The 95% t-interval of the mean rise over training seeds: the spread from training itself (each seed's
    random walk), which the paired bootstrap over held-out instances does not see."""
    n = len(rises)
    mean = sum(rises) / n
    sd = (sum((r - mean) ** 2 for r in rises) / (n - 1)) ** 0.5
    half = T95[min(n - 2, len(T95) - 1)] * sd / n ** 0.5
    return [round(mean - half, 4), round(mean + half, 4)]


def eval_steps(steps: int, every: int) -> list[int]:
    """Steps whose checkpoint is evaluated: every ``every``-th and always the last."""
    picked = [s for s in range(every, steps + 1, every)]
    return picked if picked and picked[-1] == steps else [*picked, steps]


def plot(result: dict, path: Path) -> None:
    """Held-out success per step, RL and control, as a PNG (Pillow only: no plotting dependency)."""
    from PIL import Image, ImageDraw

    w, h, left, right, top, bottom = 720, 420, 70, 20, 40, 60
    img = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(img)
    steps = max(p["step"] for p in result["curve"]) or 1
    ymax = max(0.5, min(1.0, max(p["success"] for c in (result["curve"], result["control"]["curve"]) for p in c) + 0.1))

    def xy(step: float, s: float) -> tuple[float, float]:
        return (left + (w - left - right) * step / steps, h - bottom - (h - top - bottom) * s / ymax)

    d.rectangle([left, top, w - right, h - bottom], outline="black")
    for i in range(6):
        s = ymax * i / 5
        x0, y0 = xy(0, s)
        d.line([x0 - 4, y0, x0, y0], fill="black")
        d.text((8, y0 - 6), f"{s:.2f}", fill="black")
    for p in result["curve"]:
        x0, y0 = xy(p["step"], 0)
        d.line([x0, y0, x0, y0 + 4], fill="black")
        d.text((x0 - 4, y0 + 8), str(p["step"]), fill="black")
    d.text((w // 2 - 60, h - 28), "GRPO step (0 = SFT warm start)", fill="black")
    d.text((left, 12), f"held-out success ({result['episodes_per_checkpoint']} episodes per point)", fill="black")
    for curve, colour, name, row in ((result["curve"], (200, 30, 30), "GRPO", 0),
                                     (result["control"]["curve"], (90, 90, 90), "shuffled rewards (control)", 1)):
        pts = [xy(p["step"], p["success"]) for p in curve]
        if len(pts) > 1:
            d.line(pts, fill=colour, width=3)
        for x0, y0 in pts:
            d.ellipse([x0 - 4, y0 - 4, x0 + 4, y0 + 4], fill=colour)
        d.line([w - 250, top + 14 + 16 * row, w - 225, top + 14 + 16 * row], fill=colour, width=3)
        d.text((w - 220, top + 8 + 16 * row), name, fill="black")
    img.save(path)


def plot_multiturn(result: dict, path: Path) -> None:
    """The multi-turn bench as a PNG (Pillow only): each run's sampled success per policy version (lines), and held-out
    greedy success of the warm start (step 0) and of each run's last step (dots at the right edge)."""
    from PIL import Image, ImageDraw

    w, h, left, right, top, bottom = 760, 440, 60, 230, 40, 60
    img = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(img)
    steps = result["steps"]

    def xy(step: float, s: float) -> tuple[float, float]:
        return (left + (w - left - right) * step / steps, h - bottom - (h - top - bottom) * s)

    d.rectangle([left, top, w - right, h - bottom], outline="black")
    for i in range(6):
        x0, y0 = xy(0, i / 5)
        d.line([x0 - 4, y0, x0, y0], fill="black")
        d.text((20, y0 - 6), f"{i / 5:.1f}", fill="black")
    for step in range(0, steps + 1, max(1, steps // 6)):
        x0, y0 = xy(step, 0)
        d.line([x0, y0, x0, y0 + 4], fill="black")
        d.text((x0 - 4, y0 + 8), str(step), fill="black")
    d.text((left, h - 28), "GRPO step: lines = sampled success of the policy before each step; dots = held-out "
                           "greedy success (step 0 = warm start)", fill="black")
    d.text((left, 12), f"multi-turn recipe ({result['episodes_per_checkpoint']['greedy']} held-out instances)",
           fill="black")
    runs = [(f"GRPO seed {r['seed']}", r, (200, 30 + 60 * i, 30)) for i, r in enumerate(result["seeds"])]
    runs += [(name.replace("_", " ") + " (control)", r, colour) for (name, r), colour in
             zip(result["controls"].items(), ((90, 90, 90), (40, 90, 200)))]
    x0, y0 = xy(0, result["greedy_before"])
    d.ellipse([x0 - 5, y0 - 5, x0 + 5, y0 + 5], fill="black")
    for row, (name, run, colour) in enumerate(runs):
        pts = [xy(i + 1, v) for i, v in enumerate(run.get("rollout_success", [])) if v is not None]
        if len(pts) > 1:
            d.line(pts, fill=colour, width=2)
        x1, y1 = xy(steps, run["greedy"])
        d.ellipse([x1 - 5, y1 - 5, x1 + 5, y1 + 5], fill=colour)
        d.line([w - right + 15, top + 10 + 16 * row, w - right + 40, top + 10 + 16 * row], fill=colour, width=3)
        d.text((w - right + 45, top + 4 + 16 * row), f"{name}: {run['greedy']:.2f}", fill="black")
    d.text((w - right + 15, top + 12 + 16 * len(runs)), f"warm start: {result['greedy_before']:.2f}", fill="black")
    img.save(path)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="onestep",
                        help="onestep: config.learn.yaml (key-colour, one turn); multiturn: config.multiturn.yaml "
                             "(key-sequence: 3 decisions, reward at the end), evaluated sampled and greedy")
    parser.add_argument("--config", default="", help="a recipe file of your own (default: the recipe's)")
    parser.add_argument("--rl-seeds", type=int, default=None,
                        help="GRPO runs from the same warm start, seed=1..N (multiturn default 3, onestep 1; "
                             "multiturn 0: controls and mutations only)")
    parser.add_argument("--samples", type=int, default=None,
                        help="sampled episodes per held-out instance, for pass@K (multiturn default 4)")
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps (default: the config's)")
    parser.add_argument("--seeds-per-task", type=int, default=32, help="held-out instances per family")
    parser.add_argument("--eval-every", type=int, default=2, help="evaluate every K-th step's checkpoint")
    parser.add_argument("--no-control", action="store_true", help="skip the control runs")
    parser.add_argument("--controls", default=",".join(CONTROLS),
                        help=f"multiturn: which controls to run, comma-separated (of {', '.join(CONTROLS)})")
    parser.add_argument("--control-seeds", type=int, default=1,
                        help="multiturn: each control from the same warm start with seed=1..N (the rise of their "
                             "mean, with its interval, beside seed 1's own)")
    parser.add_argument("--mutations", default="",
                        help=f"multiturn: known defects to switch on, one GRPO run each, comma-separated or all "
                             f"(of {', '.join(MUTATIONS)}); the gate must fail each")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=OVERRIDE",
                        help="multiturn: one more GRPO run (seed 1) from the same warm start with one Hydra override "
                             "of its own, judged beside the others (repeatable; e.g. bench/async_bench.py's "
                             "ofp0=rollout.max_head_offpolicyness=0)")
    parser.add_argument("--eval-concurrency", type=int, default=16,
                        help="held-out episodes at once (one-turn episodes mostly wait; on 2 cores 48 episodes "
                             "took 34.0 s at 8, 31.4 s at 16)")
    parser.add_argument("--greedy-only", action="store_true",
                        help="multiturn: evaluate greedy decoding only, before and after (CI's learning gate)")
    parser.add_argument("--warm-start", default="", help="an SFT checkpoint to start from (skips stage 1)")
    parser.add_argument("--fresh-baseline", action="store_true",
                        help="evaluate the warm start again even when its score under the same key is kept")
    parser.add_argument("--baseline-only", action="store_true",
                        help="only measure (or show the kept) held-out score of the warm start, and keep it")
    parser.add_argument("--workdir", default="", help="where runs and logs go (default: a new temp dir)")
    parser.add_argument("--reuse-runs", action="store_true",
                        help="a run of the same name that finished in --workdir is kept, not run again (a bench "
                             "cut short goes on where it stopped)")
    parser.add_argument("--out", default="", help="also write the JSON here")
    parser.add_argument("--plot", default="", help="PNG of the curves (default: <workdir>/learning.png)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every stage")
    args = parser.parse_args(argv)
    global REUSE_RUNS
    REUSE_RUNS = args.reuse_runs
    # SIGTERM ends the bench like Ctrl-C, so the running stage is stopped rather than left training.
    signal.signal(signal.SIGTERM, _interrupt)
    recipe_config, decodings = RECIPES[args.recipe]
    config = str(Path(args.config or recipe_config).resolve())
    work = Path(args.workdir or tempfile.mkdtemp(prefix="learning-bench-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    os.environ["CUA_RL_FILEROOT"] = str(work / "fileroot")   # loading the config here writes under it too
    env = {**os.environ, "CUA_RL_DEVICE": "cpu"}
    env.pop("GYM_BASE_URL", None)
    extra = list(args.overrides)
    steps = args.steps or _config_steps(config, extra)
    wall: dict[str, float] = {}
    started = time.monotonic()

    if args.warm_start:
        warm, sft = Path(args.warm_start).resolve(), {"checkpoint": args.warm_start}
        if not (warm / "config.json").is_file():
            raise SystemExit(f"--warm-start {warm}: not an HF checkpoint (no config.json)")
    else:   # the warm start train.sh itself uses (sft.warm_start): built once, kept, keyed by its inputs
        t0 = time.monotonic()
        warm = ensure_warm_start(load_config(config, extra), config, extra, work / "sft.log", env)
        wall["sft"] = round(time.monotonic() - t0, 1)
        sft = json.loads((warm / STAMP).read_text())["result"]
    if args.recipe == "multiturn":
        decodings = ("greedy",) if args.greedy_only else decodings
        return _multiturn(args, config, extra, work, env, warm, sft, steps, wall, started, decodings)
    if args.baseline_only:
        return _baseline_only(warm, config, extra, args, work, env)
    run_warm = warm if args.warm_start else None   # else train.sh finds the same warm start itself
    wall["rl"], rl = _rl("grpo", config, run_warm, steps, work, env, extra)
    control = {}
    if not args.no_control:
        wall["control"], control = _rl("control", config, run_warm, steps, work, env,
                                       [*extra, "trajectory.shuffle_rewards=true"])

    picked = eval_steps(steps, args.eval_every)
    kept = baseline_file(warm, config, extra, args.seeds_per_task, args.eval_concurrency)
    baseline = None if args.fresh_baseline or not kept.is_file() else json.loads(kept.read_text())
    order = ([] if baseline else [("sft", 0, warm)]) + [("grpo", s, rl[s]) for s in picked] + \
            ([("control", s, control[s]) for s in picked] if control else [])
    wall["evaluate"], scores = _evaluate([p for _, _, p in order], config, extra, args, work, env)
    if baseline:
        order, scores = [("sft", 0, warm), *order], [baseline, *scores]
    else:   # measured now: kept for the next run with the same key
        _keep(kept, scores[0])

    def curve(label: str) -> list[dict]:
        return [{"step": s, "success": r["success"], "per_task": r["per_task"]}
                for (lab, s, _), r in zip(order, scores) if lab in (label, "sft")]

    result = {
        "config": os.path.relpath(config, ROOT), "overrides": extra, "steps": steps,
        "episodes_per_checkpoint": scores[0]["episodes"],
        "success_before": scores[0]["success"],
        "success_after": curve("grpo")[-1]["success"],
        "curve": curve("grpo"),
        "control": ({"success_after": curve("control")[-1]["success"], "curve": curve("control")} if control
                    else {"success_after": None, "curve": []}),
        "sft": {k: sft.get(k) for k in ("checkpoint", "demonstrations", "rows", "steps", "loss_before", "loss_after")},
        "baseline": {"kept": str(kept), "reused": baseline is not None,
                     "measured": (baseline or {}).get("measured", "in this run")},
        "dropped_episodes": sum(r["dropped"] for r in scores),
        "model_errors": sum(r["model_errors"] for r in scores),
        "wall_s": {**wall, "total": round(time.monotonic() - started, 1)},
        "workdir": str(work),
    }
    result["rise"] = round(result["success_after"] - result["success_before"], 4)
    if control:
        result["control"]["rise"] = round(result["control"]["success_after"] - result["success_before"], 4)
    png = Path(args.plot) if args.plot else work / "learning.png"
    plot(result, png)
    return _report(result, png, args)


def _report(result: dict, png: Path, args) -> dict:
    """The bench's output: the JSON on stdout (and in ``--out``), with where the plot went."""
    result["plot"] = str(png)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return result


def _evaluate(checkpoints: list[Path], config: str, extra: list[str], args, work: Path,
              env: dict, decodings: tuple[str, ...] = ("sampled",), samples: int = 1) -> tuple[float, list[dict]]:
    """``python -m cua_rl.evaluate`` on ``checkpoints`` in order: (its wall time, one result per checkpoint and
    decoding, in that order)."""
    mode = {("sampled",): [], ("greedy",): ["--greedy"], ("sampled", "greedy"): ["--both"]}[tuple(decodings)]
    log = work / f"evaluate-{len(list(work.glob('evaluate*.log')))}.log"
    seconds = _run([sys.executable, "-m", "cua_rl.evaluate", "--config", config, "--seeds-per-task",
                    str(args.seeds_per_task), "--concurrency", str(args.eval_concurrency), "--samples", str(samples),
                    *mode, "--checkpoints", *[str(p) for p in checkpoints], *extra], log, env)
    scores = [json.loads(line) for line in log.read_text().splitlines() if line.startswith('{"checkpoint"')]
    if len(scores) != len(checkpoints) * len(decodings):
        raise SystemExit(f"evaluate.py printed {len(scores)} results for {len(checkpoints)} checkpoints "
                         f"x {len(decodings)} decodings")
    return seconds, scores


def _multiturn(args, config: str, extra: list[str], work: Path, env: dict, warm: Path, sft: dict, steps: int,
               wall: dict, started: float, decodings: tuple[str, ...]) -> dict:
    """The multi-turn recipe (issue 33's bench): GRPO from one warm start with ``--rl-seeds`` seeds and the
    two controls (``CONTROLS``); the warm start and each run's last step evaluated sampled (``--samples`` per
    instance: success, pass@K, turns) and greedy (``--greedy-only``: greedy alone, CI's gate); the greedy
    rise with its paired bootstrap interval; each run's sampled success per policy version (``run_record``)."""
    rl_seeds = list(range(1, (3 if args.rl_seeds is None else args.rl_seeds) + 1))
    samples = 1 if "sampled" not in decodings else (args.samples or 4)
    kept = baseline_file(warm, config, [*extra, f"decodings={decodings}", f"samples={samples}"],
                         args.seeds_per_task, args.eval_concurrency)
    baseline = None if args.fresh_baseline or not kept.is_file() else json.loads(kept.read_text())["scores"]
    if args.baseline_only:
        if baseline is None:
            wall["evaluate"], baseline = _evaluate([warm], config, extra, args, work, env, decodings, samples)
            _keep(kept, {"scores": baseline})
        result = {"baseline": dict(zip(decodings, baseline)), "kept": str(kept)}
        print(json.dumps(result, indent=2))
        return result
    run_warm = warm if args.warm_start else None
    runs: dict[str, Path] = {}
    for seed in rl_seeds:
        label = f"grpo-s{seed}"
        wall[label], ckpts = _rl(label, config, run_warm, steps, work, env, [*extra, f"seed={seed}"])
        runs[label] = ckpts[steps]
    control_labels: dict[str, list[str]] = {}   # control -> its runs' labels, seed 1 first
    for name in ([] if args.no_control else _picked("--controls", args.controls, CONTROLS)):
        for seed in range(1, args.control_seeds + 1):
            label = name if seed == 1 else f"{name}-s{seed}"
            wall[label], ckpts = _rl(label, config, run_warm, steps, work, env,
                                     [*extra, f"seed={seed}", CONTROLS[name]])
            runs[label] = ckpts[steps]
            control_labels.setdefault(name, []).append(label)
    stopped: dict[str, str] = {}   # mutation -> why its run ended early (a health check's stop, a crash)
    for name in _picked("--mutations", args.mutations, MUTATIONS):
        try:
            wall[name], ckpts = _rl(name, config, run_warm, steps, work, env, [*extra, "seed=1", MUTATIONS[name]])
            runs[name] = ckpts[steps]
        except SystemExit as failed:
            stopped[name] = _why_stopped(work / f"{name}.log", failed)
            print(f"[learning-bench] {name}: the run ended early: {stopped[name]}", file=sys.stderr, flush=True)
    variants = _variants(args.variant)
    for name, override in variants.items():
        wall[name], ckpts = _rl(name, config, run_warm, steps, work, env, [*extra, "seed=1", override])
        runs[name] = ckpts[steps]
    todo = ([] if baseline else [warm]) + list(runs.values())
    wall["evaluate"], scores = _evaluate(todo, config, extra, args, work, env, decodings, samples)
    per = {}   # checkpoint label -> {"sampled": score, "greedy": score}
    labels = ([] if baseline else ["sft"]) + list(runs)
    for i, label in enumerate(labels):
        per[label] = {d: scores[i * len(decodings) + j] for j, d in enumerate(decodings)}
    if baseline:
        per["sft"] = dict(zip(decodings, baseline))
    else:   # measured now: kept for the next run with the same key
        _keep(kept, {"scores": [per["sft"][d] for d in decodings]})

    def figures(label: str) -> dict:
        sampled, greedy = per[label].get("sampled"), per[label]["greedy"]
        return {"success": sampled and sampled["success"], f"pass_at_{samples}": sampled and sampled["pass_at_k"],
                "greedy": greedy["success"], "greedy_slip": greedy["slices"].get("slip"),
                "greedy_clean": greedy["slices"].get("clean"), "turns": (sampled or greedy)["mean_turns"]}

    def mean(key: str) -> float | None:
        values = [figures(label)[key] for label in grpo]
        return None if None in values or not values else round(sum(values) / len(values), 4)

    def rise(labels: list[str]) -> dict:
        return paired_rise(per["sft"]["greedy"]["outcomes"], [per[label]["greedy"]["outcomes"] for label in labels])

    grpo = [label for label in runs if label.startswith("grpo")]
    before = figures("sft")
    experiment = _experiment(config, extra)
    lag = load_config(config, extra).rollout.max_head_offpolicyness

    def judged(label: str, overrides: tuple[str, ...] = ()) -> dict:
        """One run's figures, its paired rise and its own records, with the learning gate's verdict."""
        if label in stopped:
            return {"stopped": stopped[label], "gate_failures": [f"the run ended early: {stopped[label]}"]}
        entry = {**figures(label), "greedy_rise": rise([label]), **run_record(work, experiment, label, steps)}
        own_lag = load_config(config, [*extra, *overrides]).rollout.max_head_offpolicyness if overrides else lag
        return {**entry, "gate_failures": gate_failures(before, entry, steps, own_lag)}

    def controlled(name: str, labels: list[str]) -> dict:
        """A control's seed-1 run as judged alone and, with ``--control-seeds`` > 1, every seed's figures and
        the rise of their mean with its paired interval: one run's interval covers the held-out instances
        drawn, not where another training seed's random walk would have gone."""
        entry = judged(labels[0])
        if len(labels) > 1:
            entry["seeds"] = [{"seed": i + 1, "greedy": figures(label)["greedy"],
                               "greedy_slip": figures(label)["greedy_slip"], "greedy_rise": rise([label])}
                              for i, label in enumerate(labels)]
            entry["greedy_over_seeds"] = round(sum(s["greedy"] for s in entry["seeds"]) / len(labels), 4)
            entry["greedy_rise_over_seeds"] = rise(labels)
            entry["greedy_rise_over_seeds"]["t95_across_seeds"] = across_seeds([s["greedy_rise"]["rise"]
                                                                                for s in entry["seeds"]])
        return entry

    result = {
        "recipe": "multiturn", "config": os.path.relpath(config, ROOT), "overrides": extra, "steps": steps,
        "decodings": list(decodings),
        "episodes_per_checkpoint": {d: per["sft"][d]["episodes"] for d in decodings},
        "success_before": before["success"], "success_after": mean("success"),
        "greedy_before": before["greedy"], "greedy_after": mean("greedy"),
        "slip_greedy_before": before["greedy_slip"], "slip_greedy_after": mean("greedy_slip"),
        "clean_greedy_before": before["greedy_clean"], "clean_greedy_after": mean("greedy_clean"),
        f"pass_at_{samples}": {"before": before[f"pass_at_{samples}"], "after": mean(f"pass_at_{samples}")},
        "turns_per_episode": {"before": before["turns"], "after": mean("turns")},
        "rise_ci95": rise(grpo)["ci95"] if grpo else None,
        "seeds": [{"seed": int(label.rsplit("s", 1)[1]), **judged(label)} for label in grpo],
        "controls": {name: controlled(name, labels) for name, labels in control_labels.items()},
        "mutations": {name: judged(name) for name in MUTATIONS if name in per or name in stopped},
        "variants": {name: {"override": override, **judged(name, (override,))} for name, override in variants.items()},
        "sft": {k: sft.get(k) for k in ("checkpoint", "demonstrations", "wrong_demonstrations", "rows", "steps",
                                        "loss_before", "loss_after")},
        "baseline": {"kept": str(kept), "reused": baseline is not None},
        "dropped_episodes": sum(r["dropped"] for r in scores),
        "model_errors": sum(r["model_errors"] for r in scores),
        "wall_s": {**wall, "total": round(time.monotonic() - started, 1)},
        "workdir": str(work),
    }
    result["greedy_rise"] = round(result["greedy_after"] - result["greedy_before"], 4) if grpo else None
    png = Path(args.plot) if args.plot else work / "learning.png"
    plot_multiturn(result, png)
    return _report(result, png, args)


def _variants(given: list[str]) -> dict[str, str]:
    """``--variant NAME=OVERRIDE`` values: {name: override}; a bad one stops the bench before any run."""
    out: dict[str, str] = {}
    for item in given:
        name, _, override = item.partition("=")
        if not name or "=" not in override or name in out or name in CONTROLS or name in MUTATIONS \
                or name.startswith("grpo"):
            raise SystemExit(f"--variant {item!r}: give NAME=KEY=VALUE with a new name (not grpo*, a control's "
                             f"or a mutation's)")
        out[name] = override
    return out


def _picked(flag: str, names: str, known: dict) -> list[str]:
    picked = list(known) if names == "all" else [n for n in names.split(",") if n]
    if unknown := [n for n in picked if n not in known]:
        raise SystemExit(f"{flag}: unknown {unknown}; known: {', '.join(known)} (or all)")
    return picked


def _why_stopped(log: Path, failed: SystemExit) -> str:
    """A run that ended early, in one line: the health check's stop (STOP_MARK) when one stopped it."""
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    marked = [line for line in lines if STOP_MARK in line]
    return (marked[-1].split(STOP_MARK, 1)[1].strip(" :") if marked else str(failed).splitlines()[0])[:400]


def gate_failures(before: dict, run: dict, steps: int, lag: int) -> list[str]:
    """Why the learning gate fails one run (empty: it passes). ``before``: the warm start's figures
    (``greedy``, ``greedy_slip``, ``greedy_clean``); ``run``: the run's figures (``greedy_slip``, ``greedy_clean``), its ``greedy_rise`` (paired,
    with its interval) and its ``run_record``. ``lag``: the recipe's ``rollout.max_head_offpolicyness``."""
    failures = []
    rise = run["greedy_rise"]
    if rise["rise"] < MARGIN or rise["ci95"][0] <= 0:
        failures.append(f"held-out greedy rise {rise['rise']} (95% interval {rise['ci95']}): not >= {MARGIN} "
                        f"with the interval above 0")
    if run["greedy_slip"] < before["greedy_slip"] + SLIP_GAIN:
        failures.append(f"biased slice {before['greedy_slip']} -> {run['greedy_slip']}: gained less than {SLIP_GAIN}")
    clean_before, clean_after = before.get("greedy_clean"), run.get("greedy_clean")
    if clean_before is not None and clean_after is not None and clean_after < clean_before - CLEAN_SLIP:
        failures.append(f"the rest {clean_before} -> {clean_after}: fell more than {CLEAN_SLIP} where the warm "
                        f"start was right")
    # The sampled policy must not collapse while its greedy choice flips: the sampled success of the last third
    # of the policy versions that trained (16 episodes each, temperature 1; the run's monitor files each episode
    # under the version that started it) at most COLLAPSE below the first third's. The last ``lag`` versions
    # may have started no episode: AReaL fills a step's batch with episodes up to max_head_offpolicyness
    # versions old, and what the last version starts is cut off when the run ends (one CI run: versions 0-10
    # had 16 episodes or more, version 11 none). Every earlier version has episodes.
    success = run["rollout_success"]
    seen = [v for v in success if v is not None]
    third = len(seen) // 3
    if len(success) != steps or None in success[:steps - lag] or not third:
        failures.append(f"sampled success per policy version {success}: not {steps} versions with episodes "
                        f"(the last {lag} excepted)")
    elif (last := sum(seen[-third:]) / third) < (first := sum(seen[:third]) / third) - COLLAPSE:
        failures.append(f"sampled success fell from {first:.2f} (first third of the versions) to {last:.2f}")
    # every step's weights reached the model that served the next rollouts, in order (AReaL's disk update)
    if run["served_versions"][:steps - 1] != list(range(1, steps)):
        failures.append(f"vLLM loaded weight versions {run['served_versions']}, not 1..{steps - 1} in order")
    return failures


def run_record(work: Path, experiment: str, label: str, steps: int) -> dict:
    """What one RL run's own records say: the sampled success of each policy version that trained (versions
    0 .. steps - 1, from the run's Training Monitor: every episode is filed under the version that started it,
    so each version's episodes count once; the trainer's ``rollout/*`` statistics count the episodes that
    finished during a step instead, and a step whose batch was read ahead has none) and the weight versions
    vLLM loaded, in order (AReaL's disk update: one per step but the last)."""
    from cua_rl.monitor import views
    from cua_rl.monitor.store import Store, sqlite_url

    logs = next((work / "fileroot" / "logs").glob(f"*/{experiment}/{label}"))
    store = Store.open(sqlite_url(logs / "monitor" / "monitor.db"))
    try:
        [run] = views.trainings(store)
        by_version = {s["step"]: views.groups(store, "steps", s["id"])["summary"]["success_rate"]
                      for s in views.training(store, run["id"])["steps"]}
    finally:
        store.close()
    rollout_log = (logs / "rollout.log").read_text(errors="replace")
    success = [by_version.get(v) for v in range(steps)]
    served = re.findall(r"loaded weights from \S*weight_update_v(\d+)", rollout_log)
    return {"rollout_success": [None if v is None else round(v, 3) for v in success],
            "served_versions": [int(v) for v in served],
            "logs": str(logs)}


def _keep(kept: Path, score: dict) -> None:
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_text(json.dumps({**score, "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")


def _baseline_only(warm: Path, config: str, extra: list[str], args, work: Path, env: dict) -> dict:
    kept = baseline_file(warm, config, extra, args.seeds_per_task, args.eval_concurrency)
    if args.fresh_baseline or not kept.is_file():
        _, [score] = _evaluate([warm], config, extra, args, work, env)
        _keep(kept, score)
    result = {"baseline": json.loads(kept.read_text()), "kept": str(kept)}
    print(json.dumps(result, indent=2))
    return result


def _config_steps(config: str, extra: list[str]) -> int:
    cfg = load_config(config, extra)
    if not cfg.total_train_steps:
        raise SystemExit("the config sets no total_train_steps; pass --steps")
    return int(cfg.total_train_steps)


if __name__ == "__main__":
    main()
