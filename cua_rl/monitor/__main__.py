"""``cua-monitor``: serve the Training Monitor for a team, or make project tokens.

    cua-monitor serve [--host 127.0.0.1] [--port 8700] [--data-dir DIR] [--database-url URL]
    cua-monitor token --project NAME [--data-dir DIR] [--database-url URL]

The store is ``--database-url``, else ``DATABASE_URL`` (or ``POSTGRES_HOST/PORT/DB/USER/PASSWORD``), else
a SQLite file in ``--data-dir``; screenshots always go to ``<data-dir>/blobs``. Binds 127.0.0.1 unless
``--host`` says otherwise. A token is printed once, when made; only its hash is stored.

Reads (pages, JSON, screenshots) are open to whoever reaches the bound address unless ``MONITOR_READ_TOKEN``
is set in the server's environment: then every read needs it (open a page once with ``?token=...``; it
becomes a cookie). Set it on a team server bound beyond 127.0.0.1.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

DEFAULT_PORT = 8700


def _store_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", default="cua-monitor-data",
                   help="directory of the SQLite file (when no database URL is given) and of the screenshots "
                        "(default: ./cua-monitor-data)")
    p.add_argument("--database-url", default=None,
                   help="SQLAlchemy URL, e.g. postgresql://user:pw@host/db (default: DATABASE_URL or POSTGRES_* "
                        "variables, else <data-dir>/monitor.db)")


def _database_url(args) -> str | None:
    from .store import database_url_from_env, normalise_url

    return normalise_url(args.database_url) if args.database_url else database_url_from_env()


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="cua-monitor", description="Training Monitor server, run store and "
                                 "trajectory viewer of cua-rl.")
    sub = ap.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the ingest API and the viewer",
                           description="Serve the ingest API (POST /api/ingest/batch) and the viewer.")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1; 0.0.0.0 for a team)")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    serve.add_argument("--refresh", type=float, default=3.0, help="seconds between page refreshes (default 3)")
    serve.add_argument("--project", default=None,
                       help="also make a token for this project at start-up and print it once")
    _store_args(serve)
    token = sub.add_parser("token", help="make a project token (printed once)",
                           description="Make a bearer token for a project (created if missing); prints it once.")
    token.add_argument("--project", required=True)
    token.add_argument("--label", default=None, help="a note stored with the token's hash")
    _store_args(token)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    # Not cua_rl.logs.setup_logging: that one imports AReaL (torch, seconds) to patch its loggers, and this
    # process never loads AReaL. Same format.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)   # one INFO line per plugin at every start
    from pathlib import Path

    from .embedded import describe_url
    from .store import Store, sqlite_url

    data_dir = Path(args.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    url = _database_url(args) or sqlite_url(data_dir / "monitor.db")
    if args.command == "token":
        store = Store.open(url)
        try:
            print(store.create_token(args.project, label=args.label))
        finally:
            store.close()
        return 0
    import uvicorn

    from ..http.serve import KEEP_ALIVE_S
    from .blobs import BlobStore
    from .server import build_app

    store = Store.open(url)
    try:
        if args.project:
            print(f"token for project {args.project!r} (shown once): {store.create_token(args.project)}", flush=True)
        read_token = os.environ.get("MONITOR_READ_TOKEN") or None
        app = build_app(store, BlobStore(data_dir / "blobs"), refresh_s=args.refresh, read_token=read_token)
        reads = "reads need MONITOR_READ_TOKEN" if read_token else "reads open to whoever reaches this address"
        print(f"Training Monitor: http://{args.host}:{args.port}/  (store: {describe_url(url)}; {reads})", flush=True)
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_keep_alive=KEEP_ALIVE_S)
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
