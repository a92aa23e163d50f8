import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from durable_nb import DiskJournal


@pytest.fixture
def journal(tmp_path):
    """A real diskcache journal in a fresh directory."""
    j = DiskJournal(tmp_path / "journal")
    yield j
    j.close()


def run_python(code: str, *args: str, env: dict | None = None, timeout: float = 60,
               check: bool = True) -> subprocess.CompletedProcess:
    """Run Python code in a child process of this interpreter."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


# Every run the suite finishes is executed once more in pure replay and must reproduce what
# it observed (durable_nb's always-replay check); child processes and kernels inherit it.
os.environ["DURABLE_NB_VERIFY_REPLAY"] = "1"

# Every journal a process opens is noted in the user's journal index (durable_nb.journal.index):
# the suite's thousands of temporary journals go to an index of its own, not the user's.
os.environ.setdefault("DURABLE_NB_INDEX", tempfile.mkdtemp(prefix="dnb-index-"))

# A developer's own notification channels (~/.config/durable-nb/notify.toml,
# DURABLE_NB_NOTIFY_*) never hear of the suite's parked runs: the tests that notify configure
# their own loopback receivers.
for _name in [n for n in os.environ if n.startswith("DURABLE_NB_NOTIFY_")]:
    del os.environ[_name]
os.environ["DURABLE_NB_NOTIFY_CONFIG"] = os.path.join(tempfile.mkdtemp(prefix="dnb-notify-"),
                                                      "notify.toml")


# --- the wheel of this checkout, built once per test run ----------------------------------

#: What ``pip wheel`` builds the package from (pyproject.toml's packages and data-files).
_WHEEL_SOURCES = ("pyproject.toml", "README.md", "durable_nb", "etc", "labextension/install.json")


@pytest.fixture(scope="session")
def durable_nb_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this checkout as ``pip wheel --no-deps`` builds it (an isolated build:
    pip fetches setuptools from its index or cache), built once per test run: pytest-xdist's
    workers share it through a lock. Built from a copy of the sources, so the checkout's
    ``build/`` and egg-info are never written while another test installs it editable."""
    from tests.harness.commands import run_setup

    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the run's base temp, common to its workers
    out = shared / "durable-nb-wheel"
    with open(shared / "durable-nb-wheel.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        built = sorted(out.glob("durable_nb-*.whl"))
        if built:
            return built[0]
        repo = Path(__file__).resolve().parents[1]
        source = Path(tempfile.mkdtemp(prefix="dnb-wheel-src-", dir=shared))
        for name in _WHEEL_SOURCES:
            if (repo / name).is_dir():
                shutil.copytree(repo / name, source / name,
                                ignore=shutil.ignore_patterns("__pycache__"))
            else:
                (source / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(repo / name, source / name)
        run_setup([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out),
                   str(source)], timeout=600)
        shutil.rmtree(source, ignore_errors=True)
        [wheel] = out.glob("durable_nb-*.whl")
        return wheel


# --- PostgreSQL: a real server for the session (tests/postgres.py) -----------------------

@pytest.fixture(scope="session")
def postgres_server():
    """A PostgreSQL server started for this test session and stopped at its end; skips the
    test without PostgreSQL installed (fails under CI=true)."""
    from tests.postgres import PostgresServer, require_postgres

    server = PostgresServer(require_postgres()).start()
    try:
        yield server
    finally:
        server.stop()
