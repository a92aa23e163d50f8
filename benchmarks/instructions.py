"""What one journaled step costs, in CPU instructions, in this checkout and in another commit.

``python -m benchmarks.instructions [--against REV] [--steps N]``: runs a run of N and of 2N
``ctx.run`` steps on a disk journal under ``valgrind --tool=callgrind``, once with this
checkout's durable_nb and once with REV's (checked out into a temporary git worktree), and
prints the main thread's instructions per step: (count for 2N - count for N) / N, so that
start-up and imports cancel out. Instructions, not seconds: the count is the same on a loaded machine,
which a timing is not, so a small difference between two commits can be read. What it does
not count: waiting on the disk (fsync) and the kernel's work in system calls.

Not a test: it reports figures, it asserts nothing. Needs valgrind (Debian's ``valgrind``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: A run of N steps, each a ``ctx.run`` returning a small dict, in a fresh disk journal.
WORKLOAD = """
import sys, tempfile
import durable_nb as dn
n = int(sys.argv[1])
def handler(ctx):
    for i in range(n):
        ctx.run("step", lambda: {"i": i, "text": "x" * 40})
    return n
dn.execute("bench", handler, journal=tempfile.mkdtemp(prefix="dnb-instr-"))
"""


def instructions(checkout: Path, steps: int) -> int:
    """Instructions the main thread executed in the workload with ``steps`` steps, durable_nb
    from ``checkout``. Only the main thread's: the run's background threads (the lease's
    heartbeat, watchers) wake on the clock, so how much they execute depends on how long the
    run took, which a loaded machine changes."""
    env = dict(os.environ, PYTHONPATH=str(checkout), PYTHONHASHSEED="0")
    with tempfile.TemporaryDirectory(prefix="dnb-callgrind-") as out:
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", "--separate-threads=yes",
             f"--callgrind-out-file={out}/cg.out", sys.executable, "-c", WORKLOAD, str(steps)],
            env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"the workload failed under callgrind:\n{done.stderr[-2000:]}")
        main_thread = Path(out) / "cg.out-01"
        found = re.search(r"^(?:summary|totals): (\d+)", main_thread.read_text(), re.MULTILINE)
    if found is None:
        raise SystemExit(f"callgrind wrote no count in {main_thread.name}")
    return int(found.group(1))


def per_step(checkout: Path, steps: int) -> float:
    return (instructions(checkout, 2 * steps) - instructions(checkout, steps)) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default=None,
                        help="a git revision to compare with (default: none)")
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: apt-get install valgrind")
    here = per_step(ROOT, args.steps)
    print(f"this checkout: {here:,.0f} instructions per step")
    if args.against:
        with tempfile.TemporaryDirectory(prefix="dnb-instr-rev-") as tmp:
            other = Path(tmp) / "rev"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach",
                            str(other), args.against], check=True)
            try:
                there = per_step(other, args.steps)
            finally:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                str(other)], check=True)
        print(f"{args.against}: {there:,.0f} instructions per step")
        print(f"difference: {here - there:+,.0f} ({(here - there) / there:+.2%})")


if __name__ == "__main__":
    main()
