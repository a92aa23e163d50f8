"""Crash fuzzing: SIGKILL an agent loop at random moments, resume it until DONE, check that
nothing journaled ran twice.

Each trial runs the fuzz agent of ``tests/agent_process.py`` (6 rounds of an LLM call through
the real openai client to a loopback server, 3 tool calls, a tally step and a state step: 37
steps) in a child process, SIGKILLs it after a random delay (seeded RNG), validates the
journal, and starts it again, up to ``--max-kills`` times, then lets it finish. A trial passes
when:

- after every kill, every journal entry reads back (no CorruptEntry) and the step keys on
  disk are exactly positions 0..n-1 (nothing half-written, no gap);
- after DONE, every journaled ``ctx.run`` step appears in the step log (ids appended by the
  steps before they return) once, and every LLM round was requested once, except the step
  in flight at a kill, which may have run once more per such kill;
- the result and the token total equal those of an uncrashed run.

Usage: ``python tests/fuzz/crash_fuzz.py --trials 300 [--seed N] [--max-kills 4]``. Prints
``trials=N kills=K duplicates_beyond_in_flight=0 corrupt=0 mismatched_results=0 ...`` and
exits non-zero on any failure. ``tests/test_crash_fuzz.py`` runs a short version of it.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

if __name__ == "__main__":  # run as a script: make `tests` and `durable_nb` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from diskcache.core import DBNAME

from durable_nb import serde
from durable_nb.journal import DiskJournal, Status, StepEntry
from durable_nb.testing import LoopbackServer
from tests.agent_process import (FUZZ_RUN_ID, fuzz_child, fuzz_script, kill, new_event,
                                 read_result, start, wait_ready)

# Seconds each tool pauses before and after its side effect, and the server before it
# answers: wide enough that random kills land inside those windows too.
TOOL_PAUSE = 0.002
SERVER_DELAY = 0.005
CHILD_TIMEOUT = 60.0


class CorruptJournal(AssertionError):
    """The journal on disk breaks its contract: an unreadable entry or a gap."""


@dataclass
class Baseline:
    """What an uncrashed run produces."""

    result: Any
    tokens: int
    shape: list[tuple[str, str]]  # (kind, name) per step
    seconds: float  # wall time of the child, from "ready" to exit
    startup: float  # of which before its first step began

    def kill_window(self, done: int) -> float:
        """Kill delays are drawn below this: a bit less than a child resuming after ``done``
        journaled steps takes, so most draws kill it somewhere in the steps still to go."""
        remaining = 1 - done / len(self.shape)
        return 0.9 * (self.startup + (self.seconds - self.startup) * remaining)


@dataclass
class FuzzReport:
    """Totals over all trials; ``ok`` when nothing failed."""

    seed: int
    trials: int = 0
    kills: int = 0
    in_flight_reruns: int = 0  # in-flight steps that did run again after the kill (allowed)
    duplicates_beyond_in_flight: int = 0
    corrupt: int = 0
    mismatched_results: int = 0
    miscounted_tokens: int = 0
    kill_sites: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures and self.kills > 0

    def summary(self) -> str:
        return (f"trials={self.trials} kills={self.kills} "
                f"duplicates_beyond_in_flight={self.duplicates_beyond_in_flight} "
                f"corrupt={self.corrupt} mismatched_results={self.mismatched_results} "
                f"miscounted_tokens={self.miscounted_tokens} "
                f"in_flight_reruns={self.in_flight_reruns} seed={self.seed}")


def read_journal(journal: DiskJournal) -> list[StepEntry]:
    """Every entry of the fuzz run, each parsed (CorruptEntry propagates), after checking
    that the step keys in the database are exactly positions 0..n-1."""
    entries = list(journal.steps(FUZZ_RUN_ID))
    journal.find_run(FUZZ_RUN_ID)  # the run record parses too
    db_path = journal.directory / DBNAME
    with closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)) as db:
        keys = [k for (k,) in db.execute("SELECT key FROM Cache WHERE key LIKE ?",
                                         (f"step:{FUZZ_RUN_ID}:%",))]
    positions = sorted(int(k.rsplit(":", 1)[1]) for k in keys)
    if positions != list(range(len(entries))):
        raise CorruptJournal(f"step keys on disk are {positions}, but entries 0..{len(entries) - 1} "
                             f"read back: a gap or a stray entry")
    return entries


def _log_counts(log: Path) -> Counter:
    return Counter(log.read_text().split()) if log.exists() else Counter()


def uncrashed_run(workdir: Path) -> Baseline:
    """Run the fuzz agent once without kills."""
    workdir.mkdir(parents=True, exist_ok=True)
    journal_dir = workdir / "journal"
    with LoopbackServer(fuzz_script(), delay=SERVER_DELAY) as server:
        ready = new_event()
        process = start(fuzz_child, str(journal_dir), server.url, str(workdir), TOOL_PAUSE,
                        ready)
        wait_ready(process, ready, CHILD_TIMEOUT)
        started_wall, started = time.time(), time.monotonic()
        process.join(CHILD_TIMEOUT)
        seconds = time.monotonic() - started
        if process.exitcode != 0:
            kill(process)
            raise AssertionError(f"the uncrashed fuzz run failed (exit code {process.exitcode})")
    journal = DiskJournal(journal_dir)
    try:
        record = journal.get_run(FUZZ_RUN_ID)
        entries = read_journal(journal)
    finally:
        journal.close()
    return Baseline(read_result(workdir), record.tokens, [(e.kind, e.name) for e in entries],
                    seconds, max(0.0, entries[0].started_at - started_wall))


_NO_NEW_STEP = "no new step begun yet (startup, lease, replay, request setup)"


def _kill_site(shape: list[tuple[str, str]], position: int, progressed: bool, *,
               effect_seen: bool, request_seen: bool) -> str:
    """Where a kill landed, for the report."""
    if position >= len(shape):
        return "after the last step"
    kind = shape[position][0]
    if kind == "run":
        return ("tool/run: after its side effect, before its journal write" if effect_seen
                else "tool/run: before its side effect" if progressed
                else _NO_NEW_STEP)
    if kind == "chat":
        return ("chat: request in flight" if request_seen
                else "chat: before the request" if progressed
                else _NO_NEW_STEP)
    return f"{kind} step"


def run_trial(workdir: Path, rng: random.Random, baseline: Baseline, max_kills: int,
              report: FuzzReport) -> list[str]:
    """One trial: kill and resume until DONE, then check. Adds to ``report``; returns the
    trial's problems (empty when it passed)."""
    journal_dir = workdir / "journal"
    problems: list[str] = []
    in_flight: Counter = Counter()  # position -> kills that found that step in flight
    kills = 0
    with LoopbackServer(fuzz_script(), delay=SERVER_DELAY) as server:
        journal = DiskJournal(journal_dir)
        try:
            while True:
                before = _Progress.now(journal, workdir / "steps.log", server)
                ready = new_event()
                process = start(fuzz_child, str(journal_dir), server.url, str(workdir),
                                TOOL_PAUSE, ready)
                if kills < max_kills and wait_ready(process, ready, CHILD_TIMEOUT):
                    process.join(rng.uniform(0.0, baseline.kill_window(before.done)))
                    if kill(process):
                        kills += 1
                        problem = _after_kill(journal, workdir / "steps.log", server, baseline,
                                              before, in_flight, report)
                        if problem:
                            problems.append(f"after kill {kills}: {problem}")
                            break
                        continue
                else:
                    process.join(CHILD_TIMEOUT)
                    if process.exitcode is None:
                        kill(process)
                        problems.append(f"the resumed run did not finish in {CHILD_TIMEOUT:g} s")
                        break
                if process.exitcode != 0:
                    error = workdir / "error.txt"
                    problems.append(f"the agent exited with code {process.exitcode}" + (
                        f": {error.read_text()[-2000:]}" if error.exists() else ""))
                    break
                problems += _check_finished(journal, workdir, server, baseline, in_flight, kills,
                                            report)
                break
        finally:
            journal.close()
    report.kills += kills
    report.trials += 1
    return problems


