"""``cua-agent serve --host 127.0.0.1 --port 3000`` (also ``python -m cua_rl.local_agent serve``).

A bearer token comes from ``--token-file FILE``, ``CUA_AGENT_TOKEN`` or ``CUA_AGENT_TOKEN_FILE``; an address other than
loopback without one is refused unless ``--insecure-no-token`` (cua_rl/http/auth.py, docs/security.md). The gyms its
runs drive get ``CUA_GYM_TOKEN`` (or ``CUA_GYM_TOKEN_FILE``'s) from its environment.
"""

from __future__ import annotations

import argparse
import logging
import sys

from .formats import format_names
from .runner import AgentSettings

from cua_rl.http.auth import AGENT_TOKEN, TokenError, serving_token
from cua_rl.logs import setup_logging


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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
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
