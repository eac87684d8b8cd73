"""A run's picture: success and reward per trained step, drawn from its ``metrics.jsonl`` (cua_rl/trainer/progress.py
writes one line per step) with matplotlib.

The launcher draws ``metrics.png`` beside ``metrics.jsonl`` when a run ends (a run that trained no step has none);
``cua-plot METRICS_JSONL --out PNG`` draws any run's. The values are the trained episodes' raw outcome
(``trained/success``, ``trained/reward``): what the console's step lines print.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# (key, label, line style): reward is often success itself (a gym that scores 0 or 1), so success is drawn over it
SERIES = (("trained/reward", "reward", "-"), ("trained/success", "success", "--"))


def read_steps(metrics: Path) -> list[dict]:
    """The steps of a ``metrics.jsonl``, in order; a line cut short by a killed run is skipped, named on stderr."""
    steps = []
    for number, line in enumerate(metrics.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            steps.append(json.loads(line))
        except json.JSONDecodeError as e:
            print(f"{metrics}:{number}: skipped, not JSON ({e.msg})", file=sys.stderr)
    return sorted(steps, key=lambda s: s.get("step", 0))


def plot(metrics: Path, out: Path, title: str | None = None) -> Path:
    """Draw success and reward per step of ``metrics`` to the PNG ``out``; raises ValueError when no step holds
    either."""
    import matplotlib

    matplotlib.use("Agg")   # no display: a file only
    import matplotlib.pyplot as plt

    steps = read_steps(metrics)
    drawn = [(label, style, [(s["step"], s[key]) for s in steps if s.get(key) is not None])
             for key, label, style in SERIES]
    if not any(points for _, _, points in drawn):
        raise ValueError(f"{metrics}: no step with {' or '.join(k for k, _, _ in SERIES)} ({len(steps)} lines)")
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=110)
    for label, style, points in drawn:
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], style, marker="o", markersize=3, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("trained episodes' mean")
    ax.set_title(title or metrics.parent.name)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def plot_run(logs: Path) -> Path | None:
    """The end of a run: ``metrics.png`` beside its ``metrics.jsonl``, or None (with the reason on stderr) when there
    is nothing to draw; a picture is never worth failing a run for."""
    metrics = logs / "metrics.jsonl"
    if not metrics.is_file():
        return None
    try:
        return plot(metrics, logs / "metrics.png")
    except (ValueError, OSError, ImportError) as e:
        print(f"[cua-rl] no plot of the run: {e}", file=sys.stderr)
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="cua-plot", description="Draw a run's success and reward per step from its "
                                 "metrics.jsonl (in the run's log directory) to a PNG.")
    ap.add_argument("metrics", type=Path, metavar="METRICS_JSONL", help="a run's metrics.jsonl")
    ap.add_argument("--out", type=Path, required=True, metavar="PNG", help="the picture to write")
    ap.add_argument("--title", default=None, help="the plot's title (default: the run's directory name)")
    args = ap.parse_args(argv)
    try:
        print(plot(args.metrics, args.out, args.title))
    except (ValueError, OSError) as e:
        print(f"cua-plot: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
