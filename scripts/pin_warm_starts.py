"""Build the SFT warm starts of the README's recipes and pin them into the repository
(cua_rl/recipes/pinned/warm-starts): the tests train from them, and a user's first run copies the one of its
recipe instead of building it when its settings and sources match (cua_rl/sft/warm_start.py ``find_pin``).

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

Each pin holds the checkpoint's files, its build stamp and ``PINNED.json``: the recipe, the key, the
machine-independent ``pin_key`` (settings) and ``sources`` (code) a run's warm start must have for the pin to
stand for it, the machine and the date.

After a change to ``warm_start.SOURCES`` that leaves the demonstrations' rows alone (a refactor of the agent or
the endpoint), a pin need not be rebuilt. Restamp it instead:

    python scripts/pin_warm_starts.py --restamp multiturn

records the demonstrations with this clone's code and scores them, as token rows, on this machine's base model
(the SFT's ``loss_before``, one SFT step: about 3 minutes on 2 cores). Only when that loss equals the pin's own
(the rows it was trained on: the same tokens and images) are the current ``sources`` and ``pin_key`` written
into ``PINNED.json``, with the two losses; otherwise it says to re-pin. The learning gate's calibration stays
with the same weights.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOSS_MATCH = 1e-6   # relative: a different row (one token, one pixel of an image) moves the base's mean loss more
RECIPES = {"multiturn": "config.multiturn.yaml", "learn": "config.learn.yaml"}
# the files of an HF checkpoint directory a run needs (weights, model and processor configuration, tokenizer)
KEEP = (".json", ".safetensors", ".jinja", ".txt", ".model")


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def pin(recipe: str) -> Path:
    from cua_rl.run.launch import RECIPES as RECIPE_DIR, load_config
    from cua_rl.sft.warm_start import PINNED, PINS, STAMP, ensure_warm_start, pin_key, sources_hash, warm_start_key

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
    (dest / PINNED).write_text(json.dumps({
        "recipe": recipe, "config": f"examples/cua_agent/{RECIPES[recipe]}", "key": warm_start_key(config),
        "pin_key": pin_key(config), "sources": sources_hash(config), "built": time.strftime("%Y-%m-%d"), "cpu": _cpu(), "cores": os.cpu_count(),
        "build_seconds": stamp.get("seconds"), "sft": stamp.get("result")}, indent=2) + "\n")
    print(f"pinned {recipe}: {built} -> {dest} ({sum(f.stat().st_size for f in dest.iterdir()) / 1e6:.1f} MB, "
          f"{time.monotonic() - started:.0f} s)", flush=True)
    return dest


def pin_score() -> Path:
    """Pin the learning gate's kept verdict score of the pinned ``multiturn`` warm start
    (cua_rl/recipes/pinned/heldout-scores): a copy kept or pinned under the current key when there is one, else measured
    now the way the verdict measures it; older pinned scores are removed."""
    from cua_rl import verdict
    from tests.warm_starts import PINNED_SCORES, gate_verdict

    config, tasks, start = gate_verdict()
    kept = verdict.kept_score(config, tasks, start)
    started = time.monotonic()
    found = verdict.found_score(kept)   # kept here, or pinned under the same key
    if found is not None:
        record = json.loads(found.read_text())
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


def restamp(recipe: str) -> Path:
    """Write this clone's ``sources`` and ``pin_key`` into the pin of ``recipe`` when this clone's demonstration
    rows score the same loss on the base model as the rows the pin was trained on (the module's docstring)."""
    import tempfile

    from cua_rl.local_model.tiny import ensure_embedded_model
    from cua_rl.run.launch import RECIPES as RECIPE_DIR, load_config
    from cua_rl.sft.warm_start import PINNED, PINS, _run_showing_progress, pin_key, sources_hash

    config_file = str(RECIPE_DIR / RECIPES[recipe])
    config = load_config(config_file, [])
    ensure_embedded_model(config)
    stamp = PINS / recipe / PINNED
    record = json.loads(stamp.read_text())
    pinned_loss = record["sft"]["loss_before"]
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as out:   # the warm start's own runner: its log, its progress lines
        result = _run_showing_progress([sys.executable, "-m", "cua_rl.sft", "--config", config_file, "sft.steps=1",
                                        f"sft.output_dir={out}/ckpt", "sft.warm_start=false"], Path(out) / "sft.log",
                                       {**os.environ, "CUA_RL_DEVICE": "cpu", "PYTHONPATH": str(ROOT)})
    loss = result["loss_before"]
    if abs(loss - pinned_loss) > LOSS_MATCH * abs(pinned_loss):
        raise SystemExit(f"{recipe}: this clone's rows score {loss!r} on the base model, the pin's {pinned_loss!r}: "
                         f"the demonstrations changed, re-pin: python scripts/pin_warm_starts.py {recipe}")
    record.update(pin_key=pin_key(config), sources=sources_hash(config),
                  restamped={"date": time.strftime("%Y-%m-%d"), "cpu": _cpu(), "loss_before": loss,
                             "pinned_loss_before": pinned_loss, "demonstrations": result["demonstrations"]})
    stamp.write_text(json.dumps(record, indent=2) + "\n")
    print(f"restamped {recipe}: rows score {loss!r}, the pin's {pinned_loss!r} (sources {record['sources']}, "
          f"pin_key {record['pin_key']}; {time.monotonic() - started:.0f} s)", flush=True)
    return stamp


def main(argv: list[str]) -> int:
    from cua_rl.logs import setup_logging

    setup_logging()
    if argv == ["--score"]:
        pin_score()
        return 0
    if argv[:1] == ["--restamp"]:
        for recipe in argv[1:] or list(RECIPES):
            restamp(recipe)
        return 0
    unknown = [r for r in argv if r not in RECIPES]
    if unknown:
        print(f"unknown recipe(s) {unknown}; known: {', '.join(RECIPES)} (or --score alone, or --restamp "
              "[RECIPE...])", file=sys.stderr)
        return 2
    for recipe in argv or list(RECIPES):
        pin(recipe)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))   # this clone's package, whichever clone the environment links
    sys.exit(main(sys.argv[1:]))
