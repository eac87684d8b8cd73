"""``cua-model build-tiny OUT_DIR`` and ``cua-model serve MODEL_DIR --port N``."""

from __future__ import annotations

import argparse
import logging
import sys

from cua_rl.logs import setup_logging


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cua-model", description="Tiny offline VLM and CPU inference server")
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build-tiny", help="write a tiny random Qwen3-VL checkpoint (deterministic from --seed)")
    b.add_argument("out_dir")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--max-pixels", type=int, default=None, help="processor max_pixels (default 65536)")
    s = sub.add_parser("serve", help="serve MODEL_DIR with the vLLM API subset AReaL uses")
    s.add_argument("model_dir")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    s.add_argument("--max-model-len", type=int, default=8192)
    s.add_argument("--served-model-name", default=None)
    s.add_argument("--log-level", default="info")
    s.add_argument("--parent-pid", type=int, default=None,
                   help="exit when this process is gone (set by ModelServerProcess: no orphaned servers)")
    args = parser.parse_args(argv)
    setup_logging(getattr(logging, str(getattr(args, "log_level", "info")).upper(), logging.INFO))

    if args.cmd == "build-tiny":
        from .tiny import TinySpec, build_tiny

        spec = TinySpec() if args.max_pixels is None else TinySpec(max_pixels=args.max_pixels)
        print(build_tiny(args.out_dir, seed=args.seed, spec=spec))
        return 0

    import uvicorn

    from .engine import TinyEngine
    from .server import create_app

    engine = TinyEngine(args.model_dir, max_model_len=args.max_model_len, threads=args.threads)
    if args.parent_pid:
        _exit_with_parent(args.parent_pid)
    try:
        uvicorn.run(create_app(engine, args.served_model_name), host=args.host, port=args.port,
                    log_level="warning", timeout_graceful_shutdown=2)
    finally:
        engine.close()
    return 0


def _exit_with_parent(parent_pid: int) -> None:
    """A killed trainer or test must not leave this server running: poll the parent, SIGTERM self."""
    import os
    import signal
    import threading
    import time

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        logging.getLogger(__name__).warning("parent %d is gone; shutting down", parent_pid)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


if __name__ == "__main__":
    sys.exit(main())
