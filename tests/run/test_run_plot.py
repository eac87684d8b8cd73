"""The run's plot (cua_rl/run/plot.py): ``cua-plot METRICS_JSONL --out PNG`` draws a run's success and reward per
step, and the end of a run puts ``metrics.png`` beside its ``metrics.jsonl``. A real PNG is written and read back."""

from __future__ import annotations

import json
import subprocess
import sys

from PIL import Image

from cua_rl.run.plot import plot_run


def _metrics(folder, steps):
    path = folder / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": i + 1, "global_step": i, "trained/success": s, "trained/reward": r})
                            + "\n" for i, (s, r) in enumerate(steps)) + '{"step": 9, "trained/succ')   # killed
    return path


def test_cua_plot_draws_any_runs_metrics_and_refuses_one_without_steps(tmp_path):
    metrics = _metrics(tmp_path, [(0.25, 0.1), (0.5, 0.4), (0.75, 0.7)])
    out = tmp_path / "plot.png"
    done = subprocess.run([sys.executable, "-m", "cua_rl.run.plot", str(metrics), "--out", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "metrics.jsonl:4: skipped, not JSON" in done.stderr
    with Image.open(out) as img:
        assert img.format == "PNG" and img.width > 400 and len(img.getcolors(1 << 16) or range(2)) > 2
    empty = tmp_path / "empty" / "metrics.jsonl"
    empty.parent.mkdir()
    empty.write_text('{"step": 1}\n')
    done = subprocess.run([sys.executable, "-m", "cua_rl.run.plot", str(empty), "--out", str(tmp_path / "e.png")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "no step with trained/reward or trained/success" in done.stderr


def test_a_runs_end_puts_metrics_png_beside_metrics_jsonl(tmp_path):
    assert plot_run(tmp_path) is None   # a run that trained no step: nothing to draw, nothing written
    _metrics(tmp_path, [(0.5, 0.5), (1.0, 1.0)])
    assert plot_run(tmp_path) == tmp_path / "metrics.png"
    assert (tmp_path / "metrics.png").stat().st_size > 1000
