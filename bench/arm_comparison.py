"""Two arms of the learning yardstick side by side: GRPO runs of two versions of the code, each arm from a warm
start of its own, judged by the same gate (bench/learning_bench.py THE BAR).

Why: a change to what runs learn from (the screenshots' one resample, the right-data issue's item 3) changes the
SFT warm start's key as well as the runs, so the two arms cannot share a warm start or be run as variants of
one invocation (``--variant`` overrides a config, not the code). Each arm is one or more learning-bench JSONs
(``--recipe multiturn --greedy-only --regimes instances,content``, from that arm's clone and its own
CUA_RL_HOME); this script sets their seeds side by side: per arm and gated regime, each seed's greedy rise over
its own warm start, the mean, and the gate's verdict per seed; and the difference of the mean rises (second
arm minus first) with its Welch 95% interval across seeds (``learning_bench.welch``). With three seeds an arm
this bounds a difference only roughly; the JSON says so by its interval.

    python bench/arm_comparison.py --arm one_resample=A.json,B.json --arm twice=C.json --out docs/bench/X.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def arm(paths: list[Path], gated: tuple[str, ...]) -> dict:
    """One arm's seeds from its learning-bench JSONs (a seed twice: the first kept)."""
    seeds: dict[int, dict] = {}
    warm = []
    for path in paths:
        result = json.loads(path.read_text())
        warm.append({"file": str(path), "greedy": result["warm_start"]["greedy"],
                     "regimes": {r: result["warm_start"]["regimes"][r]["success"] for r in gated}})
        for s in result["seeds"]:
            seeds.setdefault(s["seed"], {"seed": s["seed"], "from": path.name,
                                         "rise": {r: s["regimes"][r]["rise"] for r in gated},
                                         "after": {r: s["regimes"][r]["greedy"] for r in gated},
                                         "gate_failures": s["gate_failures"]})
    runs = [seeds[k] for k in sorted(seeds)]
    return {"warm_starts": warm, "seeds": runs, "passed": sum(not s["gate_failures"] for s in runs),
            "mean_rise": {r: round(sum(s["rise"][r] for s in runs) / len(runs), 4) for r in gated}}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arm", action="append", required=True, help="NAME=JSON[,JSON...] (twice: two arms)")
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    if len(args.arm) != 2:
        parser.error("give exactly two --arm NAME=JSON[,JSON...]")
    import learning_bench as bench  # this script's folder is on sys.path: the gate's bar and welch, defined once

    gated = tuple(bench.GATED)
    arms = {}
    for given in args.arm:
        name, _, files = given.partition("=")
        if not name or not files:
            parser.error(f"--arm {given!r}: expected NAME=JSON[,JSON...]")
        arms[name] = arm([Path(f) for f in files.split(",")], gated)
    (a, first), (b, second) = arms.items()
    result = {"arms": arms, "bar": bench.BAR, "difference": {
        "of": f"{b} minus {a}: mean greedy rise over each arm's own warm start",
        **{r: {"mean": round(second["mean_rise"][r] - first["mean_rise"][r], 4),
               "ci95_across_seeds": bench.welch([s["rise"][r] for s in first["seeds"]],
                                                [s["rise"][r] for s in second["seeds"]])} for r in gated}}}
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return result


if __name__ == "__main__":
    main()
