"""The run store: SQLAlchemy over a SQLite file (default, in the run directory) or PostgreSQL (``DATABASE_URL``).

Why this shape: the Training Monitor upserts every record by ``(project, client_id)`` so a rollout's
start, updates and end land on one row; a batch is applied in one transaction, so a bad link (a turn of
an unknown rollout) rolls the whole batch back and changes nothing. Writes go through one lock per store:
one server process owns the database, and SQLite allows one writer anyway. The schema is migrated with
Alembic at open, so a team database and a run directory's file are upgraded the same way.

Tokens are stored as SHA-256 hashes; the plain token is shown once, when it is created, and never stored.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, select
from sqlalchemy.engine import Connection, Engine

from .ingest import Batch, IngestError, Row
from .schema import BATCH_KINDS, TABLES, link_target, projects, tokens

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def database_url_from_env(environ: dict | None = None) -> str | None:
    """``DATABASE_URL``, else one built from ``POSTGRES_HOST/PORT/DB/USER/PASSWORD`` (as the tinker recipe)."""
    env = os.environ if environ is None else environ
    if env.get("DATABASE_URL"):
        return normalise_url(env["DATABASE_URL"])
    if env.get("POSTGRES_HOST") or env.get("POSTGRES_DB"):
        from sqlalchemy.engine import URL

        return URL.create("postgresql+psycopg", username=env.get("POSTGRES_USER"),
                          password=env.get("POSTGRES_PASSWORD"), host=env.get("POSTGRES_HOST", "localhost"),
                          port=int(env.get("POSTGRES_PORT", "5432")),
                          database=env.get("POSTGRES_DB", "training_db")).render_as_string(hide_password=False)
    return None


def normalise_url(url: str) -> str:
    """``postgresql://`` / ``postgres://`` use psycopg 3 (the driver we install)."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def sqlite_url(path: str | Path) -> str:
    return f"sqlite:///{Path(path).resolve()}"


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


def alembic_config(connection: Connection):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["connection"] = connection
    return cfg


class Store:
    """``Store.open(url)`` migrates to the newest revision; reads are plain dicts for the JSON API."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._write = threading.Lock()

    @classmethod
    def open(cls, url: str, *, migrate: bool = True) -> "Store":
        url = normalise_url(url)
        kwargs: dict[str, Any] = {"future": True}
        if url.startswith("sqlite"):
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
        else:
            kwargs.update(pool_pre_ping=True, pool_size=5, max_overflow=5)
        engine = create_engine(url, **kwargs)
        if url.startswith("sqlite"):
            event.listen(engine, "connect", _sqlite_pragmas)
        store = cls(engine)
        if migrate:
            store.migrate()
        return store

    def migrate(self) -> None:
        from alembic import command

        with self._write, self.engine.begin() as conn:
            command.upgrade(alembic_config(conn), "head")

    def revision(self) -> str | None:
        from alembic.runtime.migration import MigrationContext

        with self.engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()

    def close(self) -> None:
        self.engine.dispose()

    # ---- projects and tokens ------------------------------------------------------------------------
    def create_token(self, project: str, label: str | None = None) -> str:
        """A new token for ``project`` (created if missing); returns the plain token, which is not stored."""
        token = "cuam-" + secrets.token_urlsafe(32)
        with self._write, self.engine.begin() as conn:
            pid = conn.execute(select(projects.c.id).where(projects.c.name == project)).scalar()
            if pid is None:
                pid = conn.execute(projects.insert().values(name=project, created_at=_now())).inserted_primary_key[0]
            conn.execute(tokens.insert().values(project_id=pid, token_sha256=token_hash(token), label=(label or "")[:128] or None,
                                                created_at=_now()))
        return token

    def project_for_token(self, token: str) -> int | None:
        if not token:
            return None
        with self.engine.connect() as conn:
            return conn.execute(select(tokens.c.project_id).where(tokens.c.token_sha256 == token_hash(token))).scalar()

    def project_names(self) -> dict[int, str]:
        with self.engine.connect() as conn:
            return {r.id: r.name for r in conn.execute(select(projects.c.id, projects.c.name))}

    # ---- ingest ------------------------------------------------------------------------------------
    def ingest(self, project_id: int, batch: Batch) -> dict[str, Any]:
        """Apply a validated batch in one transaction; the reply of docs/protocols.md §4.1."""
        reply: dict[str, Any] = {}
        with self._write, self.engine.begin() as conn:
            if batch.training is not None:
                reply["training_id"] = self._training(conn, project_id, batch.training, batch.training_id)
            for kind in BATCH_KINDS:
                rows = batch.rows.get(kind)
                if rows:
                    reply[kind] = [{"client_id": r.client_id, "id": self._upsert(conn, project_id, kind, r)}
                                   for r in rows]
        return reply

    def _training(self, conn: Connection, project_id: int, row: Row, training_id: int | None) -> int:
        table = TABLES["trainings"]
        values = dict(row.values)
        if values.get("status") in ("completed", "failed", "cancelled") and "end_time" not in values:
            values["end_time"] = _now()
        if training_id is None:
            values.setdefault("start_time", _now())
            return conn.execute(table.insert().values(project_id=project_id, extra=row.extra or None, **values)
                                ).inserted_primary_key[0]
        current = conn.execute(select(table.c.id, table.c.extra).where(
            table.c.id == training_id, table.c.project_id == project_id)).first()
        if current is None:
            raise IngestError(f"training {training_id} does not exist in this project", 404)
        extra = {**(current.extra or {}), **row.extra} or None
        conn.execute(table.update().where(table.c.id == training_id).values(extra=extra, **values))
        return training_id

    def _resolve(self, conn: Connection, project_id: int, kind: str, field: str, value: Any, where: str) -> int:
        target = link_target(kind, field)
        table = TABLES[target]
        cond = table.c.id == value if isinstance(value, int) else table.c.client_id == value
        row = conn.execute(select(table.c.id).where(cond, table.c.project_id == project_id)).first()
        if row is None:
            raise IngestError(f"{where}.{field}: no {target[:-1]} {value!r} in this project")
        return row.id

    def _upsert(self, conn: Connection, project_id: int, kind: str, row: Row) -> int:
        table = TABLES[kind]
        where = f"{kind}[{row.client_id}]"
        values = {k: (self._resolve(conn, project_id, kind, k, v, where) if link_target(kind, k) else v)
                  for k, v in row.values.items()}
        if kind == "rollouts" and "training_id" not in values:
            values.update(self._rollout_training(conn, values))
        current = conn.execute(select(table.c.id, table.c.extra).where(
            table.c.project_id == project_id, table.c.client_id == row.client_id)).first()
        if current is None:
            return conn.execute(table.insert().values(project_id=project_id, client_id=row.client_id,
                                                      extra=row.extra or None, **values)).inserted_primary_key[0]
        if row.extra:
            values["extra"] = {**(current.extra or {}), **row.extra}
        if values:
            conn.execute(table.update().where(table.c.id == current.id).values(**values))
        return current.id

    @staticmethod
    def _rollout_training(conn: Connection, values: dict) -> dict:
        """A rollout's training, from its step, eval or baseline (the client need not repeat it)."""
        for field, kind in (("step_id", "steps"), ("eval_id", "evals"), ("baseline_id", "baselines")):
            if values.get(field) is not None:
                table = TABLES[kind]
                tid = conn.execute(select(table.c.training_id).where(table.c.id == values[field])).scalar()
                if tid is not None:
                    return {"training_id": tid}
        return {}


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")     # readers (the UI) never block the writer (ingest)
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
