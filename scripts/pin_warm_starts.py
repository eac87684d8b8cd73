"""Build the SFT warm starts the tests train from and pin them into the repository (tests/data/warm-starts).

Why pinned: a warm start is built once per machine (about 8 minutes on 2 cores) and its SFT arithmetic is not
bit-identical across CPUs, so on a fresh machine every CI run built two before its first training test, and
the learning gate's calibration (docs/learning.md, "The yardstick") holds for one warm start, not for
whatever each machine builds. The tiny model's warm start is 2.4 MB, so the tests and the calibration use one
pinned copy of each recipe's: ``multiturn`` (config.multiturn.yaml, the README's default and the learning
gate's) and ``learn`` (config.learn.yaml, the e2e runs'). A user's run still builds and keeps its own
(cua_rl/sft/warm_start.py).

Re-pin after a change to what a warm start is built from (the demonstrations, the curriculum, the agent's prompt
format, the endpoint's image handling: ``warm_start.SOURCES``), then recalibrate the learning gate (its seeds
were run from the pinned ``multiturn`` one):

    python scripts/pin_warm_starts.py [multiturn] [learn]

The learning gate's run judges itself, and its verdict needs the pinned ``multiturn`` warm start's held-out
greedy score, keyed by the warm start, the evaluation's code (``cua_rl.verdict.SCORE_SOURCES``) and the episode
settings. Pin that score too, after a re-pin or a change to the evaluation's code (the quick tier's
``test_the_pinned_warm_starts_score_is_the_one_the_gates_run_keeps`` says when; about 2 minutes on 2 cores,
nothing when this machine kept it already):

    python scripts/pin_warm_starts.py --score

Each pin holds the checkpoint's files, its build stamp and ``PINNED.json``: the recipe, the key, a hash of the
sources it was built from (``sources``), the machine and the date.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PINS = ROOT / "tests" / "data" / "warm-starts"
RECIPES = {"multiturn": "config.multiturn.yaml", "learn": "config.learn.yaml"}
# the files of an HF checkpoint directory a run needs (weights, model and processor configuration, tokenizer)
KEEP = (".json", ".safetensors", ".jinja", ".txt", ".model")


def sources_hash(config) -> str:
    """A hash of the sources a warm start of ``config`` is built from (``warm_start.SOURCES`` and its tasks'
    files), machine-independent: what ``PINNED.json`` records, so a pin older than its sources can be told."""
    from cua_rl.sft import warm_start

    files = []
    for rel in warm_start.SOURCES:
        path = warm_start.PACKAGE / rel
        files += sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts) \
            if path.is_dir() else [path]
    h = hashlib.sha256()
    for f in [*files, *warm_start.task_files(config.sft.tasks)]:
        h.update(str(f.relative_to(warm_start.PACKAGE)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def pin(recipe: str) -> Path:
    from cua_rl.run.launch import RECIPES as RECIPE_DIR, load_config
    from cua_rl.sft.warm_start import STAMP, ensure_warm_start, warm_start_key

    config_file = str(RECIPE_DIR / RECIPES[recipe])
    config = load_config(config_file, [])
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"pin-{recipe}-sft.log"
    started = time.monotonic()
    built = ensure_warm_start(config, config_file, [], log, {**os.environ, "CUA_RL_DEVICE": "cpu"})
    dest = PINS / recipe
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for f in sorted(built.iterdir()):
        if f.is_file() and f.suffix in KEEP:
            shutil.copy2(f, dest / f.name)
    stamp = json.loads((built / STAMP).read_text())
    (dest / "PINNED.json").write_text(json.dumps({
        "recipe": recipe, "config": f"examples/cua_agent/{RECIPES[recipe]}", "key": warm_start_key(config),
        "sources": sources_hash(config), "built": time.strftime("%Y-%m-%d"), "cpu": _cpu(), "cores": os.cpu_count(),
        "build_seconds": stamp.get("seconds"), "sft": stamp.get("result")}, indent=2) + "\n")
    print(f"pinned {recipe}: {built} -> {dest} ({sum(f.stat().st_size for f in dest.iterdir()) / 1e6:.1f} MB, "
          f"{time.monotonic() - started:.0f} s)", flush=True)
    return dest


def pin_score() -> Path:
    """Pin the learning gate's kept verdict score of the pinned ``multiturn`` warm start
    (tests/data/heldout-scores): this machine's kept copy when it has one under the current key, else measured
    now the way the verdict measures it; older pinned scores are removed."""
    from cua_rl import verdict
    from tests.warm_starts import PINNED_SCORES, gate_verdict

    config, tasks, start = gate_verdict()
    kept = verdict.kept_score(config, tasks, start)
    started = time.monotonic()
    if kept.is_file():
        record = json.loads(kept.read_text())
    else:   # measured as the verdict measures it, on the config its key was computed from
        logs = Path(os.environ.get("TMPDIR", "/tmp")) / "pin-score"
        logs.mkdir(parents=True, exist_ok=True)
        [score] = verdict._evaluate(config, tasks, [str(start)], logs)
        record = {"score": score, "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}
    record.update(start=str(start.relative_to(ROOT)), cpu=record.get("cpu") or _cpu(),
                  cores=record.get("cores") or os.cpu_count())
    PINNED_SCORES.mkdir(parents=True, exist_ok=True)
    for old in PINNED_SCORES.glob("verdict-*.json"):
        old.unlink()
    dest = PINNED_SCORES / kept.name
    dest.write_text(json.dumps(record) + "\n")
    print(f"pinned the gate's warm-start score: {dest.name} (measured {record['measured']} on {record['cpu']}; "
          f"{time.monotonic() - started:.0f} s)", flush=True)
    return dest


def main(argv: list[str]) -> int:
    from cua_rl.logs import setup_logging

    setup_logging()
    if argv == ["--score"]:
        pin_score()
        return 0
    unknown = [r for r in argv if r not in RECIPES]
    if unknown:
        print(f"unknown recipe(s) {unknown}; known: {', '.join(RECIPES)} (or --score alone)", file=sys.stderr)
        return 2
    for recipe in argv or list(RECIPES):
        pin(recipe)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))   # this clone's package, whichever clone the environment links
    sys.exit(main(sys.argv[1:]))
