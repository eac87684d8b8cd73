"""The screenshot floor: capture plus encode of one 1280x800 desktop frame, each way the gym can do it; prints
one JSON object.

On a real desktop of the embedded gym (task 001, Mousepad on a small file: the frame an agent sees), in this
process: the grab alone (MIT-SHM, ``Screen.grab``), then grab + encode, PNG and JPEG (quality 85), each as the
gym did before (a copy of the frame, Pillow's BGRX unpack, Pillow's encoder: PNG at zlib level 1) and as it
does now (``Screen.png``: unfiltered rows deflated by zlib-ng; ``Screen.jpeg``: simplejpeg from the BGRX frame). Median and
p90 of ``--samples`` rounds, the order of the ways interleaved per round so drift hits each alike. The
encoding cache is bypassed (each round encodes). Target: capture plus encode at most 5 ms.

  python bench/screenshot_bench.py                # ~20 s
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _pillow_before(screen, raw: bytearray, fmt: str) -> bytes:
    """The gym's encoding before: ``bytes(raw)`` copied, Pillow's BGRX unpack, Pillow's encoder."""
    from PIL import Image

    img = Image.frombuffer("RGB", (screen.width, screen.height), bytes(raw), "raw", "BGRX", 0, 1)
    out = io.BytesIO()
    if fmt == "png":
        img.save(out, "PNG", compress_level=1)
    else:
        img.save(out, "JPEG", quality=85)
    return out.getvalue()


def _ways(screen) -> dict:
    return {
        "grab": lambda: screen.grab(),
        "grab+png_before": lambda: _pillow_before(screen, screen.grab(), "png"),
        "grab+png_now": lambda: screen._encode_now(screen.grab(), "png", 0),
        "grab+jpeg_before": lambda: _pillow_before(screen, screen.grab(), "jpeg"),
        "grab+jpeg_now": lambda: screen._encode_now(screen.grab(), "jpeg", 85),
    }


def _stats(ms: list[float]) -> dict:
    from bench.gym_bench import pct

    return {"p50_ms": pct(ms, 50), "p90_ms": pct(ms, 90)}


async def run(samples: int) -> dict:
    from cua_rl.local_gym.env import LocalGym
    from cua_rl.local_gym.server import make_options

    async with LocalGym(make_options(gym_id="desktop", pool_size=1, width=1280, height=800)) as gym:
        created = await gym.reset("001")
        eid = created["execution_id"]
        try:
            screen = gym.execution(eid).desktop.screen
            ways = _ways(screen)
            sizes = {name: len(f()) for name, f in ways.items() if name != "grab"}
            times: dict[str, list[float]] = {name: [] for name in ways}
            for i in range(samples):
                names = list(ways)
                for name in names[i % len(names):] + names[:i % len(names)]:
                    t0 = time.perf_counter()
                    ways[name]()
                    times[name].append((time.perf_counter() - t0) * 1e3)
        finally:
            await gym.terminate(eid)
    result = {name: _stats(ms) for name, ms in times.items()}
    for name, size in sizes.items():
        result[name]["bytes"] = size
    speedup = {fmt: round(result[f"grab+{fmt}_before"]["p50_ms"] / result[f"grab+{fmt}_now"]["p50_ms"], 2)
               for fmt in ("png", "jpeg")}
    return {"bench": "screenshot_floor", "frame": "1280x800, task 001 (Mousepad)", "samples": samples,
            "ways": result, "speedup_p50": speedup, "target_ms": 5.0,
            "meets_target_p50": {fmt: result[f"grab+{fmt}_now"]["p50_ms"] <= 5.0 for fmt in ("png", "jpeg")}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=200)
    args = ap.parse_args()
    print(json.dumps(asyncio.run(run(args.samples)), indent=2))


if __name__ == "__main__":
    main()
