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

The warm start's held-out score is kept (``<CUA_RL_HOME>/heldout-scores/<key>.json``), as the warm start
itself is kept: the key hashes everything that decides that score (the warm start's files, the evaluation's own code,
``SCORE_SOURCES``, the recipe's YAML files, the overrides, the instance count and concurrency), so any change
to them measures it again; ``--fresh-baseline`` always does.

The learning yardstick (``--recipe multiturn``, docs/learning.md "The yardstick"): held-out greedy success in the
three regimes of the family (``curriculum.regimes``: unseen instances of the trained key sequences, unseen key
sequences, the unseen family key-sequence-long), each rise with a cluster-bootstrap interval over content units
(``cluster_rise``: repeats of one key sequence are not independent) and, with two or more seeds, a t-interval
across seeds. ``--variant NAME=OVERRIDES`` runs every seed once more with those overrides, and
``method_comparison`` sets two methods side by side: held-out success per regime, the difference with its
interval across seeds, and the environment steps, desktop-seconds and trained tokens each used.

THE BAR (decided on 2026-11-29, before any run of the yardstick's task; a changed task or bar means rerunning
every seed; never moved after seeing results). One run passes the learning gate when, against its warm start,
greedy decoding, on the fixed held-out instances of the two gated regimes ("instances" and "content"):
  1. in each gated regime the greedy rise is at least ``RISE_MIN`` (0.10) with its cluster-bootstrap 95% interval
     above 0;
  2. on the two gated regimes together, each biased slice (each confused colour, ``curriculum.CONFUSIONS``:
     yellow since 2026-11-29's task change, yellow and cyan before) gains at least
     ``SLICE_GAIN`` (0.25) greedy success; the warm start must be wrong there (each slice at most
     ``SLICE_BEFORE_MAX``, 0.4, a precondition of the warm start, not of the run);
  3. on the two gated regimes together, the rest (instances showing no confused colour) falls at most
     ``REST_DROP`` (0.15);
  4. sanity, not statistics: sampled success does not collapse (``COLLAPSE``) and vLLM loaded every step's
     weights in order.
The gate statistic for calibration (issue: the controls' normal fit) is the smallest biased slice's gain, the
condition a run with no signal must meet by chance. Task change of 2026-11-29 (the bar unchanged): CI's run
of the gate left cyan at 0.0 -> 0.0 while yellow rose 0.0 -> 0.48, and the warm start never pressed c on cyan
in 40 sampled episodes (yellow: 7 of 88), so no run could flip it; the task dropped that confusion, the warm
start was re-pinned and every seed reruns. Two more task changes followed, each after a calibration whose
controls passed (the bar unchanged; docs/learning.md): the lost demonstrator stops at the black screen instead
of flailing, and the demonstrator slips on 90% of the yellow instances instead of 70% (the warm start's sampled
probability of the right key on yellow was 0.35-0.5, a margin the controls' random-sign updates crossed). The
fourth (2026-11-30, the same warm start): training draws task 056, whose instances show yellow three times in four
(about 11 in 36 before), at a quarter of the step (lr 0.0125): about three times as many groups that can correct
the slip, each update smaller (a control's walk of random signs shrinks against GRPO's drift).

Usage: python bench/learning_bench.py [--recipe onestep|multiturn] [--config CFG] [--steps N]
       [--rl-seeds N] [--first-seed S] [--samples K] [--greedy-only] [--controls A,B] [--control-seeds N] [--mutations A,B|all] [--seeds-per-task N] [--eval-every K] [--eval-concurrency N] [--no-control] [--warm-start DIR]
       [--fresh-baseline] [--workdir DIR] [--out JSON]
       [--plot PNG]
       [key=value ...]   (Hydra overrides for every stage, e.g. actor.optimizer.lr=3e-4)
"""

from __future__ import annotations

import argparse
import functools
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

from cua_rl.local_gym.curriculum import GATED
from cua_rl.run.launch import load_config, wait_interruptibly  # the config as the launcher loads it; its wait
from cua_rl.runs import read_counts
from cua_rl.sft.warm_start import STAMP, ensure_warm_start
from cua_rl.trainer.health import STOP_MARK
from cua_rl.verdict import BOOTSTRAP, RISE_MIN, SCORE_SOURCES, cluster_rise, hash_sources, hash_weights  # noqa: F401 (the bar's)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "cua_agent"
# --recipe: the config each names, and how its checkpoints are decoded in evaluation
RECIPES = {"onestep": (EXAMPLE / "config.learn.yaml", ("sampled",)),
           "multiturn": (EXAMPLE / "config.multiturn.yaml", ("sampled", "greedy"))}
REUSE_RUNS = False                # --reuse-runs
# --recipe multiturn: the negative controls, each a GRPO run from the same warm start with one override
CONTROLS = {"shuffled_rewards": "trajectory.shuffle_rewards=true",          # which episode succeeded is lost
            "shuffled_screenshots": "trajectory.shuffle_screenshots=true"}  # which screen an action saw is lost
# --mutations: known defects switched on (cua_rl/trajectory/mutations.py says what each does), each a GRPO run
# from the same warm start that the learning gate must fail
MUTATIONS = {"negate_advantages": "trajectory.mutation=negate_advantages",   # pushed away from what succeeded
             # updates never reach vLLM: the test double of a vLLM worker that ignores them (as health_bench.py)
             "stale_weights": "vllm.worker_extension_cls=tests.doubles.stale_vllm.IgnoresWeightUpdates",
             "shift_loss_mask": "trajectory.mutation=shift_loss_mask",       # the loss mask one token late
             # issue 33 (a) and (b) back on together: with equal episode weights a batch mean of the advantages
             # is 0 and re-centring alone changes nothing (<= 5e-9), so (a) is only real with (b)
             "batch_recentring": "trajectory.mutation=batch_recentring trajectory.equal_episode_weight=false",
             "token_weighting": "trajectory.equal_episode_weight=false",     # issue 33 (b) back on
             # issue 59 item 2 undone: a quarter of the gym's actions fail as the gym's fault (the rate stated
             # before the run, 2026-11-29) and such episodes are trained as the policy's failures: a success
             # of 3 keys survives 0.42 of the time, so the reward mostly says what the gym did
             "gym_faults_as_policy": "trajectory.mutation=gym_faults_as_policy embedded.fault_rate=0.25"}

# The learning gate's bar (the docstring's THE BAR): CI's gate (tests/e2e/test_learning_gate.py) judges its
# one run with ``gate_failures``, and the bench judges every run with it, the controls and mutations included
# (they must fail). Decided 2026-11-29 before any run of the yardstick task (docs/learning.md "The yardstick").
# GATED (the regimes the gate judges: curriculum.GATED) and RISE_MIN (the greedy rise in each, with its cluster
# interval above 0: the run's verdict's, cua_rl/verdict.py) are imported above: one definition for both.
SLICE_GAIN = 0.25                  # gain of each confused slice over the gated regimes together
SLICE_BEFORE_MAX = 0.4             # the warm start must be wrong on each confused slice (precondition)
REST_DROP = 0.15                   # the rest may fall at most this much where the warm start was right
# How far the sampled rollouts' success may fall from the first third of the policy versions to the last (the
# one-turn recipe's collapse fell to about 0, docs/learning.md): a sanity check, not a statistic.
COLLAPSE = 0.3
BAR = {"decided": "2026-11-29, before any run of the yardstick task", "gated_regimes": list(GATED),
       "rise_min": RISE_MIN, "rise_interval": "cluster bootstrap 95% over content units, above 0",
       "slice_gain": SLICE_GAIN, "slice_before_max": SLICE_BEFORE_MAX, "rest_drop": REST_DROP, "collapse": COLLAPSE,
       "statistic": "the smaller gain of the biased slices (gate_statistic)"}


def _run(cmd: list[str], log: Path, env: dict[str, str]) -> float:
    """Run one stage to completion, output to ``log``; its wall time. A failed stage stops the bench."""
    print(f"[learning-bench] {' '.join(cmd[:6])} ... (log {log})", file=sys.stderr, flush=True)
    started = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            rc = wait_interruptibly(proc)   # a signal another thread took still reaches the handler within a second
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


def control_label(name: str, seed: int) -> str:
    """A control's run name (its trial and log directory): its own name for seed 1, ``<name>-s<seed>`` after."""
    return name if seed == 1 else f"{name}-s{seed}"


def label_seed(label: str) -> int:
    """The seed in a run name (``control_label``'s, or ``grpo-s<seed>``)."""
    return int(label.rsplit("-s", 1)[1]) if "-s" in label else 1


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
    """Where the warm start's held-out score is kept: ``<CUA_RL_HOME>/heldout-scores``, named by a hash of
    everything that decides it (see the module docstring; ``SCORE_SOURCES``). The warm start counts by its
    weights and files, not its path, so a pinned warm start (cua_rl/recipes/pinned/warm-starts) in every clone of the
    repository shares one score, and nothing is written into the repository."""
    from cua_rl import cua_rl_home

    h = hashlib.sha256()
    h.update(f"{extra}|{seeds_per_task}|{concurrency}".encode())
    hash_weights(h, warm)
    hash_sources(h)
    for f in sorted(Path(config).parent.glob("*.yaml")) + [Path(config)]:
        h.update(str(f.relative_to(ROOT) if f.is_relative_to(ROOT) else f).encode())
        h.update(f.read_bytes())
    return Path(cua_rl_home()) / "heldout-scores" / f"{h.hexdigest()[:16]}.json"


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


def welch(a: list[float], b: list[float]) -> list[float] | None:
    """The 95% interval of mean(b) - mean(a) across training seeds (Welch's t, its degrees of freedom rounded
    down to the table); None with fewer than two seeds on either side."""
    if len(a) < 2 or len(b) < 2:
        return None
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    va = sum((x - ma) ** 2 for x in a) / (len(a) - 1) / len(a)
    vb = sum((x - mb) ** 2 for x in b) / (len(b) - 1) / len(b)
    se = (va + vb) ** 0.5
    df = (va + vb) ** 2 / ((va ** 2 / (len(a) - 1) if va else 0) + (vb ** 2 / (len(b) - 1) if vb else 0)) \
        if va or vb else len(a) + len(b) - 2
    half = T95[max(0, min(int(df) - 1, len(T95) - 1))] * se
    return [round(mb - ma - half, 4), round(mb - ma + half, 4)]


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
    parser.add_argument("--first-seed", type=int, default=1,
                        help="multiturn: the GRPO runs' seeds start here (CI's one rerun of the gate: --first-seed 2)")
    parser.add_argument("--samples", type=int, default=None,
                        help="sampled episodes per held-out instance, for pass@K (multiturn default 4)")
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps (default: the config's)")
    parser.add_argument("--seeds-per-task", type=int, default=32,
                        help="held-out instances per regime of each family (curriculum.regimes)")
    parser.add_argument("--regimes", default="",
                        help="evaluate only these held-out regimes (comma-separated; default: every regime)")
    parser.add_argument("--eval-every", type=int, default=2, help="evaluate every K-th step's checkpoint")
    parser.add_argument("--no-control", action="store_true", help="skip the control runs")
    parser.add_argument("--controls", default=",".join(CONTROLS),
                        help=f"multiturn: which controls to run, comma-separated (of {', '.join(CONTROLS)})")
    parser.add_argument("--control-seeds", type=int, default=1,
                        help="multiturn: each control from the same warm start with seed=1..N (the rise of their "
                             "mean, with its interval, beside seed 1's own)")
    parser.add_argument("--first-control-seed", type=int, default=1,
                        help="multiturn: the controls' seeds start here (two benches sharing one --workdir, each "
                             "with its own seeds, --reuse-runs combining them afterwards)")
    parser.add_argument("--mutations", default="",
                        help=f"multiturn: known defects to switch on, one GRPO run each, comma-separated or all "
                             f"(of {', '.join(MUTATIONS)}); the gate must fail each")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=OVERRIDES",
                        help="multiturn: every GRPO seed once more from the same warm start with these Hydra "
                             "overrides (space-separated), judged beside the others, and compared with plain GRPO "
                             "(one variant) or with each other (the first two) in method_comparison (repeatable; "
                             "e.g. bench/async_bench.py's ofp0=rollout.max_head_offpolicyness=0)")
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
    only = ["--regimes", args.regimes] if getattr(args, "regimes", "") else []
    seconds = _run([sys.executable, "-m", "cua_rl.evaluate", "--config", config, "--seeds-per-task",
                    str(args.seeds_per_task), "--concurrency", str(args.eval_concurrency), "--samples", str(samples),
                    *mode, *only, "--checkpoints", *[str(p) for p in checkpoints], *extra], log, env)
    scores = [json.loads(line) for line in log.read_text().splitlines() if line.startswith('{"checkpoint"')]
    if len(scores) != len(checkpoints) * len(decodings):
        raise SystemExit(f"evaluate.py printed {len(scores)} results for {len(checkpoints)} checkpoints "
                         f"x {len(decodings)} decodings")
    return seconds, scores


def _multiturn(args, config: str, extra: list[str], work: Path, env: dict, warm: Path, sft: dict, steps: int,
               wall: dict, started: float, decodings: tuple[str, ...]) -> dict:
    """The multi-turn recipe and the learning yardstick: GRPO from one warm start with ``--rl-seeds`` seeds, the
    controls (``CONTROLS``, ``--control-seeds`` each), the mutations and the variants (every seed); the warm
    start and each run's last step evaluated greedy (and sampled unless ``--greedy-only``) on every held-out
    regime; per regime the greedy rise with its cluster interval; each run judged by the gate; each run's
    sampled success per policy version and what it used (``run_record``)."""
    rl_seeds = list(range(args.first_seed, args.first_seed + (3 if args.rl_seeds is None else args.rl_seeds)))
    samples = 1 if "sampled" not in decodings else (args.samples or 4)
    kept = baseline_file(warm, config, [*extra, f"decodings={decodings}", f"samples={samples}", f"regimes={args.regimes}"],
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
    overrides: dict[str, list[str]] = {}    # run label -> its own overrides (after --overrides)

    # each run judges itself when that is this bench's evaluation (greedy, the gated regimes), else not at all
    own_verdict = ([f"verdict.instances={args.seeds_per_task}", f"verdict.concurrency={args.eval_concurrency}"]
                   if decodings == ("greedy",) and tuple(r for r in args.regimes.split(",") if r) == GATED
                   else ["verdict.enabled=false"])

    run_steps: dict[str, int] = {}          # run label -> its steps: the bench's, or a variant's own total_train_steps

    def train(label: str, own: list[str]) -> None:
        n = int(next((o.split("=", 1)[1] for o in reversed(own) if o.startswith("total_train_steps=")), steps))
        given = [o for o in own if not o.startswith("total_train_steps=")]
        wall[label], ckpts = _rl(label, config, run_warm, n, work, env, [*extra, *given, *own_verdict])
        runs[label], overrides[label], run_steps[label] = ckpts[n], own, n

    for seed in rl_seeds:
        train(f"grpo-s{seed}", [f"seed={seed}"])
    control_labels: dict[str, list[str]] = {}   # control -> its runs' labels, seed 1 first
    for name in ([] if args.no_control else _picked("--controls", args.controls, CONTROLS)):
        for seed in range(args.first_control_seed, args.first_control_seed + args.control_seeds):
            label = control_label(name, seed)
            train(label, [f"seed={seed}", *CONTROLS[name].split()])
            control_labels.setdefault(name, []).append(label)
    stopped: dict[str, str] = {}   # mutation -> why its run ended early (a health check's stop, a crash)
    for name in _picked("--mutations", args.mutations, MUTATIONS):
        try:
            train(name, ["seed=1", *MUTATIONS[name].split()])
        except SystemExit as failed:
            stopped[name] = _why_stopped(work / f"{name}.log", failed)
            print(f"[learning-bench] {name}: the run ended early: {stopped[name]}", file=sys.stderr, flush=True)
    variants = _variants(args.variant)
    variant_seeds = rl_seeds or [1]   # --rl-seeds 0: the variants alone, at seed 1 (bench/async_bench.py)
    for name, given in variants.items():
        for seed in variant_seeds:
            train(f"{name}-s{seed}", [f"seed={seed}", *given])
    experiment = _experiment(config, extra)
    # a run that judged itself (its verdict: cua_rl/verdict.py) played these instances already, greedily
    judged_by_run = {label: v for label in runs if (v := run_verdict(work, experiment, label, runs[label], args,
                                                                     decodings))}
    baseline_from = "kept" if baseline is not None else "measured now"
    if baseline is None and judged_by_run and not args.fresh_baseline:
        baseline = [next(iter(judged_by_run.values()))["before"]]
        baseline_from = "the run's verdict"
        _keep(kept, {"scores": baseline})
    todo = ([] if baseline else [warm]) + [ckpt for label, ckpt in runs.items() if label not in judged_by_run]
    wall["evaluate"], scores = _evaluate(todo, config, extra, args, work, env, decodings, samples) if todo else (0.0, [])
    per = {}   # checkpoint label -> {"sampled": score, "greedy": score}
    labels = ([] if baseline else ["sft"]) + [label for label in runs if label not in judged_by_run]
    for i, label in enumerate(labels):
        per[label] = {d: scores[i * len(decodings) + j] for j, d in enumerate(decodings)}
    for label, v in judged_by_run.items():
        per[label] = {"greedy": v["after"]}
        scores.append(v["after"])
    if baseline:
        per["sft"] = dict(zip(decodings, baseline))
    else:   # measured now: kept for the next run with the same key
        _keep(kept, {"scores": [per["sft"][d] for d in decodings]})

    before = per["sft"]["greedy"]
    regimes = _regimes_of(before)

    @functools.lru_cache(maxsize=None)
    def judged(label: str) -> dict:
        """One run's figures per regime, its gate figures and its own records, with the gate's verdict."""
        if label in stopped:
            return {"stopped": stopped[label], "gate_failures": [f"the run ended early: {stopped[label]}"]}
        sampled, greedy = per[label].get("sampled"), per[label]["greedy"]
        gate = gate_figures(before, greedy)
        record = run_record(work, experiment, label, run_steps[label])
        own_lag = load_config(config, [*extra, *overrides[label]]).rollout.max_head_offpolicyness
        entry = {"greedy": greedy["success"],
                 "regimes": {r: {"greedy": greedy["regimes"][r]["success"],
                                 **cluster_rise(before["outcomes"], [greedy["outcomes"]], r)} for r in regimes},
                 "gate": gate, "success": sampled and sampled["success"],
                 f"pass_at_{samples}": sampled and sampled["pass_at_k"],
                 "turns": (sampled or greedy)["mean_turns"], **record}
        return {**entry, "gate_failures": gate_failures(gate, record, run_steps[label], own_lag)}

    def over_seeds(run_labels: list[str]) -> dict:
        """Per regime: greedy before and after (the mean over the runs), the rise with its cluster interval
        (the runs' mean per instance) and, with two or more runs, the t-interval across them; per slice of the
        gated regimes, before and after."""
        out = {}
        for r, info in regimes.items():
            rises = [cluster_rise(before["outcomes"], [per[label]["greedy"]["outcomes"]], r)["rise"]
                     for label in run_labels]
            pooled = cluster_rise(before["outcomes"], [per[label]["greedy"]["outcomes"] for label in run_labels], r)
            after = [per[label]["greedy"]["regimes"][r] for label in run_labels]
            out[r] = {**info, "greedy_before": before["regimes"][r]["success"],
                      "greedy_after": round(sum(a["success"] for a in after) / len(after), 4),
                      "rise": pooled["rise"], "rise_ci95": pooled["ci95"], "units": pooled["units"],
                      "instances": pooled["instances"],
                      "rise_ci95_across_seeds": across_seeds(rises) if len(rises) >= 2 else None,
                      "slices": {name: {"before": value,
                                        "after": round(sum(a["slices"].get(name, 0.0) for a in after) / len(after), 4)}
                                 for name, value in before["regimes"][r]["slices"].items()}}
        return out

    def controlled(name: str, control_runs: list[str]) -> dict:
        """A control's first run (seed 1 unless ``--first-control-seed``) as judged alone and, with
        ``--control-seeds`` > 1, every seed's figures and the regimes over its seeds."""
        entry = {"seed": label_seed(control_runs[0]), **judged(control_runs[0])}   # --first-control-seed 7: 7
        if len(control_runs) > 1:
            entry["seeds"] = [{"seed": label_seed(label), **judged(label)} for label in control_runs]
            entry["regimes_over_seeds"] = over_seeds(control_runs)
        return entry

    grpo = [label for label in runs if label.startswith("grpo")]
    methods = {"grpo": grpo, **{name: [f"{name}-s{seed}" for seed in variant_seeds] for name in variants}}
    result = {
        "recipe": "multiturn", "config": os.path.relpath(config, ROOT), "overrides": extra, "steps": steps,
        "decodings": list(decodings), "bar": BAR,
        "episodes_per_checkpoint": {d: per["sft"][d]["episodes"] for d in decodings},
        "greedy_before": before["success"],
        "greedy_after": round(sum(per[label]["greedy"]["success"] for label in grpo) / len(grpo), 4) if grpo else None,
        "regimes": over_seeds(grpo) if grpo else {},
        "warm_start": {"greedy": before["success"], "regimes": {r: before["regimes"][r] for r in regimes},
                       "precondition_failures": warm_start_failures(before)},
        "seeds": [{"seed": int(label.rsplit("s", 1)[1]), **judged(label)} for label in grpo],
        "controls": {name: controlled(name, labels) for name, labels in control_labels.items()},
        "mutations": {name: judged(name) for name in MUTATIONS if name in runs or name in stopped},
        "variants": {name: {"overrides": given, "seeds": [{"seed": seed, **judged(f"{name}-s{seed}")}
                                                           for seed in variant_seeds],
                            "regimes": over_seeds(methods[name])} for name, given in variants.items()},
        "sft": {k: sft.get(k) for k in ("checkpoint", "demonstrations", "wrong_demonstrations", "rows", "steps",
                                        "loss_before", "loss_after")},
        "baseline": {"kept": str(kept), "reused": baseline_from == "kept", "from": baseline_from},
        "judged_by_their_verdict": sorted(judged_by_run),
        "dropped_episodes": sum(r["dropped"] for r in scores),
        "model_errors": sum(r["model_errors"] for r in scores),
        "wall_s": {**wall, "total": round(time.monotonic() - started, 1)},
        "workdir": str(work),
    }
    if variants:
        a, b = ("grpo", next(iter(variants))) if len(variants) == 1 or not grpo else list(variants)[:2]
        result["method_comparison"] = method_comparison(a, methods[a], b, methods[b], per, before, regimes,
                                                        {label: judged(label)["use"] for label in methods[a] + methods[b]
                                                         if label not in stopped}, run_steps)
    png = Path(args.plot) if args.plot else work / "learning.png"
    plot_multiturn(result, png)
    return _report(result, png, args)


def _regimes_of(greedy: dict) -> dict[str, dict]:
    """{regime: {"what", "gated"}} of the warm start's evaluation (curriculum.regimes of the recipe's family)."""
    from cua_rl.local_gym import load_tasks
    from cua_rl.local_gym.curriculum import regimes

    families = {load_tasks().get(o[0]).family for o in greedy["outcomes"]}
    known = {r.name: {"what": r.what, "gated": r.gated} for f in families for r in regimes(f)}
    return {name: known.get(name, {"what": name, "gated": name in GATED}) for name in greedy["regimes"]}


def gate_figures(before: dict, after: dict) -> dict:
    """What the gate judges of one run (the docstring's THE BAR), from the warm start's and the run's greedy
    evaluations (evaluate.py results): each gated regime's rise with its cluster interval, and each slice's
    greedy success over the gated regimes together, before and after."""
    def pooled(result: dict) -> dict[str, list[int]]:
        """slice -> [successes, instances] over the gated regimes' instances."""
        out: dict[str, list[int]] = {}
        for o in result["outcomes"]:
            if len(o) > 3 and o[3] in GATED:
                for name in _slices(o[0], o[1]):
                    cell = out.setdefault(name, [0, 0])
                    cell[0] += o[2]
                    cell[1] += 1
        return out

    b, a = pooled(before), pooled(after)
    return {"rises": {r: cluster_rise(before["outcomes"], [after["outcomes"]], r) for r in GATED
                      if r in before["regimes"]},
            "slices": {name: {"before": round(b[name][0] / b[name][1], 4), "after": round(a[name][0] / a[name][1], 4),
                              "instances": b[name][1]} for name in sorted(b)}}


@functools.lru_cache(maxsize=None)
def _slices(task: str, seed: int) -> tuple[str, ...]:
    """The evaluation slices of one held-out instance (curriculum.slices)."""
    from cua_rl.local_gym import load_tasks
    from cua_rl.local_gym.curriculum import make_instance, slices

    return slices(make_instance(load_tasks().get(task).family, seed))


def warm_start_failures(before: dict) -> list[str]:
    """Why the warm start cannot carry the gate's slice condition (empty: it can): it must be wrong on every
    confused slice of the gated regimes (at most ``SLICE_BEFORE_MAX``), so a gain there is a flip, not a
    sharpening."""
    slices = gate_figures(before, before)["slices"]
    return [f"the warm start's {name} slice is {v['before']} (> {SLICE_BEFORE_MAX}): not wrong there"
            for name, v in slices.items() if name != "rest" and v["before"] > SLICE_BEFORE_MAX]


def method_comparison(a: str, a_runs: list[str], b: str, b_runs: list[str], per: dict, before: dict,
                      regimes: dict, use: dict, steps: dict[str, int]) -> dict:
    """Two methods side by side over their seeds: held-out greedy success per regime (its mean, and ``per_seed``:
    one value per run), ``b`` - ``a`` with its Welch interval across seeds, what each used per run (environment
    steps, desktop-seconds, trained tokens: ``run_record``'s ``use``, means; ``env_steps_per_run``: each run's
    environment steps, replayed actions counted; ``steps``: each run's training steps) and whether ``b`` met the
    target against ``a`` (``comparison_target``)."""
    def success(labels: list[str], r: str) -> list[float]:
        return [per[label]["greedy"]["regimes"][r]["success"] for label in labels]

    def mean(values: list[float]) -> float | None:
        return round(sum(values) / len(values), 4) if values else None

    out = {"a": a, "b": b, "seeds": {a: len(a_runs), b: len(b_runs)}, "regimes": {}}
    for r, info in regimes.items():
        sa, sb = success(a_runs, r), success(b_runs, r)
        out["regimes"][r] = {**info, "before": before["regimes"][r]["success"], a: mean(sa), b: mean(sb),
                             "difference": round(mean(sb) - mean(sa), 4), "ci95_across_seeds": welch(sa, sb),
                             "per_seed": {a: sa, b: sb}}
    for key in ("env_steps", "desktop_seconds", "trained_tokens"):
        out[key] = {m: mean([use[label][key] for label in labels if label in use])
                    for m, labels in ((a, a_runs), (b, b_runs))}
    out["env_steps_per_run"] = {m: [use[label]["env_steps"] for label in labels if label in use]
                                for m, labels in ((a, a_runs), (b, b_runs))}
    out["steps"] = {a: steps[a_runs[0]], b: steps[b_runs[0]]}
    out["target"] = comparison_target(a, b, out)
    return out


# Issue 65's target for a method ``b`` against plain GRPO ``a`` (decided 2026-11-30, before any tree run): ``b``
# reaches ``a``'s final held-out greedy success, its mean over seeds at least ``a``'s in every gated regime, with
# at most TARGET_ENV_SHARE of ``a``'s environment steps per run (replayed actions counted).
TARGET_ENV_SHARE = 0.6


def comparison_target(a: str, b: str, compared: dict) -> dict:
    """Whether ``b`` met the target against ``a`` (``TARGET_ENV_SHARE``), and why not when it did not."""
    env = compared["env_steps"]
    share = round(env[b] / env[a], 4) if env.get(a) and env.get(b) is not None else None
    why = []
    if share is None or share > TARGET_ENV_SHARE:
        why.append(f"{b} used {share} of {a}'s environment steps (> {TARGET_ENV_SHARE})")
    for r in GATED:
        got = compared["regimes"].get(r)
        if got is not None and got[b] < got[a]:
            why.append(f"{b}'s held-out greedy success in {r} {got[b]} < {a}'s {got[a]}")
    return {"env_steps_share": share, "at_most": TARGET_ENV_SHARE, "met": not why, "why_not": why}


def _variants(given: list[str]) -> dict[str, list[str]]:
    """``--variant NAME=OVERRIDES`` values (overrides separated by spaces): {name: [override, ...]}; a bad one
    stops the bench before any run."""
    out: dict[str, list[str]] = {}
    for item in given:
        name, _, overrides = item.partition("=")
        parts = overrides.split()
        if not name or not parts or any("=" not in o for o in parts) or name in out or name in CONTROLS \
                or name in MUTATIONS or name.startswith("grpo") or "-s" in name:
            raise SystemExit(f"--variant {item!r}: give NAME=KEY=VALUE[ KEY=VALUE ...] with a new name (not grpo*, "
                             f"a control's or a mutation's, no '-s')")
        out[name] = parts
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


def gate_failures(gate: dict, record: dict, steps: int, lag: int) -> list[str]:
    """Why the learning gate fails one run (empty: it passes; the docstring's THE BAR). ``gate``: its
    ``gate_figures`` (each gated regime's rise with its cluster interval, each slice before and after);
    ``record``: its ``run_record`` (sampled success per policy version, the weight versions vLLM loaded);
    ``lag``: the run's ``rollout.max_head_offpolicyness``."""
    failures = []
    for regime in GATED:
        rise = gate["rises"].get(regime)
        if rise is None:
            failures.append(f"regime {regime}: not evaluated")
        elif rise["rise"] < RISE_MIN or rise["ci95"][0] <= 0:
            failures.append(f"held-out greedy rise in regime {regime} {rise['rise']} (95% cluster interval "
                            f"{rise['ci95']} over {rise['units']} content units): not >= {RISE_MIN} with the "
                            f"interval above 0")
    slices = gate["slices"]
    confused = [name for name in slices if name != "rest"]
    if not confused:
        failures.append("no biased slice in the gated regimes")
    for name in confused:
        if slices[name]["after"] < slices[name]["before"] + SLICE_GAIN:
            failures.append(f"biased slice {name} {slices[name]['before']} -> {slices[name]['after']}: gained less "
                            f"than {SLICE_GAIN}")
    rest = slices.get("rest")
    if rest is not None and rest["after"] < rest["before"] - REST_DROP:
        failures.append(f"the rest {rest['before']} -> {rest['after']}: fell more than {REST_DROP} where the warm "
                        f"start was right")
    # The sampled policy must not collapse while its greedy choice flips: the sampled success of the last third
    # of the policy versions that trained (the run's monitor files each episode under the version that started
    # it) at most COLLAPSE below the first third's. The last ``lag`` versions may have started no episode: AReaL
    # fills a step's batch with episodes up to max_head_offpolicyness versions old, and what the last version
    # starts is cut off when the run ends. Every earlier version has episodes.
    success = record["rollout_success"]
    seen = [v for v in success if v is not None]
    third = len(seen) // 3
    if len(success) != steps or None in success[:steps - lag] or not third:
        failures.append(f"sampled success per policy version {success}: not {steps} versions with episodes "
                        f"(the last {lag} excepted)")
    elif (last := sum(seen[-third:]) / third) < (first := sum(seen[:third]) / third) - COLLAPSE:
        failures.append(f"sampled success fell from {first:.2f} (first third of the versions) to {last:.2f}")
    # every step's weights reached the model that served the next rollouts, in order (AReaL's disk update)
    if record["served_versions"][:steps - 1] != list(range(1, steps)):
        failures.append(f"vLLM loaded weight versions {record['served_versions']}, not 1..{steps - 1} in order")
    return failures


def gate_statistic(gate: dict) -> float | None:
    """The calibration's gate statistic of one run (the docstring's THE BAR): the smaller gain of the biased
    slices over the gated regimes; a run passes condition 2 only when it is at least ``SLICE_GAIN``."""
    gains = [v["after"] - v["before"] for name, v in gate["slices"].items() if name != "rest"]
    return round(min(gains), 4) if gains else None


def run_record(work: Path, experiment: str, label: str, steps: int) -> dict:
    """What one RL run's own records say: the sampled success of each policy version that trained (versions
    0 .. steps - 1, from the run's Training Monitor: every episode is filed under the version that started it,
    so each version's episodes count once; the trainer's ``rollout/*`` statistics count the episodes that
    finished during a step instead, and a step whose batch was read ahead has none), the weight versions
    vLLM loaded, in order (AReaL's disk update: one per step but the last), and what its training episodes
    used (the workflow's counts: environment steps, desktop-seconds, trained tokens)."""
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
    counts = read_counts(logs, "train")   # what the training episodes used (cua_rl.workflow.worker count_use)
    return {"rollout_success": [None if v is None else round(v, 3) for v in success],
            "served_versions": [int(v) for v in served],
            "use": {"env_steps": counts.get("env_steps"), "trained_tokens": counts.get("trained_tokens"),
                    "desktop_seconds": round(counts["desktop_ms"] / 1000, 1) if "desktop_ms" in counts else None,
                    "episodes": counts.get("episodes_evaluated")},
            "logs": str(logs)}


def run_verdict(work: Path, experiment: str, label: str, final: Path, args, decodings: tuple[str, ...]) -> dict | None:
    """The run's own verdict (``verdict.json``: cua_rl/verdict.py) when it played exactly what this bench would
    (greedy only, the gated regimes, ``--seeds-per-task`` instances, ``--eval-concurrency``, this final
    checkpoint), else None (then the bench evaluates the checkpoint itself)."""
    from cua_rl.run.summary import VERDICT

    logs = next((work / "fileroot" / "logs").glob(f"*/{experiment}/{label}"), None)
    path = logs / VERDICT if logs else None
    if decodings != ("greedy",) or path is None or not path.is_file():
        return None
    v = json.loads(path.read_text())
    wanted = tuple(r for r in args.regimes.split(",") if r) if args.regimes else None
    if (v.get("instances") != args.seeds_per_task or v.get("concurrency") != args.eval_concurrency
            or wanted != GATED or Path(v["after"]["checkpoint"]).resolve() != final.resolve()):
        return None
    return v


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
