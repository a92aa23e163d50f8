"""How durable a journal is on disk: owner-only files, and durability="power" syncing to the
device before a step counts as journaled."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import durable_nb as dn


def test_value_files_and_their_folders_are_owner_only_under_a_permissive_umask(tmp_path):
    old = os.umask(0o022)
    try:
        big = "x" * 100_000  # over diskcache's inline limit: stored in a file of its own
        assert dn.execute("r", lambda ctx: len(ctx.run("big", lambda: big)),
                          journal=tmp_path / "j") == len(big)
    finally:
        os.umask(old)
    modes = {p.relative_to(tmp_path): stat.S_IMODE(p.stat().st_mode)
             for p in (tmp_path / "j").rglob("*")}
    value_files = [p for p in modes if p.suffix == ".val"]
    assert value_files, "the result was expected in a value file"
    assert all(mode == (0o700 if (tmp_path / p).is_dir() else 0o600) for p, mode in modes.items()), modes


_POWER = """
import os, sys, durable_nb as dn
synced = []
real_fsync = os.fsync
def counting_fsync(fd):
    synced.append(fd)
    return real_fsync(fd)
os.fsync = counting_fsync
journal = dn.open_journal(sys.argv[1], durability=sys.argv[2])
dn.execute("r", lambda ctx: ctx.run("big", lambda: "x" * 100_000), journal=journal)
mode = journal._cache._con.execute("PRAGMA synchronous").fetchone()[0]
value_files = sum(1 for _, _, files in os.walk(sys.argv[1]) for f in files if f.endswith(".val"))
print(mode, len(synced), value_files)
"""


def _power(tmp_path, durability):
    out = subprocess.run([sys.executable, "-c", _POWER, str(tmp_path / durability), durability],
                         capture_output=True, text=True, timeout=60, check=True).stdout.split()
    return int(out[0]), int(out[1]), int(out[2])


def test_power_durability_syncs_sqlite_fully_and_fsyncs_value_files(tmp_path):
    synchronous, fsyncs, value_files = _power(tmp_path, "power")
    # FULL; each value file (the step's result, the run record holding it) and its folder.
    assert synchronous == 2 and value_files >= 1 and fsyncs == 2 * value_files
    synchronous, fsyncs, value_files = _power(tmp_path, "process")
    assert synchronous == 1 and value_files >= 1 and fsyncs == 0  # NORMAL; no fsync of ours