@dataclass
class _Progress:
    """What had happened before an attempt started: journaled steps, logged step ids, LLM
    requests per round."""

    done: int
    logged: Counter
    by_round: dict[str, int]

    @classmethod
    def now(cls, journal: DiskJournal, log: Path, server: LoopbackServer) -> "_Progress":
        return cls(len(list(journal.steps(FUZZ_RUN_ID))), _log_counts(log),
                   server.stats()["by_round"])


def _after_kill(journal: DiskJournal, log: Path, server: LoopbackServer, baseline: Baseline,
                before: _Progress, in_flight: Counter, report: FuzzReport) -> str | None:
    """Validate the journal after a kill and note which step was in flight; returns a
    problem if the journal is corrupt."""
    try:
        entries = read_journal(journal)
    except Exception as exc:  # CorruptEntry, CorruptJournal, bad JSON
        report.corrupt += 1
        return f"{type(exc).__name__}: {exc}"
    record = journal.find_run(FUZZ_RUN_ID)
    if record is not None and record.status is Status.DONE:
        report.kill_sites["after the run was DONE"] += 1
        return None
    n = len(entries)
    in_flight[n] += 1
    step_id = f"{FUZZ_RUN_ID}:{n}"
    round_ = sum(1 for kind, _ in baseline.shape[:n] if kind == "chat")
    report.kill_sites[_kill_site(
        baseline.shape, n, n > before.done,
        effect_seen=_log_counts(log)[step_id] > before.logged[step_id],
        request_seen=server.count(round=round_) > before.by_round.get(str(round_), 0))] += 1
    return None


