"""A throwaway Postgres cluster for the store's tests: started once per session, real server.

Debian's ``postgresql`` package provides ``initdb`` and ``pg_ctl``; they refuse to run as root,
so they run as the ``postgres`` user on a data folder it owns. The server listens on 127.0.0.1
(a free port) with trust authentication and ``fsync`` on, like a production server. Every test
gets a database of its own.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import pytest
from sqlalchemy import Engine, create_engine, make_url, text
from sqlalchemy.pool import NullPool

from tests.ports import free_port

USER = "postgres"


def _unavailable(why: str) -> NoReturn:
    """Skip, or fail where the binaries are required (TRAINGUARD_REQUIRE_BINARIES=1)."""
    if os.environ.get("TRAINGUARD_REQUIRE_BINARIES") == "1":
        pytest.fail(f"a Postgres server is required (TRAINGUARD_REQUIRE_BINARIES=1): {why}")
    pytest.skip(why)


def initdb() -> tuple[Path, pwd.struct_passwd]:
    """Debian's newest initdb, and the user it runs as (it refuses root)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not found:
        _unavailable("Postgres not installed (/usr/lib/postgresql/*/bin/initdb)")
    if os.geteuid() != 0:
        _unavailable("starting a Postgres server as its own user needs root (runuser)")
    try:
        return found[-1], pwd.getpwnam(USER)
    except KeyError:
        _unavailable(f"no {USER!r} user (Debian's postgresql package creates it)")


class Cluster:
    """A running cluster; :meth:`new_database` hands out empty databases."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._names = itertools.count()

    def url(self, database: str) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A new, empty database's URL."""
        return create_database(self.url("postgres"), f"t{os.getpid()}_{next(self._names)}")


def admin_engine(server_url: str) -> Engine:
    """An engine on the maintenance database of ``server_url``'s server, outside transactions
    (CREATE DATABASE, pg_terminate_backend)."""
    url = make_url(server_url).set(drivername="postgresql+psycopg", database="postgres")
    return create_engine(url, poolclass=NullPool, isolation_level="AUTOCOMMIT")


def create_database(server_url: str, name: str) -> str:
    """Create ``name`` on the server of ``server_url``; its URL."""
    engine = admin_engine(server_url)
    try:
        with engine.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        engine.dispose()
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


@contextmanager
def cluster() -> Iterator[Cluster]:
    initdb_path, postgres = initdb()
    bin_dir = initdb_path.parent
    # Not under pytest's tmp folder: that is root's alone and the server runs as postgres.
    root = Path(tempfile.mkdtemp(prefix="trainguard-postgres-"))
    os.chown(root, postgres.pw_uid, postgres.pw_gid)
    data = root / "data"

    log = root / "log"

    def as_postgres(*args: str) -> None:
        try:
            subprocess.run(
                ["runuser", "-u", USER, "--", *args],
                check=True,
                capture_output=True,
                text=True,
                timeout=120,
            )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            # The server's log goes with the folder: say what it said before it does.
            server_log = log.read_text()[-2000:] if log.exists() else ""
            stderr = exc.stderr if isinstance(exc.stderr, str) else ""
            raise RuntimeError(
                f"{Path(args[0]).name} failed: {exc}\n{stderr}\n{server_log}"
            ) from exc

    port = free_port()
    try:
        # --no-sync: only initdb's own files are not fsynced; the server runs with fsync on.
        as_postgres(str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", USER, "-N")
        options = f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=on"
        pg_ctl = str(bin_dir / "pg_ctl")
        try:
            as_postgres(pg_ctl, "-D", str(data), "-o", options, "-l", str(log), "-w", "start")
            yield Cluster(port)
        finally:
            # Also after a start that timed out: no server outlives its deleted folder.
            with contextlib.suppress(RuntimeError):
                as_postgres(pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop")
    finally:
        shutil.rmtree(root, ignore_errors=True)
