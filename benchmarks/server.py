"""``python -m benchmarks.server``: the Jupyter Server extension's listing with 10,000 runs.

Issue 19's target: the "Durable runs" sidebar lists its first page in under 200 ms on the
server side with 10,000 runs in the journal, and an idle sidebar (its poll of ``summary``)
costs the server nothing measurable.

A disk journal is filled with ``--runs`` runs of two steps each, as a team's journal looks
after a while: 12 waiting for approval (``--waiting``; each with a notification that failed),
3 running (their leases held by this process), 25 interrupted, 3 % failed, 0.6 % cancelled,
the rest done. A real ``jupyter server`` (a subprocess, the extension enabled,
``$DURABLE_NB_JOURNAL`` pointing at the journal) answers ``GET durable-nb/api/runs`` (first
page, 50 runs), ``GET runs?q=...`` (a search, which reads
every record) and ``GET summary``; the times are wall-clock of each request over loopback
(an upper bound of the server's own time), after one warm-up request. What an idle sidebar
costs is the server's CPU time over ``--idle`` seconds, measured three times: with nothing open (the server's own floor), with ``--streams``
open event streams (``GET events``, what the sidebar uses: the server's one watcher looks at
the journals each second and sends nothing while nothing changes) and with one 1 s poll of
``summary`` (the sidebar's fallback).
``--journal postgresql://...?schema=NAME`` measures an (empty) PostgreSQL journal instead.
``--journals N`` adds N more directory journals of 5 runs each to the server's journal index,
as a user's index looks after a few months of notebooks (each kernel's journal is noted
there): every listing and summary covers them all.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from durable_nb.journal import Journal, RunRecord, Status, StepEntry, open_journal
from durable_nb.execution.lease import Lease

TOKEN = "benchmark-token"


def fill(journal: Journal, runs: int, waiting: int = 12) -> list[Lease]:
    """``runs`` runs of two steps each in the mix of the module docstring (``waiting`` of
    them waiting for approval, each with a webhook delivery that failed); returns the
    leases held for the running ones (released by the caller)."""
    special = ([Status.WAITING_APPROVAL] * waiting + [Status.RUNNING] * 28
               + [Status.FAILED] * (runs * 3 // 100) + [Status.CANCELLED] * (runs * 6 // 1000))
    statuses = special + [Status.DONE] * (runs - len(special))
    start = time.time() - runs
    leases = []
    for i, status in enumerate(statuses):
        run_id = f"report-{i:06d}"
        created = start + (i * 7919 % runs)  # statuses spread over time
        record = RunRecord(run_id=run_id, title=f"weekly report {i}", status=status,
                           created_at=created, updated_at=created, iteration=1,
                           prompt_tokens=1200, completion_tokens=300,
                           notebook="/home/ana/reports/weekly.ipynb", cell_id=f"cell-{i % 40}")
        if status is Status.WAITING_APPROVAL:
            record.pending_approval = {"key": "2", "name": "send email",
                                       "details": {"to": f"team-{i}@example.com"},
                                       "digest": f"{i:064x}", "id": f"{i:032x}",
                                       "run_id": run_id, "requested_at": created}
        journal.create_run(record)
        if status is Status.WAITING_APPROVAL:
            journal.add_delivery(run_id, f"{i:032x}/webhook", {
                "channel": "webhook", "state": "failed", "digest": f"{i:064x}",
                "name": "send email", "claimed_at": created, "attempts": [
                    {"at": created, "took": 0.01, "ok": False,
                     "error": "HTTP 500 Internal Server Error"}] * 5})
        for position in range(2):
            record.step_count = position + 1
            journal.append_step(run_id, StepEntry(
                position, str(position), "chat" if position == 0 else "fetch",
                "chat" if position == 0 else "run", result={"text": "x" * 200},
                started_at=created, finished_at=created + 1), record_json=record.to_json())
        if status is Status.RUNNING and len(leases) < 3:
            leases.append(Lease.acquire(journal, run_id))
    return leases


def fill_index(work: Path, journals: int) -> None:
    """``journals`` directory journals of 5 runs each (one waiting for approval in every
    tenth), noted in the index at ``work / "index"`` as the kernels that opened them would."""
    os.environ["DURABLE_NB_INDEX"] = str(work / "index")
    for n in range(journals):
        journal = open_journal(work / "others" / f"notebook-{n:04d}")
        for i in range(5):
            status = Status.WAITING_APPROVAL if i == 0 and n % 10 == 0 else Status.DONE
            record = RunRecord(run_id=f"nb{n:04d}-run{i}", title=f"notebook {n} run {i}",
                               status=status, created_at=time.time() - 86400, iteration=1)
            if status is Status.WAITING_APPROVAL:
                record.pending_approval = {"key": "1", "name": "deploy", "details": {"n": n},
                                           "digest": f"{n:064x}", "id": f"{n:032x}",
                                           "run_id": record.run_id}
            journal.create_run(record)
        journal.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(journal: str, work: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    for name in ("config", "data", "runtime", "root"):
        (work / name).mkdir(exist_ok=True)
    env = {**os.environ, "DURABLE_NB_JOURNAL": journal,
           "DURABLE_NB_INDEX": str(work / "index"), "JUPYTER_CONFIG_DIR": str(work / "config"),
           "JUPYTER_DATA_DIR": str(work / "data"), "JUPYTER_RUNTIME_DIR": str(work / "runtime"),
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", f"--port={port}", "--ip=127.0.0.1",
         "--no-browser", "--allow-root", f"--IdentityProvider.token={TOKEN}",
         f"--ServerApp.root_dir={work / 'root'}",
         "--ServerApp.jpserver_extensions={'durable_nb.server': True}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 60
    while True:
        try:
            get(base, "api/status")
            return server, base
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                raise RuntimeError("jupyter server did not start") from None
            time.sleep(0.2)


def get(base: str, path: str) -> dict:
    request = urllib.request.Request(base + path, headers={"Authorization": f"token {TOKEN}"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def timed(base: str, path: str, repeat: int) -> dict:
    get(base, path)  # warm-up: journal opened, modules loaded
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        get(base, path)
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return {"median_ms": statistics.median(times), "min_ms": times[0],
            "p95_ms": times[int(len(times) * 0.95) - 1], "max_ms": times[-1]}


def open_streams(base: str, n: int) -> list[socket.socket]:
    """``n`` open ``GET events`` streams, each past its first summary event."""
    host, port = base.split("/")[2].split(":")
    streams = []
    for _ in range(n):
        sock = socket.create_connection((host, int(port)), timeout=60)
        sock.sendall(f"GET /durable-nb/api/events HTTP/1.1\r\nHost: {host}:{port}\r\n"
                     f"Authorization: token {TOKEN}\r\n\r\n".encode())
        received = b""
        while b"event: summary" not in received:
            received += sock.recv(65536)
        streams.append(sock)
    return streams


def idle_cost(server: subprocess.Popen, seconds: float, step: Callable[[], None]) -> float:
    """The server's CPU seconds over ``seconds`` of calling ``step`` each second."""
    before, t0 = cpu_seconds(server.pid), time.monotonic()
    while time.monotonic() - t0 < seconds:
        step()
        time.sleep(1.0)
    return cpu_seconds(server.pid) - before


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--waiting", type=int, default=12,
                        help="runs waiting for approval (each with a failed notification)")
    parser.add_argument("--idle", type=float, default=20.0,
                        help="seconds to measure the server's CPU over, with the streams open "
                             "and then with a 1 s summary poll")
    parser.add_argument("--journal", metavar="URL",
                        help="an empty postgresql://...?schema=NAME journal to fill and measure "
                             "instead of a temporary directory")
    parser.add_argument("--streams", type=int, default=1,
                        help="open event streams (sidebars) during the idle measurement")
    parser.add_argument("--journals", type=int, default=0,
                        help="more directory journals (5 runs each) in the server's index")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dnb-bench-server-") as folder:
        work = Path(folder)
        location = args.journal or str(work / "journal")
        journal = open_journal(location)
        t0 = time.perf_counter()
        leases = fill(journal, args.runs, args.waiting)
        print(f"filled {args.runs:,} runs in {time.perf_counter() - t0:.1f} s", flush=True)
        if args.journals:
            t0 = time.perf_counter()
            fill_index(work, args.journals)
            print(f"filled {args.journals:,} more journals in {time.perf_counter() - t0:.1f} s",
                  flush=True)
        server, base = start_server(location, work)
        try:
            first = get(base, "durable-nb/api/runs?limit=50")
            total = args.runs + 5 * args.journals
            assert first["total"] == total and len(first["runs"]) == 50, first["total"]
            results = {
                "runs first page (50)": timed(base, "durable-nb/api/runs?limit=50", args.repeat),
                "runs page 10 (50)": timed(base, "durable-nb/api/runs?limit=50&page=10",
                                           args.repeat),
                "runs search q=report-0099": timed(base, "durable-nb/api/runs?q=report-0099",
                                                   max(5, args.repeat // 3)),
                "summary": timed(base, "durable-nb/api/summary", args.repeat),
            }
            nothing = idle_cost(server, args.idle, lambda: None)
            streams = open_streams(base, args.streams)
            streamed = idle_cost(server, args.idle, lambda: None)
            for stream in streams:
                stream.close()
            polled = idle_cost(server, args.idle, lambda: get(base, "durable-nb/api/summary"))
        finally:
            server.terminate()
            server.wait(30)
            for lease in leases:
                lease.release()
    kind = "a PostgreSQL" if args.journal else "a disk"
    others = f" and {args.journals:,} more journals of 5 runs" if args.journals else ""
    print(f"\n{args.runs:,} runs in {kind} journal{others}; pending approvals listed first: "
          f"{first['pending_approvals']}")
    print(f"{'request':<30} {'median':>9} {'min':>9} {'p95':>9} {'max':>9}")
    for name, r in results.items():
        print(f"{name:<30} {r['median_ms']:8.1f}ms {r['min_ms']:8.1f}ms {r['p95_ms']:8.1f}ms "
              f"{r['max_ms']:8.1f}ms")
    for what, used in (("no sidebar (the server alone)", nothing),
                       (f"{args.streams} open event stream(s)", streamed),
                       ("a 1 s poll of summary (the fallback)", polled)):
        print(f"idle sidebar, {what}: {used * 1000:.0f} ms CPU in {args.idle:.0f} s "
              f"({used / args.idle * 100:.2f} % of one core)")
    target = results["runs first page (50)"]["median_ms"]
    print(f"target: first page < 200 ms: {target:.1f} ms, {'met' if target < 200 else 'MISSED'}")


if __name__ == "__main__":
    main()
