"""``cua-model build-tiny OUT_DIR``: write the tiny offline Qwen3-VL checkpoint (served by vLLM, not here)."""

from __future__ import annotations

import argparse
import sys

from cua_rl.logs import setup_logging


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cua-model", description="Tiny offline Qwen3-VL for the CPU default")
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build-tiny", help="write a tiny random Qwen3-VL checkpoint (deterministic from --seed)")
    b.add_argument("out_dir")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--max-pixels", type=int, default=None, help="processor max_pixels (default 65536)")
    args = parser.parse_args(argv)
    setup_logging()

    from .tiny import TinySpec, build_tiny

    spec = TinySpec() if args.max_pixels is None else TinySpec(max_pixels=args.max_pixels)
    print(build_tiny(args.out_dir, seed=args.seed, spec=spec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
