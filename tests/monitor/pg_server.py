"""A real PostgreSQL server for the run-store tests: Debian's binaries, a cluster in a temporary directory,
a loopback port, a password, stopped (and its files removed) afterwards.

Why a private cluster: tests must not depend on, or touch, a system database; initdb in a temp dir takes
about a second. PostgreSQL refuses to run as root, so as root the cluster belongs to the ``postgres``
user the Debian package creates, and the commands run through ``runuser``.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from cua_rl.http.serve import free_port


def pg_bin() -> Path:
    """The newest ``/usr/lib/postgresql/<version>/bin`` (Debian's layout)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if not found:
        raise RuntimeError("PostgreSQL is not installed (scripts/apt-packages-test.txt lists 'postgresql'; "
                           "run scripts/setup.sh)")
    return Path(found[-1]).parent


@dataclass
class PgServer:
    root: Path
    port: int
    user: str
    password: str
    run_as: str | None

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{self.user}:{self.password}@127.0.0.1:{self.port}/{database}"

    def _cmd(self, *args: str) -> list[str]:
        return ["runuser", "-u", self.run_as, "--", *args] if self.run_as else list(args)

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(f"host=127.0.0.1 port={self.port} user={self.user} password={self.password} "
                             "dbname=postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        try:
            subprocess.run(self._cmd(str(pg_bin() / "pg_ctl"), "-D", str(self.root / "data"), "-m", "immediate",
                                     "-w", "stop"), capture_output=True, timeout=60)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def start_postgres() -> PgServer:
    bin_dir = pg_bin()
    run_as = "postgres" if os.geteuid() == 0 else None
    root = Path(tempfile.mkdtemp(prefix="cua-pg-"))
    password = secrets.token_urlsafe(16)
    server = PgServer(root=root, port=free_port(), user="cua", password=password, run_as=run_as)
    try:
        (root / "pw").write_text(password)
        if run_as:
            uid, gid = pwd.getpwnam(run_as).pw_uid, pwd.getpwnam(run_as).pw_gid
            os.chown(root, uid, gid)
            os.chown(root / "pw", uid, gid)
        os.chmod(root, 0o700)
        subprocess.run(server._cmd(str(bin_dir / "initdb"), "-D", str(root / "data"), "-U", "cua",
                                   f"--pwfile={root / 'pw'}", "--auth=scram-sha-256", "-E", "UTF8",
                                   "--no-sync"), check=True, capture_output=True, timeout=120)
        opts = f"-c listen_addresses=127.0.0.1 -c port={server.port} -c unix_socket_directories={root} -c fsync=off"
        subprocess.run(server._cmd(str(bin_dir / "pg_ctl"), "-D", str(root / "data"), "-o", opts, "-l",
                                   str(root / "server.log"), "-w", "-t", "60", "start"),
                       check=True, capture_output=True, timeout=90)
    except BaseException as exc:
        log = root / "server.log"
        detail = log.read_text()[-2000:] if log.exists() else ""
        server.stop()
        if isinstance(exc, subprocess.CalledProcessError):
            raise RuntimeError(f"PostgreSQL did not start: {exc.stderr!r:.2000} {detail}") from exc
        raise
    deadline = time.monotonic() + 30
    while True:  # pg_ctl -w waited for readiness; a first connection proves the password works
        try:
            server.create_database("cua_probe")
            return server
        except Exception:
            if time.monotonic() > deadline:
                server.stop()
                raise
            time.sleep(0.2)
