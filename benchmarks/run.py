"""The benchmark runner: ``python -m benchmarks [--quick] [--out DIR] [--no-peers]``.

Runs every workload of :mod:`benchmarks.workloads` in its own subprocess with a fresh temporary
directory, alternating systems run by run (the order rotates each repeat), and writes
``RESULTS.md``, ``results.json`` and ``cost_per_step.png`` into ``--out`` (default: this
directory). Peers that are not installed are skipped with a note.

The ``panel`` section starts a JupyterLab server and headless Chromium (tests/harness/lab.py);
``--quick`` leaves it out. The ``postgres`` and ``dask`` sections start one throw-away
PostgreSQL server (tests/postgres.py: Debian's server binaries, run through ``runuser -u
postgres`` as root) and give every measured run a fresh database on it; without PostgreSQL,
psycopg or dask.distributed they are skipped with a note. ``--only SECTIONS`` runs some
sections, ``--merge results.json`` reports earlier runs with this one's.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import report

ROOT = Path(__file__).resolve().parent.parent
STEP_SYSTEMS = ("plain", "diskcache", "durable_nb", "durable_nb_power", "dbos", "langgraph")
DURABLE = ("durable_nb", "dbos", "langgraph")
PEERS = {"dbos": "dbos", "langgraph": "langgraph.checkpoint.sqlite"}


@dataclass
class Plan:
    """What to measure, and how often."""

    ns: dict[str, tuple[int, ...]]
    repeats: dict[int, int]
    chat_calls: int
    chat_repeats: int
    transcript_rounds: int
    widget_steps: int
    widget_repeats: int
    restart_steps: int
    restart_repeats: int
    timeout: float
    #: the panel shown in JupyterLab in headless Chromium against no frontend (0: not run;
    #: it needs a JupyterLab server and a browser, more than a smoke run should start).
    panel_steps: int = 0
    panel_repeats: int = 7
    #: the batch: items x rounds against a loopback server answering after ``batch_delay``;
    #: (system, concurrency, repeats) in the order they run within a repeat.
    batch_items: int = 1_000
    batch_rounds: int = 3
    batch_delay: float = 0.2
    batch_runs: tuple[tuple[str, int, int], ...] = ()
    registry_runs: int = 100_000
    registry_repeats: int = 3
    #: the listings timed (None: every one of workloads.REGISTRY_OPS); each is a fresh
    #: process that imports the CLI (seconds: nbformat, see FINDINGS.md).
    registry_ops: tuple[str, ...] | None = None
    #: PostgreSQL: N and repeats of first run + replay, on one server the runner starts.
    pg_ns: tuple[int, ...] = (1_000, 10_000)
    pg_repeats: dict[int, int] = field(default_factory=lambda: {1_000: 5, 10_000: 3})
    #: Dask: items x rounds @ delay; (workers, threads per worker, Dask's worker profiler on)
    #: or (0, concurrency, _) for threads in one process without Dask; repeats of each.
    dask_items: int = 256
    dask_rounds: int = 2
    dask_delay: float = 0.2
    dask_runs: tuple[tuple[int, int, bool], ...] = ((1, 8, True), (2, 8, True), (4, 8, True),
                                                    (4, 8, False), (0, 32, True))
    dask_repeats: int = 3

    @classmethod
    def full(cls) -> "Plan":
        ours = (1_000, 10_000, 100_000)
        peers = (1_000, 10_000)
        # durability="power" syncs every step to the disk: 1k and 10k steps tell its cost.
        return cls(ns={"plain": ours, "diskcache": ours, "durable_nb": ours, "dbos": peers,
                       "langgraph": peers, "durable_nb_power": peers},
                   repeats={1_000: 5, 10_000: 3, 100_000: 3}, chat_calls=300, chat_repeats=5,
                   transcript_rounds=50, widget_steps=10_000, widget_repeats=7,
                   restart_steps=1_000, restart_repeats=3, timeout=600, panel_steps=20_000,
                   batch_runs=(("durable_nb", 32, 3), ("loopback_alone", 32, 3),
                               ("dbos", 32, 3), ("durable_nb", 8, 1), ("durable_nb", 64, 1),
                               ("durable_nb", 128, 3), ("loopback_alone", 128, 3)))

    @classmethod
    def quick(cls) -> "Plan":
        return cls(ns={s: (50,) for s in STEP_SYSTEMS}, repeats={50: 1}, chat_calls=5,
                   chat_repeats=1, transcript_rounds=4, widget_steps=50, widget_repeats=1,
                   restart_steps=20, restart_repeats=1, timeout=120, batch_items=12,
                   batch_rounds=2, batch_delay=0.02,
                   batch_runs=(("durable_nb", 4, 1), ("loopback_alone", 4, 1), ("dbos", 4, 1)),
                   registry_runs=300, registry_repeats=1, registry_ops=("runs", "scan"),
                   pg_ns=(20,), pg_repeats={20: 1},
                   dask_items=6, dask_rounds=1, dask_delay=0.02, dask_runs=((1, 2, True), (0, 2, True)),
                   dask_repeats=1)


@dataclass
class Results:
    """Raw results of every run, keyed ``section/system/n``; notes for skipped parts."""

    runs: dict[str, list[dict]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, section: str, system: str, n: int, result: dict) -> None:
        self.runs.setdefault(f"{section}/{system}/{n}", []).append(result)

    def get(self, section: str, system: str, n: int) -> list[dict]:
        return self.runs.get(f"{section}/{system}/{n}", [])


def workload(spec: dict, timeout: float) -> dict:
    """Run one workload in a fresh interpreter and return its result."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               DBOS__CLOUD="false")
    # The default configuration is measured (the test suite turns the replay check on).
    env.pop("DURABLE_NB_VERIFY_REPLAY", None)
    proc = subprocess.run([sys.executable, "-m", "benchmarks.workloads", json.dumps(spec)],
                          cwd=spec.get("dir") or ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("BENCH_RESULT ")]
    if not lines:
        raise RuntimeError(f"workload {spec} failed (exit {proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len("BENCH_RESULT "):])


def _rotated(items: list[str], by: int) -> list[str]:
    by %= max(len(items), 1)
    return items[by:] + items[:by]


def available_systems(peers: bool, results: Results) -> list[str]:
    systems = []
    for system in STEP_SYSTEMS:
        module = PEERS.get(system)
        if module is not None:
            if not peers:
                results.notes.append(f"{system}: skipped (--no-peers).")
                continue
            if importlib.util.find_spec(module.split(".")[0]) is None \
                    or importlib.util.find_spec(module) is None:
                results.notes.append(f"{system}: skipped, not installed "
                                     f"(pip install -e '.[bench]').")
                continue
        systems.append(system)
    return systems


def step_costs(plan: Plan, systems: list[str], results: Results, log: Any) -> None:
    """Sections 1, 2, 4 and 5: first run, replay in a fresh process, bytes, RSS."""
    all_ns = sorted({n for s in systems for n in plan.ns[s]})
    for n in all_ns:
        here = [s for s in systems if n in plan.ns[s]]
        for r in range(plan.repeats[n]):
            for system in _rotated(here, r):
                directory = tempfile.mkdtemp(prefix=f"bench-{system}-")
                try:
                    spec = {"system": system, "mode": "first", "n": n, "dir": directory}
                    results.add("first", system, n, workload(spec, plan.timeout))
                    if system in DURABLE:
                        replay = workload({**spec, "mode": "replay"}, plan.timeout)
                        results.add("replay", system, n, replay)
                finally:
                    shutil.rmtree(directory, ignore_errors=True)
                log(f"  N={n} repeat {r + 1}: {system} done")


@contextlib.contextmanager
def _loopback(serve: str, *args: str) -> Iterator[str]:
    """The URL of a loopback server run by the Python code ``serve`` (with ``args``) in
    another process, which prints ``LOOPBACK_URL=...`` first; stopped on exit."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    server = subprocess.Popen([sys.executable, "-c", serve, *args], env=env,
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert server.stdout is not None
        yield server.stdout.readline().strip().split("=", 1)[1]
    finally:
        server.terminate()
        server.wait()


# A loopback server answering BATCH_SCRIPT after sys.argv[1] seconds (sections 8 and 11).
_BATCH_SERVER = ("import sys; from durable_nb.testing import LoopbackServer; "
                 "from benchmarks.workloads import BATCH_SCRIPT; "
                 "s = LoopbackServer(BATCH_SCRIPT, delay=float(sys.argv[1])).bind(); "
                 "print(f'LOOPBACK_URL={s.url}', flush=True); s.serve_forever()")


def chat_cost(plan: Plan, results: Results, log: Any) -> None:
    """Section 3: ctx.chat against the bare client, same loopback server in another process."""
    # Without TCP_NODELAY the server's separate header and body writes meet the client's
    # delayed ACK: every reply stalled ~40 ms, hiding what is measured (reported to the lead).
    serve = ("import durable_nb.testing as t; t.server._Handler.disable_nagle_algorithm = True; "
             "t.main(['--script', 'demo'])")
    with _loopback(serve) as url:
        for r in range(plan.chat_repeats):
            for variant in _rotated(["bare", "ctx.chat"], r):
                directory = tempfile.mkdtemp(prefix="bench-chat-")
                try:
                    spec = {"system": "chat", "n": plan.chat_calls, "url": url,
                            "durable": variant == "ctx.chat", "dir": directory}
                    results.add("chat", variant, plan.chat_calls, workload(spec, plan.timeout))
                finally:
                    shutil.rmtree(directory, ignore_errors=True)
            log(f"  chat repeat {r + 1} done")


def transcript(plan: Plan, results: Results, before: Path | None) -> None:
    """Section 4b: journal growth over an agent transcript, with this checkout and, given
    ``--before DIR``, with another checkout of durable_nb ("before")."""
    versions = [("durable_nb", None)] + ([("before", before)] if before is not None else [])
    for name, path in versions:
        directory = tempfile.mkdtemp(prefix="bench-transcript-")
        try:
            spec = {"system": "transcript", "n": plan.transcript_rounds, "dir": directory}
            if path is not None:
                spec.update(durable_nb_path=str(path), version=_describe_checkout(path))
            results.add("transcript", name, plan.transcript_rounds, workload(spec, plan.timeout))
        finally:
            shutil.rmtree(directory, ignore_errors=True)


def _describe_checkout(path: Path) -> str:
    try:
        out = subprocess.run(["git", "-C", str(path), "log", "-1", "--format=%h %s"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip()[:80] or str(path)
    except (OSError, subprocess.SubprocessError):
        return str(path)


BATCH_SYSTEMS = {"durable_nb": "batch", "dbos": "batch_dbos", "loopback_alone": "loopback_alone"}


def batch(plan: Plan, results: Results, log: Any, peers: bool) -> None:
    """Section 8: a batch of items x LLM rounds against the loopback server (another
    process) answering after ``batch_delay``; each finished durable_nb batch is run again in
    a fresh process (every item answered from the journal)."""
    runs = [(system, c, n) for system, c, n in plan.batch_runs
            if system != "dbos" or (peers and importlib.util.find_spec("dbos") is not None)]
    if len(runs) < len(plan.batch_runs):
        results.notes.append("batch: DBOS skipped (not installed, or --no-peers).")
    with _loopback(_BATCH_SERVER, str(plan.batch_delay)) as url:
        for r in range(max((n for _, _, n in runs), default=0)):
            for system, concurrency, repeats in runs:
                if r >= repeats:
                    continue
                directory = tempfile.mkdtemp(prefix=f"bench-batch-{system}-")
                try:
                    spec = {"system": BATCH_SYSTEMS[system], "n": plan.batch_items,
                            "rounds": plan.batch_rounds, "concurrency": concurrency,
                            "delay": plan.batch_delay, "url": url, "dir": directory}
                    results.add("batch", system, concurrency, workload(spec, plan.timeout))
                    if system == "durable_nb":
                        again = workload({**spec, "mode": "rerun"}, plan.timeout)
                        results.add("batch_rerun", system, concurrency, again)
                finally:
                    shutil.rmtree(directory, ignore_errors=True)
                log(f"  batch {system} C={concurrency} repeat {r + 1} done")


def registry(plan: Plan, results: Results, log: Any) -> None:
    """Section 9: listings on a journal of ``registry_runs`` runs, each in a fresh process,
    the operations alternating."""
    from .workloads import REGISTRY_OPS

    directory = tempfile.mkdtemp(prefix="bench-registry-")
    try:
        spec = {"system": "registry", "mode": "make", "n": plan.registry_runs, "dir": directory}
        results.add("registry_make", "durable_nb", plan.registry_runs,
                    workload(spec, plan.timeout))
        log(f"  registry: {plan.registry_runs:,} runs made")
        for r in range(plan.registry_repeats):
            for op in _rotated(list(plan.registry_ops or REGISTRY_OPS), r):
                result = workload({**spec, "mode": "time", "op": op}, plan.timeout)
                results.add("registry", op, plan.registry_runs, result)
        log("  registry done")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


class Postgres:
    """The one PostgreSQL server of a benchmark invocation (tests/postgres.py's throw-away
    cluster, started on first use) and a fresh database per measured run."""

    def __init__(self, results: Results, log: Any) -> None:
        self.results, self.log = results, log
        self.server: Any = None
        self.why_not: str | None = None
        self._count = 0

    def start(self) -> bool:
        if self.server is not None or self.why_not is not None:
            return self.server is not None
        try:
            sys.path.insert(0, str(ROOT))
            from tests.postgres import PostgresServer, postgres_bin
        except ImportError as exc:  # pytest or psycopg missing
            self.why_not = f"tests/postgres.py cannot be imported ({exc})"
            return False
        finally:
            sys.path.remove(str(ROOT))
        if importlib.util.find_spec("psycopg") is None:
            self.why_not = "psycopg is not installed (pip install -e '.[bench,cluster]')"
            return False
        bin_dir = postgres_bin()
        if bin_dir is None:
            self.why_not = ("PostgreSQL is not installed (/usr/lib/postgresql/*/bin; "
                            "apt-get install postgresql)")
            return False
        self.server = PostgresServer(bin_dir).start()
        with self.server.connect() as conn:
            version = conn.execute("SHOW server_version").fetchone()[0]
            settings = {name: conn.execute(f"SHOW {name}").fetchone()[0] for name in
                        ("fsync", "synchronous_commit", "shared_buffers")}
        self.results.add("pg_server", "postgres", 0, {
            "version": version, "started_in": self.server.started_in, **settings})
        self.log(f"  PostgreSQL {version} started in {self.server.started_in:.1f} s "
                 f"(port {self.server.port})")
        return True

    def database(self, prefix: str) -> str:
        """A new empty database; its superuser URL (no password, trusted on 127.0.0.1)."""
        self._count += 1
        name = f"bench_{prefix}_{self._count}"
        with self.server.connect() as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.server.url.rsplit("/", 1)[0] + "/" + name

    def drop(self, url: str) -> None:
        with self.server.connect() as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {url.rsplit('/', 1)[1]} WITH (FORCE)")

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


PG_SYSTEMS = {"durable_nb_pg": "durable_nb", "dbos_pg": "dbos", "durable_nb": "durable_nb"}


def postgres(plan: Plan, pg: Postgres, results: Results, log: Any, peers: bool) -> None:
    """Section 10: first run and replay per step with the journal on PostgreSQL (durable_nb
    with ``journal="postgresql://..."``, DBOS with its system database there), each run on a
    fresh database of the one server, systems alternating; durable_nb on disk beside them."""
    if not pg.start():
        results.notes.append(f"postgres: skipped, {pg.why_not}.")
        return
    systems = list(PG_SYSTEMS)
    if not peers or importlib.util.find_spec("dbos") is None:
        systems.remove("dbos_pg")
        results.notes.append("postgres: DBOS skipped (not installed, or --no-peers).")
    for n in plan.pg_ns:
        for r in range(plan.pg_repeats[n]):
            for system in _rotated(systems, r):
                directory = tempfile.mkdtemp(prefix=f"bench-pg-{system}-")
                url = pg.database(system) if system != "durable_nb" else None
                try:
                    spec = {"system": PG_SYSTEMS[system], "mode": "first", "n": n,
                            "dir": directory, "url": url}
                    results.add("pg_first", system, n, workload(spec, plan.timeout))
                    replay = workload({**spec, "mode": "replay"}, plan.timeout)
                    results.add("pg_replay", system, n, replay)
                finally:
                    shutil.rmtree(directory, ignore_errors=True)
                    if url is not None:
                        pg.drop(url)
                log(f"  postgres N={n} repeat {r + 1}: {system} done")


def dask(plan: Plan, pg: Postgres, results: Results, log: Any) -> None:
    """Section 11: a batch through ``durable_nb.map(..., executor=client)`` on LocalClusters
    of 1, 2 and 4 worker processes, the journal on PostgreSQL (a fresh database per run), the
    loopback server (another process) answering after ``dask_delay``; threads in one
    process without Dask beside them."""
    if importlib.util.find_spec("distributed") is None:
        results.notes.append("dask: skipped, dask.distributed is not installed "
                             "(pip install -e '.[bench,cluster]').")
        return
    if not pg.start():
        results.notes.append(f"dask: skipped (it needs the PostgreSQL journal), {pg.why_not}.")
        return
    with _loopback(_BATCH_SERVER, str(plan.dask_delay)) as url:
        for r in range(plan.dask_repeats):
            for workers, threads, profile in _rotated(list(plan.dask_runs), r):
                journal = pg.database("dask")
                try:
                    spec = {"system": "dask_batch", "n": plan.dask_items,
                            "rounds": plan.dask_rounds, "delay": plan.dask_delay, "url": url,
                            "journal": journal, "workers": workers, "threads": threads,
                            "concurrency": threads, "profile": profile}
                    key = (f"w{workers}" + ("" if profile else "-noprofile") if workers
                           else "threads")
                    results.add("dask", key, workers * threads or threads,
                                workload(spec, plan.timeout))
                finally:
                    pg.drop(journal)
                what = (f"{workers} worker(s) x {threads} threads"
                        + ("" if profile else ", profiler off") if workers
                        else f"no Dask, {threads} threads")
                log(f"  dask {what} repeat {r + 1} done")


def notebook(plan: Plan, results: Results, log: Any) -> None:
    """Sections 6 and 7: the panel's cost and restart latency in a real kernel."""
    if importlib.util.find_spec("jupyter_client") is None:
        results.notes.append("widget and restart: skipped, jupyter_client is not installed.")
        return
    if importlib.util.find_spec("durable_nb.notebook.magics") is None:
        results.notes.append("TODO widget and restart: durable_nb.notebook.magics is not there yet.")
        return
    spec = {"system": "widget", "n": plan.widget_steps, "repeats": plan.widget_repeats}
    results.add("widget", "durable_nb", plan.widget_steps, workload(spec, plan.timeout))
    log("  widget done")
    for _ in range(plan.restart_repeats):
        spec = {"system": "restart", "n": plan.restart_steps}
        results.add("restart", "durable_nb", plan.restart_steps, workload(spec, plan.timeout))
    log("  restart done")


def panel(plan: Plan, results: Results, log: Any) -> None:
    """Section 12: the panel shown in a real JupyterLab in headless Chromium, against the same
    cell in a kernel with no frontend (benchmarks/kernel.py:browser)."""
    if not plan.panel_steps:
        results.notes.append("panel: not in --quick (it starts JupyterLab and Chromium); "
                             "python -m benchmarks --only panel measures it.")
        return
    sys.path.insert(0, str(ROOT))
    try:
        from tests.harness.lab import chromium_available
    finally:
        sys.path.remove(str(ROOT))
    if importlib.util.find_spec("jupyterlab") is None or not chromium_available():
        results.notes.append("panel: skipped, it needs jupyterlab, playwright and "
                             "/usr/bin/chromium (pip install -e '.[test]'; apt-get install "
                             "chromium).")
        return
    spec = {"system": "browser", "n": plan.panel_steps, "repeats": plan.panel_repeats}
    results.add("panel", "durable_nb", plan.panel_steps, workload(spec, plan.timeout))
    log("  panel done")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="tiny N and one repeat: a smoke run of seconds")
    parser.add_argument("--no-peers", action="store_true", help="skip DBOS and LangGraph")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent,
                        help="where RESULTS.md, results.json and the plot go")
    parser.add_argument("--before", type=Path, metavar="DIR",
                        help="a checkout of an earlier durable_nb (git worktree add DIR REV): "
                             "the transcript's journal growth is measured with it too")
    parser.add_argument("--only", default="",
                        help="comma-separated sections to run (steps, chat, transcript, "
                             "notebook, panel, batch, registry, postgres, dask; default: all; "
                             "none: no new runs)")
    parser.add_argument("--merge", type=Path, action="append", default=[], metavar="JSON",
                        help="results.json of earlier runs (e.g. of other --only sections) to "
                             "report with this one's; with --only none, only re-renders them")
    args = parser.parse_args(argv)
    plan = Plan.quick() if args.quick else Plan.full()
    results = Results()
    for path in args.merge:
        earlier = json.loads(path.read_text())
        for key, values in earlier["runs"].items():
            results.runs.setdefault(key, []).extend(values)
        results.notes += [n for n in earlier["notes"] if n not in results.notes]
    started = time.time()

    def log(text: str) -> None:
        print(f"[{time.time() - started:6.1f}s] {text}", flush=True)

    def section(name: str) -> None:
        """Log the section's start with the machine's load (other work on the 2 cores)."""
        load = os.getloadavg()[0]
        results.add("load", name, 0, {"loadavg_1min": load, "at": time.time()})
        log(f"{name} (load average {load:.2f})")

    only = {s.strip() for s in args.only.split(",") if s.strip()}
    wanted = lambda section: not only or section in only  # noqa: E731
    if wanted("steps"):
        systems = available_systems(not args.no_peers, results)
        section("steps")
        log(f"step costs: {', '.join(systems)}")
        step_costs(plan, systems, results, log)
    if wanted("chat"):
        section("chat")
        chat_cost(plan, results, log)
    if wanted("transcript"):
        section("transcript")
        transcript(plan, results, args.before)
    if wanted("notebook"):
        section("notebook")
        notebook(plan, results, log)
    if wanted("panel"):
        section("panel")
        panel(plan, results, log)
    if wanted("batch"):
        section("batch")
        batch(plan, results, log, not args.no_peers)
    if wanted("registry"):
        section("registry")
        registry(plan, results, log)
    pg = Postgres(results, log)
    try:
        if wanted("postgres"):
            section("postgres")
            postgres(plan, pg, results, log, not args.no_peers)
        if wanted("dask"):
            section("dask")
            dask(plan, pg, results, log)
    finally:
        pg.stop()
    command = "python -m benchmarks" + "".join(f" {a}" for a in (argv if argv is not None
                                                                  else sys.argv[1:]))
    if only != {"none"}:  # what this invocation ran, for a report merged from several
        results.add("invocation", "run", 0, {"command": command, "at": started,
                                             "seconds": time.time() - started,
                                             "checkout": report.checkout()})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(
        {"runs": results.runs, "notes": results.notes}, indent=1))
    plot = report.plot(results.runs, args.out / "cost_per_step.png")
    if plot is None:
        results.notes.append("plot: skipped, matplotlib is not installed.")
    markdown = report.markdown(results.runs, results.notes, command=command,
                               wall_seconds=time.time() - started, plot=plot)
    (args.out / "RESULTS.md").write_text(markdown)
    log(f"wrote {args.out / 'RESULTS.md'}")
    print(report.headline(results.runs))
