"""``cua-model build-tiny OUT_DIR``: write the tiny offline Qwen3-VL checkpoint (served by vLLM, not here).
``cua-model export CHECKPOINT OUT_DIR``: a trained checkpoint as a Hugging Face directory of its own, with the
processor files transformers 4 reads too (``export.py``; docs/policy-and-training.md, "Serving and exporting")."""

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
    e = sub.add_parser("export", help="copy a trained checkpoint to OUT_DIR as a Hugging Face model directory, "
                                      "with the processor files transformers 4 reads too")
    e.add_argument("checkpoint", help="a checkpoint directory of a run (the summary's 'final checkpoint')")
    e.add_argument("out_dir")
    args = parser.parse_args(argv)
    setup_logging(areal=args.cmd != "export")   # export imports neither AReaL nor torch
    if args.cmd == "export":
        from .export import ExportError, export_checkpoint

        try:
            print(export_checkpoint(args.checkpoint, args.out_dir))
        except ExportError as exc:
            print(f"cua-model export: {exc}", file=sys.stderr)
            return 2
        return 0

    from .tiny import TinySpec, build_tiny

    spec = TinySpec() if args.max_pixels is None else TinySpec(max_pixels=args.max_pixels)
    print(build_tiny(args.out_dir, seed=args.seed, spec=spec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
