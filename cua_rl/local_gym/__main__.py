"""``cua-gym serve --host 127.0.0.1 --port 5010 --gym-id desktop`` (also ``python -m cua_rl.local_gym``).

``--gym-id miniwob`` serves the MiniWoB++ suite on browser desktops (``--suite`` names it explicitly).
``cua-gym suite keyboard --target desktop --out DIR`` writes the keyboard suite's task files (``keyboard_suite.py``)
for ``serve --tasks-dir DIR``.
``cua-gym check URL --gym-id ID`` checks that a gym (ours or yours) implements what docs/protocols.md §1.8 asks of one
(``cua_rl/genv/conformance.py``): one line per check, exit 1 naming each that failed.
``serve`` takes a bearer token from ``--token-file FILE``, ``CUA_GYM_TOKEN`` or ``CUA_GYM_TOKEN_FILE``, and refuses an
address other than loopback without one unless ``--insecure-no-token`` (cua_rl/http/auth.py, docs/security.md).
"""

from __future__ import annotations

import argparse
import logging
import sys

import uvicorn

from cua_rl.http.auth import GYM_TOKEN, TokenError, serving_token
from cua_rl.http.serve import KEEP_ALIVE_S, DrainingServer
from cua_rl.logs import setup_logging


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cua-gym", description="genv-compatible gym with local X11 desktops")
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="serve the gym over HTTP")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=5010)
    s.add_argument("--gym-id", default="desktop")
    s.add_argument("--suite", choices=("desktop", "miniwob"), default="",
                   help="task suite (default: miniwob when --gym-id is miniwob, else desktop)")
    s.add_argument("--width", type=int, default=None, help="screen width (default 1280; miniwob 480)")
    s.add_argument("--height", type=int, default=None, help="screen height (default 800; miniwob 630)")
    s.add_argument("--max-executions", type=int, default=16, help="concurrent executions; more get HTTP 429")
    s.add_argument("--pool-size", type=int, default=None,
                   help="warm spares per recently used desktop profile (default 1; miniwob 4)")
    s.add_argument("--max-spares", type=int, default=4, help="warm spares over all profiles")
    s.add_argument("--x-spares", type=int, default=2,
                   help="bare X servers kept started, so a cold create skips the X server's start-up (0: none)")
    s.add_argument("--prewarm", default="", help="comma-separated task ids/numbers to warm at start")
    s.add_argument("--ttl", type=float, default=1800.0, help="seconds of inactivity before an execution is reaped")
    s.add_argument("--tasks-dir", default=None, help="folder of task YAML files (default: the built-in tasks)")
    s.add_argument("--display-base", type=int, default=300)
    s.add_argument("--reuse-browsers", type=int, default=None, metavar="N",
                   help="executions one browser desktop serves, nothing of one episode left for the next "
                        "(docs/local_gym.md); default: miniwob 50, 0 = a new browser for each")
    s.add_argument("--new-browser-per-episode", action="store_true",
                   help="every execution a browser nobody used (the same as --reuse-browsers 0; ~1.4 s of CPU "
                        "per episode to start it)")
    s.add_argument("--restart-in-page", action=argparse.BooleanOptionalAction, default=None,
                   help="with reused browsers: restart the next MiniWoB++ episode in the used page, as the package's "
                        "own environment does (default: on), or load the page again (--no-restart-in-page: "
                        "~90 ms more CPU per episode, and no script state of the last episode stays)")
    s.add_argument("--miniwob-time-limit", type=float, default=3600.0,
                   help="seconds a MiniWoB++ episode may last (replaces the pages' own 7-30 s timers)")
    s.add_argument("--live-view-host", default="127.0.0.1",
                   help="address live views listen on (GET .../executions/ID/live); they have no password, so "
                        "anyone who reaches it sees the screen (default: this machine only)")
    s.add_argument("--evaluate-timeout", type=float, default=60.0,
                   help="seconds an evaluate may take; a longer one fails (503) and keeps its execution from "
                        "evaluating again until it ends")
    s.add_argument("--fork-wait", type=float, default=5.0,
                   help="seconds a fork's child may take to show each screen of the parent's it replays, and to have "
                        "the parent's task state, before the fork is refused with 409 (docs/local_gym.md, Forks)")
    s.add_argument("--token-file", default=None, metavar="FILE",
                   help=f"a file holding the bearer token every route but /health needs (else ${GYM_TOKEN}, or the "
                        f"file ${GYM_TOKEN}_FILE names); needed on an address other than loopback")
    s.add_argument("--insecure-no-token", action="store_true",
                   help="serve on an address other than loopback without a token: anyone who reaches it can use "
                        "every execution")
    s.add_argument("--log-level", default="info")
    ls = sub.add_parser("list", help="print the tasks and exit")
    ls.add_argument("--tasks-dir", default=None)
    ls.add_argument("--suite", choices=("desktop", "miniwob"), default="desktop")
    k = sub.add_parser("suite", help="write a generated task suite as task files, for serve --tasks-dir")
    k.add_argument("name", choices=("keyboard",), help="keyboard: the Windows example's four levels (keyboard_suite.py)")
    k.add_argument("--target", choices=("desktop", "vm"), default="desktop",
                   help="desktop: mousepad and xterm; vm: vi and sh on the VM test guest ($CUA_RL_VM_TEST_GUEST)")
    k.add_argument("--out", required=True, help="folder to write the task files into")
    c = sub.add_parser("check", help="check that the gym at URL speaks the genv protocol (docs/protocols.md §1.8): "
                                     "one execution created, acted on, screenshotted, evaluated and ended, bad input "
                                     "refused; exit 1 naming each failed check")
    c.add_argument("url", metavar="URL", help="the gym's base URL (as --gym takes it)")
    c.add_argument("--gym-id", required=True, metavar="ID", help="the gym id its routes are under (/api/v1/ID/...)")
    c.add_argument("--task", default=None, metavar="ID", help="the task to play (default: the first listed)")
    c.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                   help="the most a create or an evaluate may take (default %(default)s)")
    args = parser.parse_args(argv)
    if args.cmd == "check":   # a client: the gym's token from CUA_GYM_TOKEN / CUA_GYM_TOKEN_FILE, as the trainer's
        return _check(args)
    setup_logging(getattr(logging, args.log_level.upper(), logging.INFO) if args.cmd == "serve" else logging.WARNING,
                  areal=False)

    from .manager import GymOptions
    from .mounts import private_namespace
    from .server import create_app
    from .suite import make_suite

    if args.cmd == "suite":
        from .keyboard_suite import write_suite

        paths = write_suite(args.target, args.out)
        print(f"{len(paths)} task files in {args.out}; serve them with: cua-gym serve --tasks-dir {args.out}")
        return 0
    if args.cmd == "list":
        try:
            suite = make_suite(GymOptions(suite=args.suite, tasks_dir=args.tasks_dir))
        except ValueError as exc:   # a bad task file: say which and why, no traceback
            print(f"cua-gym: {exc}", file=sys.stderr)
            return 2
        for t in suite.tasks.tasks:
            print(f"{t.task_id:40s} {t.category:13s} {t.difficulty:7s} {t.instruction[:70]}")
        return 0
    if args.new_browser_per_episode:
        if args.reuse_browsers not in (None, 0, 1):
            print(f"cua-gym: --new-browser-per-episode and --reuse-browsers {args.reuse_browsers} contradict each "
                  "other", file=sys.stderr)
            return 2
        args.reuse_browsers = 0
    try:
        token = serving_token("cua-gym", args.host, args.token_file, args.insecure_no_token, GYM_TOKEN,
                              logging.getLogger("cua_rl.local_gym"))
    except TokenError as exc:
        print(f"cua-gym: {exc}", file=sys.stderr)
        return 2
    private_namespace()   # before any thread: the desktops' HOME mounts end with this process (mounts.py)
    try:   # bad options (GymOptions' checks, a bad task file) are a message, not a traceback
        opts = GymOptions(gym_id=args.gym_id, suite=args.suite, width=args.width, height=args.height,
                          max_executions=args.max_executions, pool_size=args.pool_size, max_spares=args.max_spares,
                          x_spares=args.x_spares, prewarm=[p for p in args.prewarm.split(",") if p], ttl_s=args.ttl,
                          tasks_dir=args.tasks_dir, display_base=args.display_base,
                          miniwob_time_limit_s=args.miniwob_time_limit, reuse_browsers=args.reuse_browsers,
                          restart_in_page=args.restart_in_page, live_view_host=args.live_view_host,
                          evaluate_timeout_s=args.evaluate_timeout, fork_wait_s=args.fork_wait)
        app = create_app(opts, token=token)
    except ValueError as exc:   # a bad option or task file: say which and why, no traceback
        print(f"cua-gym: {exc}", file=sys.stderr)
        return 2
    DrainingServer(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level.lower(),
                                  timeout_graceful_shutdown=5, timeout_keep_alive=KEEP_ALIVE_S)).run()
    return 0


def _check(args) -> int:
    import asyncio

    from cua_rl.genv.conformance import check_gym, summary

    setup_logging(logging.ERROR, areal=False)
    try:
        checks = asyncio.run(check_gym(args.url, args.gym_id, args.task, timeout_s=args.timeout))
    except TokenError as exc:
        print(f"cua-gym: {exc}", file=sys.stderr)
        return 2
    line, code = summary(checks, f"the gym at {args.url} (gym id {args.gym_id})")
    print(line)
    return code


if __name__ == "__main__":
    sys.exit(main())