def _check_finished(journal: DiskJournal, workdir: Path, server: LoopbackServer,
                    baseline: Baseline, in_flight: Counter, kills: int,
                    report: FuzzReport) -> list[str]:
    """The checks once the run finished; adds to ``report``, returns the problems."""
    problems = []
    try:
        entries = read_journal(journal)
    except Exception as exc:
        report.corrupt += 1
        return [f"after DONE: {type(exc).__name__}: {exc}"]
    record = journal.get_run(FUZZ_RUN_ID)
    if record.status is not Status.DONE:
        problems.append(f"the run ended {record.status}, not DONE: {record.error}")
    returned = read_result(workdir)
    stored = serde.decode(record.result) if record.result is not None else None
    if [(e.kind, e.name) for e in entries] != baseline.shape or returned != baseline.result \
            or stored != baseline.result:
        report.mismatched_results += 1
        problems.append(f"result or steps differ from the uncrashed run: returned {returned!r}, "
                        f"journaled {stored!r}, {len(entries)} steps")
    if record.tokens != baseline.tokens or \
            sum(e.prompt_tokens + e.completion_tokens for e in entries) != baseline.tokens:
        report.miscounted_tokens += 1
        problems.append(f"tokens counted {record.tokens}, uncrashed run {baseline.tokens}")

    # How often each journaled step really executed: run steps by the ids they logged,
    # LLM calls by the server's request count of their round.
    executed = _log_counts(workdir / "steps.log")
    run_ids = {f"{FUZZ_RUN_ID}:{e.position}" for e in entries if e.kind == "run"}
    for stray in sorted(set(executed) - run_ids):
        problems.append(f"step {stray} executed but is not a journaled run step")
    counts = {e.position: executed[f"{FUZZ_RUN_ID}:{e.position}"]
              for e in entries if e.kind == "run"}
    chat_positions = [p for p, (kind, _) in enumerate(baseline.shape) if kind == "chat"]
    counts.update({p: server.count(round=k) for k, p in enumerate(chat_positions)})
    for position, times in sorted(counts.items()):
        allowed = 1 + in_flight[position]
        kind = baseline.shape[position][0]
        if times == 0:
            problems.append(f"journaled {kind} step {position} never executed")
        elif times > allowed:
            report.duplicates_beyond_in_flight += times - allowed
            problems.append(f"{kind} step {position} executed {times} times, {allowed} at most "
                            f"allowed (once, plus once per kill that found it in flight: "
                            f"{in_flight[position]})")
        report.in_flight_reruns += min(times, allowed) - 1
    # A client killed while sending leaves the server a truncated body, counted as invalid;
    # any other invalid request (bad tool-call pairing after a resume) would be a bug, and
    # the child that sent it would have failed on the 400.
    invalid = server.count(kind="invalid")
    if invalid > kills:
        problems.append(f"{invalid} invalid requests reached the server, more than the "
                        f"{kills} kills can explain")
    return problems


def fuzz(trials: int, seed: int, root: Path, *, max_kills: int = 4, keep: bool = False,
         progress: Callable[[str], None] | None = None) -> FuzzReport:
    """Run ``trials`` crash trials in ``root`` (trial directories are removed when they pass,
    unless ``keep``) and return the totals. Trial i draws its kill delays from
    ``random.Random(f"{seed}:{i}")``."""
    report = FuzzReport(seed)
    # Twice: the first child also waits for the forkserver's imports, so only the second
    # one's timing is typical; both must return the same.
    first = uncrashed_run(root / "uncrashed-1")
    baseline = uncrashed_run(root / "uncrashed-2")
    if (first.result, first.tokens, first.shape) != (baseline.result, baseline.tokens,
                                                      baseline.shape):
        raise AssertionError(f"two uncrashed runs differ: {first} != {baseline}")
    if progress:
        progress(f"uncrashed run: {len(baseline.shape)} steps, {baseline.tokens} tokens, "
                 f"{baseline.seconds:.2f} s")
    for i in range(trials):
        workdir = root / f"trial-{i}"
        workdir.mkdir(parents=True)
        problems = run_trial(workdir, random.Random(f"{seed}:{i}"), baseline, max_kills, report)
        report.failures += [f"trial {i} (seed {seed}, dir {workdir}): {p}" for p in problems]
        if not problems and not keep:
            shutil.rmtree(workdir)
        if progress and (i + 1) % 25 == 0:
            progress(f"  {i + 1}/{trials} trials, {report.kills} kills, "
                     f"{len(report.failures)} failures")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--seed", type=int, default=None, help="default: a random seed (printed)")
    parser.add_argument("--max-kills", type=int, default=4, help="kills per trial at most")
    parser.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep passing trials' directories")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    root = Path(args.dir or tempfile.mkdtemp(prefix="durable-nb-crash-fuzz-"))
    print(f"crash fuzz: {args.trials} trials, up to {args.max_kills} kills each, seed={seed}, "
          f"dir={root}", flush=True)
    started = time.monotonic()
    report = fuzz(args.trials, seed, root, max_kills=args.max_kills, keep=args.keep,
                  progress=lambda line: print(line, flush=True))
    print("kills landed:", flush=True)
    for site, n in report.kill_sites.most_common():
        print(f"  {n:5d}  {site}")
    for failure in report.failures[:20]:
        print(f"FAIL {failure}")
    print(f"{report.summary()} seconds={time.monotonic() - started:.0f}")
    if report.ok and not args.dir and not args.keep:
        shutil.rmtree(root)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
