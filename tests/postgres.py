"""A real PostgreSQL server for the tests, started and stopped by the tests themselves.

Debian's ``postgresql`` package (``/usr/lib/postgresql/VERSION/bin``). ``initdb`` refuses to
run as root, so when the tests run as root the cluster lives in a temporary directory owned
by the ``postgres`` user and ``initdb``/``pg_ctl`` run through ``runuser -u postgres --``.
The server listens on 127.0.0.1 (a free port) and on a Unix socket in that directory.

Authentication is real on TCP: the superuser ``dnb`` is trusted (the tests' own
connections), every other role must give its password (SCRAM): :attr:`PostgresServer.password_url`
logs in as ``agent`` with a password.

Without PostgreSQL the tests that need it skip, except under ``CI=true``, where they fail:
CI must prove they ran (``.ci/run`` installs the package).

A test session killed before its teardown leaves its server running: each cluster directory
names the process that started it (``owner``), and starting a server stops and removes the
clusters whose owner is gone.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import pytest

_PREFIX = "dnb-pg-"
DATABASE = "dnb_test"
SUPERUSER = "dnb"
PASSWORD_ROLE = "agent"
#: The password role's password: characters that need percent-encoding in a URL on purpose.
PASSWORD = "s3cret@pw:/%x"


def postgres_bin() -> Path | None:
    """The newest ``/usr/lib/postgresql/*/bin`` that has ``initdb``, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parent.parent.name) if
                   Path(p).parent.parent.name.isdigit() else 0)
    return Path(found[-1]).parent if found else None


def require_postgres() -> Path:
    """The server binaries; skip the calling test without them (fail under CI=true)."""
    found = postgres_bin()
    if found is not None:
        return found
    why = "PostgreSQL is not installed (/usr/lib/postgresql/*/bin/initdb; apt-get install postgresql)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {why}; .ci/run installs it")
    pytest.skip(why)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PostgresServer:
    """One throw-away PostgreSQL cluster. ``start()`` then ``stop()`` (or use ``with``)."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.root: Path | None = None
        self.port = 0
        self.started_in = 0.0  # seconds from initdb to ready

    # -- URLs --------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The trusted superuser over TCP (no password)."""
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{DATABASE}"

    @property
    def password_url(self) -> str:
        """The ``agent`` role over TCP with its password (SCRAM authentication)."""
        return (f"postgresql://{PASSWORD_ROLE}:{quote(PASSWORD, safe='')}@127.0.0.1:"
                f"{self.port}/{DATABASE}")

    # -- lifecycle -----------------------------------------------------------------------

    def _as_postgres(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        command = list(args)
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if check and proc.returncode != 0:
            log = self.root / "log" if self.root else None
            tail = log.read_text()[-3000:] if log and log.exists() else ""
            raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n"
                               f"{proc.stderr}\n{tail}")
        return proc

    def _sweep(self) -> None:
        """Stop and remove clusters left by test sessions that died without their teardown."""
        for owner in Path(tempfile.gettempdir()).glob(f"{_PREFIX}*/owner"):
            try:
                os.kill(int(owner.read_text()), 0)
                continue  # its session is alive
            except ProcessLookupError:
                pass
            except (ValueError, OSError):
                continue
            root = owner.parent
            if (root / "data" / "postmaster.pid").exists():
                self._as_postgres(str(self.bin_dir / "pg_ctl"), "-D", str(root / "data"),
                                  "-m", "immediate", "-w", "stop", check=False)
            shutil.rmtree(root, ignore_errors=True)

    def start(self) -> "PostgresServer":
        began = time.monotonic()
        self._sweep()
        self.root = Path(tempfile.mkdtemp(prefix=_PREFIX))
        (self.root / "owner").write_text(str(os.getpid()))
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        data = self.root / "data"
        self._as_postgres(str(self.bin_dir / "initdb"), "-D", str(data), "-U", SUPERUSER,
                          "-E", "UTF8", "--locale=C", "--auth-local=trust",
                          "--auth-host=scram-sha-256")
        # The tests' superuser is trusted on TCP; every other role gives its password.
        hba = data / "pg_hba.conf"
        hba.write_text(f"local all all trust\n"
                       f"host all {SUPERUSER} 127.0.0.1/32 trust\n"
                       f"host all all 127.0.0.1/32 scram-sha-256\n")
        for attempt in range(5):
            self.port = _free_port()
            proc = self._as_postgres(
                str(self.bin_dir / "pg_ctl"), "-D", str(data), "-w", "-t", "60",
                "-o", f"-k {self.root} -p {self.port} -c listen_addresses=127.0.0.1",
                "-l", str(self.root / "log"), "start", check=attempt == 4)
            if proc.returncode == 0:
                break
        self._setup()
        self.started_in = time.monotonic() - began
        return self

    def _setup(self) -> None:
        import psycopg

        with psycopg.connect(f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/postgres",
                             autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DATABASE}")
            conn.execute(f"CREATE ROLE {PASSWORD_ROLE} LOGIN PASSWORD %s".replace(
                "%s", "'" + PASSWORD.replace("'", "''") + "'"))
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"GRANT CREATE ON DATABASE {DATABASE} TO {PASSWORD_ROLE}")

    def _pg_ctl(self, *args: str) -> None:
        self._as_postgres(str(self.bin_dir / "pg_ctl"), "-D", str(self.root / "data"), "-w",
                          "-t", "60", "-l", str(self.root / "log"), *args)

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every session is ended (the clients' connections fail
        their next query); the server is back, on the same port, when this returns."""
        self._pg_ctl("-m", "fast", "restart")

    def halt(self) -> None:
        """Stop the server (``-m fast``), keeping its data: :meth:`resume` starts it again."""
        self._pg_ctl("-m", "fast", "stop")

    def resume(self) -> None:
        """Start the server :meth:`halt` stopped, on the same port."""
        self._pg_ctl("-o", f"-k {self.root} -p {self.port} -c listen_addresses=127.0.0.1",
                     "start")

    def stop(self) -> None:
        if self.root is None:
            return
        try:
            self._as_postgres(str(self.bin_dir / "pg_ctl"), "-D", str(self.root / "data"),
                              "-m", "immediate", "-w", "stop", check=False)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def connect(self):
        """A psycopg connection as the superuser (autocommit)."""
        import psycopg

        return psycopg.connect(self.url, autocommit=True)

    def __enter__(self) -> "PostgresServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
