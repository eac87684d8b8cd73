"""``cua-gym serve --host 127.0.0.1 --port 5010 --gym-id desktop`` (also ``python -m cua_rl.local_gym``)."""

from __future__ import annotations

import argparse
import logging
import sys

import uvicorn

from cua_rl.logs import setup_logging


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cua-gym", description="genv-compatible gym with local X11 desktops")
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="serve the gym over HTTP")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=5010)
    s.add_argument("--gym-id", default="desktop")
    s.add_argument("--width", type=int, default=1280)
    s.add_argument("--height", type=int, default=800)
    s.add_argument("--max-executions", type=int, default=16, help="concurrent executions; more get HTTP 429")
    s.add_argument("--pool-size", type=int, default=1, help="warm spares per recently used desktop profile")
    s.add_argument("--max-spares", type=int, default=4, help="warm spares over all profiles")
    s.add_argument("--prewarm", default="", help="comma-separated task ids/numbers to warm at start")
    s.add_argument("--ttl", type=float, default=1800.0, help="seconds of inactivity before an execution is reaped")
    s.add_argument("--tasks-dir", default=None, help="folder of task YAML files (default: the built-in tasks)")
    s.add_argument("--display-base", type=int, default=300)
    s.add_argument("--log-level", default="info")
    l = sub.add_parser("list", help="print the tasks and exit")
    l.add_argument("--tasks-dir", default=None)
    args = parser.parse_args(argv)
    setup_logging(getattr(logging, args.log_level.upper(), logging.INFO) if args.cmd == "serve" else logging.WARNING)

    from .manager import GymOptions
    from .server import create_app
    from .tasks import TASKS_DIR, load_tasks

    if args.cmd == "list":
        for t in load_tasks(args.tasks_dir or TASKS_DIR).tasks:
            print(f"{t.task_id:40s} {t.category:13s} {t.difficulty:7s} {t.instruction[:70]}")
        return 0
    opts = GymOptions(gym_id=args.gym_id, width=args.width, height=args.height,
                      max_executions=args.max_executions, pool_size=args.pool_size, max_spares=args.max_spares,
                      prewarm=[p for p in args.prewarm.split(",") if p], ttl_s=args.ttl, tasks_dir=args.tasks_dir,
                      display_base=args.display_base)
    uvicorn.run(create_app(opts), host=args.host, port=args.port, log_level=args.log_level.lower(),
                timeout_graceful_shutdown=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
