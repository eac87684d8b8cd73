"""``cua-agent serve --host 127.0.0.1 --port 3000`` (also ``python -m cua_rl.local_agent serve``).

``cua-agent check URL --gym URL --gym-id ID`` checks that an agent service (ours or yours) implements what
docs/protocols.md §2.8 asks of one: a short run on one execution of that gym against a scripted model the check
serves itself (``--model-host``: the address an agent on another host reaches it at), then a cancelled run
(``cua_rl/mini_agent/conformance.py``); one line per check, exit 1 naming each that failed.

A bearer token comes from ``--token-file FILE``, ``CUA_AGENT_TOKEN`` or ``CUA_AGENT_TOKEN_FILE``; an address other than
loopback without one is refused unless ``--insecure-no-token`` (cua_rl/http/auth.py, docs/security.md). The gyms its
runs drive get ``CUA_GYM_TOKEN`` (or ``CUA_GYM_TOKEN_FILE``'s) from its environment.
"""

from __future__ import annotations

import argparse
import logging
import sys

from cua_rl.http.auth import AGENT_TOKEN, TokenError, serving_token
from cua_rl.logs import setup_logging

from .formats import format_names
from .runner import AgentSettings


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cua-agent", description="gbox-mini-agent-compatible agent service")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the agent API (POST /runs, GET /runs/{id}/events, ...)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=3000)
    serve.add_argument("--history-images", type=int, default=AgentSettings.history_images,
                       help="screenshots kept in the prompt, the current one included (default %(default)s)")
    serve.add_argument("--max-invalid-turns", type=int, default=AgentSettings.max_invalid_turns,
                       help="consecutive unusable model replies that end a run (default %(default)s)")
    serve.add_argument("--max-run-time", type=float, default=AgentSettings.max_run_time_s,
                       help="seconds a run may last when its payload sets no maxRunTimeSec (default %(default)s)")
    serve.add_argument("--max-concurrent-runs", type=int, default=AgentSettings.max_concurrent_runs)
    serve.add_argument("--no-token-hints", action="store_true",
                       help="do not ask the model endpoint for logprobs / return_token_ids")
    serve.add_argument("--token-file", default=None, metavar="FILE",
                       help=f"a file holding the bearer token every route but /health needs (else ${AGENT_TOKEN}, "
                            f"or the file ${AGENT_TOKEN}_FILE names); needed on an address other than loopback")
    serve.add_argument("--insecure-no-token", action="store_true",
                       help="serve on an address other than loopback without a token: anyone who reaches it can "
                            "start, read and cancel runs")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    check = sub.add_parser("check", help="check that the agent service at URL speaks the gbox-mini-agent protocol "
                                         "(docs/protocols.md §2.8): a short run and a cancelled one on the gym at "
                                         "--gym, against a scripted model served here; exit 1 naming each failure")
    check.add_argument("url", metavar="URL", help="the agent service's base URL (as --gbox-mini-url takes it)")
    check.add_argument("--gym", required=True, metavar="URL", help="a gym the agent can reach (its token: CUA_GYM_TOKEN)")
    check.add_argument("--gym-id", required=True, metavar="ID")
    check.add_argument("--task", default=None, metavar="ID", help="the task to play (default: the gym's first)")
    check.add_argument("--model-host", default=None, metavar="HOST",
                       help="this machine's address as the agent reaches it, for an agent on another host (the "
                            "scripted model then listens on every address; default: 127.0.0.1 only)")
    check.add_argument("--agent", default="qwen3-vl", metavar="NAME",
                       help="the prompt format sent as the run's agent; the scripted model answers qwen3-vl tool "
                            "calls (default %(default)s)")
    check.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                       help="the most the short run may take (default %(default)s)")
    return parser


def _check(args) -> int:
    import asyncio

    from cua_rl.genv.conformance import summary
    from cua_rl.mini_agent.conformance import check_agent

    setup_logging(logging.ERROR, areal=False)
    try:
        checks = asyncio.run(check_agent(args.url, args.gym, args.gym_id, args.task, model_host=args.model_host,
                                         agent=args.agent, timeout_s=args.timeout))
    except TokenError as exc:
        print(f"cua-agent: {exc}", file=sys.stderr)
        return 2
    line, code = summary(checks, f"the agent service at {args.url}")
    print(line)
    return code


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "check":   # a client: CUA_AGENT_TOKEN and CUA_GYM_TOKEN as the trainer's
        return _check(args)
    setup_logging(getattr(logging, args.log_level.upper(), logging.INFO), areal=False)
    import uvicorn  # imported late so `--help` stays fast

    from .server import create_app

    for name, low in (("history_images", 1), ("max_invalid_turns", 1), ("max_concurrent_runs", 1)):
        if getattr(args, name) < low:
            print(f"cua-agent: --{name.replace('_', '-')} must be >= {low}", file=sys.stderr)
            return 2
    try:
        token = serving_token("cua-agent", args.host, args.token_file, args.insecure_no_token, AGENT_TOKEN,
                              logging.getLogger(__name__))
    except TokenError as exc:
        print(f"cua-agent: {exc}", file=sys.stderr)
        return 2
    settings = AgentSettings(history_images=args.history_images, max_invalid_turns=args.max_invalid_turns,
                             max_run_time_s=args.max_run_time, max_concurrent_runs=args.max_concurrent_runs,
                             send_token_hints=not args.no_token_hints)
    logging.getLogger(__name__).info("agent service on http://%s:%d (agents: %s)", args.host, args.port,
                                     ", ".join(format_names()))
    uvicorn.run(create_app(settings, token=token), host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
