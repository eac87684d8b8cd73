"""Benchmark: the cost of recording turns to our Training Monitor; prints one JSON object.

What a rollout pays, measured with the real reporter, client and server (SQLite store in a temp dir,
loopback HTTP, all in this process as in the embedded default):
  - ``enqueue_us_per_turn``: time inside ``RolloutReport.turn`` (each turn as the endpoint records it) and
    ``RolloutReport.finished(turns=...)``, the only part an episode waits for (everything else runs in
    background tasks), summed per turn, and per call (p50, max: a call can wait for the GIL while the
    in-process server thread works);
  - ``loop_lag_ms``: p50/p99/max delay of a 5 ms ticker on the same event loop while the turns are being
    recorded (what a concurrent rollout on that loop would feel);
  - ``background_ms_per_turn``: wall time from the first ``finished`` until every send is answered, per turn
    (decode, hash, upload, ingest, store; on this machine's cores, shared with the server);
  - ``views_ms_per_turn``: the CPU part run in a worker thread (base64 decode, SHA-256, token pieces);
  - stored bytes per turn (screenshot file, database growth).
Each pixel budget is measured twice in the same run: ``live`` (what the workflow does: every turn sent when
recorded, then all of them again with the agent's actions once the episode is evaluated) and ``at_end``
(turns sent only once the episode is evaluated, as before live turns existed).
Screenshots are realistic desktop-like PNGs at the endpoint's two pixel budgets (config.cpu.yaml 200704,
config.yaml 1024000).

  python bench/monitor_bench.py                       # ~20-40 s on 2 cores
  python bench/monitor_bench.py --episodes 16 --turns 10 --tokens 512
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import math
import random
import statistics
import tempfile
import time
from pathlib import Path

from PIL import Image, ImageDraw  # noqa: E402

import cua_rl.trajectory  # noqa: E402,F401  (imports areal, as a rollout worker already has: not a recording cost)
from cua_rl.http.retry import RetryPolicy  # noqa: E402
from cua_rl.monitor import EpisodeReporter, training_run  # noqa: E402
from cua_rl.monitor.embedded import start_monitor  # noqa: E402
from cua_rl.monitor.turns import turn_views  # noqa: E402
from cua_rl.policy.records import Turn  # noqa: E402
from cua_rl.trajectory.rows import new_rollout_uuid  # noqa: E402


class Pieces:
    """decode/batch_decode of a tokenizer (token id -> short text); the real one costs about the same."""

    def batch_decode(self, seqs, skip_special_tokens=False):
        return [f"w{s[0] % 997} " for s in seqs]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(f"w{i % 997} " for i in ids)


def desktop_png(pixels: int, seed: int) -> bytes:
    """A desktop-like screenshot (16:10, windows and text) scaled to ``pixels``, PNG as the endpoint sends."""
    rng = random.Random(seed)
    w = int(math.sqrt(pixels * 16 / 10))
    h = pixels // w
    img = Image.new("RGB", (w, h), (236, 238, 241))
    d = ImageDraw.Draw(img)
    for _ in range(6):
        x0, y0 = rng.randrange(w // 2), rng.randrange(h // 2)
        d.rectangle((x0, y0, x0 + rng.randrange(w // 4, w // 2), y0 + rng.randrange(h // 4, h // 2)),
                    fill=(255, 255, 255), outline=(90, 90, 90))
        for line in range(12):
            d.text((x0 + 8, y0 + 8 + 14 * line), "".join(rng.choice("abcdefgh ijk") for _ in range(40)),
                   fill=(20, 20, 20))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def make_turns(n: int, tokens: int, pixels: int, seed: int) -> list[Turn]:
    out = []
    for t in range(n):
        png = desktop_png(pixels, seed * 1000 + t)
        out.append(Turn(prompt_ids=list(range(1500)), output_ids=list(range(tokens)),
                        output_logprobs=[-0.1] * tokens, output_versions=[0] * tokens, n_images=2,
                        latency_s=1.0, image_b64=base64.b64encode(png).decode()))
    return out


STEPS = [{"actions": [{"name": "click", "args": {}, "gymAction": {"type": "click", "x": 0.4, "y": 0.6}}],
          "messages": [{"role": "assistant", "content": "click"}]}]


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return round(s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))], 3)


async def record(url: str, token: str, training_id: int, episodes: list[list[Turn]], live: bool) -> dict:
    rep = EpisodeReporter(url, "bench", training_id, token=token,
                          retry=RetryPolicy(attempts=1, retry_5xx=False))
    lags: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            await asyncio.sleep(0.005)
            lags.append((time.perf_counter() - t0 - 0.005) * 1000)

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0.05)
    calls: list[float] = []   # each call an episode waits for
    started = time.perf_counter()
    for i, turns in enumerate(episodes):
        report = rep.rollout(new_rollout_uuid(), task_id="bench-task", step=0, env_index=i % 4,
                             group_id=f"g{i // 4}")
        if live:
            for number, turn in enumerate(turns, 1):
                t0 = time.perf_counter()
                report.turn(number, turn, Pieces())
                calls.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        report.finished(reward=1.0, task_success=True, num_turns=len(turns), summary={}, turns=turns,
                        steps=STEPS * len(turns), tokenizer=Pieces())
        calls.append(time.perf_counter() - t0)
    await rep.flush(120)
    background = time.perf_counter() - started
    stop.set()
    await tick
    await rep.aclose()
    n = sum(len(t) for t in episodes)
    return {"turns": n, "enqueue_us_per_turn": round(sum(calls) / n * 1e6, 1),
            "enqueue_us_per_call": {"p50": pct([c * 1e6 for c in calls], 50), "max": round(max(calls) * 1e6, 1)},
            "background_ms_per_turn": round(background / n * 1000, 2),
            "loop_lag_ms": {"p50": pct(lags, 50), "p99": pct(lags, 99), "max": round(max(lags), 2)},
            "failures": rep.failures, "dropped": rep.dropped}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--pixels", default="200704,1024000")
    args = ap.parse_args()
    result: dict = {"bench": "monitor_recording", "episodes": args.episodes, "turns_per_episode": args.turns,
                    "output_tokens_per_turn": args.tokens, "by_pixels": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for pixels in (int(p) for p in args.pixels.split(",")):
            monitor = start_monitor(Path(tmp) / f"m{pixels}")
            try:
                token = monitor.store.create_token("bench")
                episodes = [make_turns(args.turns, args.tokens, pixels, seed=e) for e in range(args.episodes)]
                t0 = time.perf_counter()
                views = turn_views(episodes[0], STEPS * args.turns, Pieces())
                views_ms = (time.perf_counter() - t0) / len(views) * 1000
                db = Path(tmp) / f"m{pixels}" / "monitor.db"
                with monitor.store.engine.connect() as conn:
                    conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
                db_before = db.stat().st_size + sum(p.stat().st_size for p in db.parent.glob("monitor.db-*"))
                rows = {}
                for mode in ("live", "at_end"):
                    with training_run(monitor.url, "bench", "bench", f"{pixels}-{mode}", token=token) as tid:
                        rows[mode] = asyncio.run(record(monitor.url, token, tid, episodes, live=mode == "live"))
                blobs = [p.stat().st_size for p in monitor.blobs.root.rglob("*.png")]
                with monitor.store.engine.connect() as conn:   # fold the WAL into the file before measuring
                    conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
                db_after = db.stat().st_size + sum(p.stat().st_size for p in db.parent.glob("monitor.db-*"))
                row = {**rows, "views_ms_per_turn": round(views_ms, 2),
                       "screenshot_kb_mean": round(statistics.mean(blobs) / 1024, 1),
                       "db_bytes_per_turn": round((db_after - db_before) / (2 * rows["live"]["turns"]))}
                result["by_pixels"][str(pixels)] = row
            finally:
                monitor.stop()
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
