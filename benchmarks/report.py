"""RESULTS.md, the headline and the plot, from the raw results of :mod:`benchmarks.run`.

Every number is a median over runs with min..max beside it; ratios are ratios of medians
taken in the same invocation on the same machine.
"""

from __future__ import annotations

import os
import platform
import sqlite3
import statistics
import time
from importlib import metadata
from pathlib import Path

__all__ = ["checkout", "headline", "machine", "markdown", "plot", "targets"]

Runs = dict[str, list[dict]]
SYSTEMS = ("plain", "diskcache", "durable_nb", "durable_nb_power", "dbos", "langgraph")
PACKAGES = ("durable-nb", "diskcache", "dbos", "langgraph", "langgraph-checkpoint-sqlite",
            "openai", "ipykernel", "ipywidgets", "jupyter_client", "jupyterlab", "playwright",
            "matplotlib")
RSS_SLACK_MB = 5.0


def _values(runs: Runs, section: str, system: str, n: int, key: str) -> list[float]:
    return [r[key] for r in runs.get(f"{section}/{system}/{n}", []) if key in r]


def _ns(runs: Runs, section: str, system: str | None = None) -> list[int]:
    return sorted({int(k.split("/")[2]) for k in runs
                   if k.startswith(section + "/") and (system is None or k.split("/")[1] == system)})


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _cell(values: list[float], fmt: str = "{:.1f}") -> str:
    if not values:
        return "–"
    text = fmt.format(statistics.median(values))
    if len(values) > 1:
        text += f" ({fmt.format(min(values))}..{fmt.format(max(values))})"
    return text


def _ratio(a: float | None, b: float | None, fmt: str = "{:.3f}") -> str:
    return fmt.format(a / b) if a is not None and b else "–"


def _met(ok: bool | None) -> str:
    return "–" if ok is None else ("met" if ok else "**missed**")


def machine(runs: Runs | None = None) -> list[str]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = ""
    try:
        memory = f", {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB RAM"
    except (ValueError, OSError):
        pass
    versions = []
    for package in PACKAGES:
        try:
            versions.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{package} (not installed)")
    return [f"- Machine: {cpu}, {os.cpu_count()} cores{memory}; {platform.platform()}",
            "- durable_nb measured: " + ", ".join(sorted({
                r["checkout"] for r in (runs or {}).get("invocation/run/0", [])
                if r.get("checkout")}) or [checkout()]),
            f"- Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}",
            "- Versions: " + ", ".join(versions)]


def _load(runs: Runs) -> list[str]:
    """The machine's 1-minute load average as each section started (anything else running
    on the 2 cores shows here)."""
    found = [(k.split("/")[1], r) for k, v in runs.items() if k.startswith("load/") for r in v]
    if not found:
        return []
    found.sort(key=lambda x: x[1]["at"])
    return ["- Load average (1 min) as each section started: " + ", ".join(
        f"{name} {r['loadavg_1min']:.2f}" for name, r in found)]


def checkout() -> str:
    """The commit of the durable_nb measured (this checkout), and whether its durable_nb/
    had uncommitted changes."""
    import subprocess

    import durable_nb

    where = Path(durable_nb.__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(where), "log", "-1", "--format=%h %cs"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "durable_nb"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return str(where)
    if not head:
        return str(where)
    return f"commit {head}" + (" with uncommitted changes in durable_nb/" if dirty else "")


def targets(runs: Runs) -> list[tuple[str, str, bool | None]]:
    """(target, measured, met) for every target of the issue that was measured."""
    rows: list[tuple[str, str, bool | None]] = []
    us = lambda s, n, sec="first": _median(_values(runs, sec, s, n, "us_per_step"))  # noqa: E731
    for n in _ns(runs, "first", "durable_nb"):
        ours = us("durable_nb", n)
        for peer, limit in (("diskcache", 1.5), ("dbos", 0.1), ("langgraph", 0.1)):
            other = us(peer, n)
            if ours is not None and other:
                rows.append((f"step <= {limit} x {peer} (N={n:,})", f"{ours / other:.3f} x",
                             ours / other <= limit))
    replays = {n: us("durable_nb", n, "replay") for n in _ns(runs, "replay", "durable_nb")}
    replays = {n: v for n, v in replays.items() if v is not None}
    if replays:
        worst = max(replays.values())
        rows.append(("replay <= 40 us/step", f"{worst:.1f} us/step (worst N)", worst <= 40))
        if len(replays) > 1:
            spread = max(replays.values()) / min(replays.values())
            rows.append((f"replay flat from N={min(replays):,} to {max(replays):,} (<= 1.5 x)",
                         f"{spread:.2f} x", spread <= 1.5))
    n_bytes = max(_ns(runs, "replay", "durable_nb") or [0])
    disk = _median(_values(runs, "replay", "durable_nb", n_bytes, "disk_bytes"))
    payload = _median(_values(runs, "replay", "durable_nb", n_bytes, "payload_bytes"))
    if disk and payload:
        rows.append((f"journal on disk <= 1.5 x payload (N={n_bytes:,})",
                     f"{disk / payload:.2f} x", disk / payload <= 1.5))
    entry_ns = [n for n in _ns(runs, "replay", "durable_nb")
                if _values(runs, "replay", "durable_nb", n, "entry_bytes")]
    if entry_ns:
        n = max(entry_ns)
        logical = _median(_values(runs, "replay", "durable_nb", n, "entry_bytes"))
        payload = _median(_values(runs, "replay", "durable_nb", n, "payload_bytes"))
        if logical and payload:
            rows.append((f"journal entries (key + JSON) <= 1.5 x payload (N={n:,})",
                         f"{logical / payload:.2f} x", logical / payload <= 1.5))
    for n in _ns(runs, "first", "durable_nb_power"):
        power = us("durable_nb_power", n)
        ours = us("durable_nb", n)
        if power is not None and ours:
            rows.append((f"durability=\"power\" per step (N={n:,}; reported, no target)",
                         f"{power:,.0f} us ({power / ours:.1f} x \"process\")", None))
    for entry in runs.get(f"transcript/durable_nb/{max(_ns(runs, 'transcript') or [0])}", [])[:1]:
        rounds = entry["rounds"]
        tenth = max(len(rounds) // 5, 1)
        first = sum(r["journal"] for r in rounds[:tenth]) / tenth
        last = sum(r["journal"] for r in rounds[-tenth:]) / tenth
        rows.append((f"transcript: journal per round flat (last {tenth} / first {tenth} rounds "
                     f"<= 1.5 x)", f"{last / first:.2f} x", last / first <= 1.5))
    rss_ns = _ns(runs, "first", "durable_nb")
    if len(rss_ns) > 1:
        low = _median(_values(runs, "first", "durable_nb", rss_ns[0], "rss_growth_mb")) or 0
        high = _median(_values(runs, "first", "durable_nb", rss_ns[-1], "rss_growth_mb")) or 0
        rows.append((f"peak RSS not growing with N (N={rss_ns[-1]:,} vs {rss_ns[0]:,}, "
                     f"<= {RSS_SLACK_MB:g} MB more)", f"+{high - low:.1f} MB",
                     high - low <= RSS_SLACK_MB))
    rows += _batch_targets(runs)
    rows += _pg_targets(runs) + _dask_targets(runs)
    for entry in _all(runs, "widget")[:1]:
        rows.append((f"panel overhead <= 10 % (N={entry['n']:,})",
                     f"{entry['overhead'] * 100:+.1f} %", entry["overhead"] <= 0.10))
    panel = _panel(runs)
    if panel is not None:
        overhead = panel["overhead"]
        rows.append((f"panel shown in JupyterLab + Chromium within 10 % of no frontend "
                     f"(N={panel['n']:,})", f"{overhead * 100:+.1f} %", overhead <= 0.10))
    restarts = [e["to_first_new_step"] for e in _all(runs, "restart")]
    if restarts:
        rows.append(("re-run cell to first new step < 1 s", f"{statistics.median(restarts):.3f} s",
                     statistics.median(restarts) < 1.0))
    return rows


def _all(runs: Runs, section: str) -> list[dict]:
    return [r for k, v in runs.items() if k.startswith(section + "/") for r in v]


def _step_table(runs: Runs, section: str, title: str) -> list[str]:
    systems = [s for s in SYSTEMS if _ns(runs, section, s)]
    if not systems:
        return []
    lines = [title, "", "| N | " + " | ".join(systems) + " |",
             "|---:|" + "---:|" * len(systems)]
    for n in _ns(runs, section):
        lines.append(f"| {n:,} | " + " | ".join(
            _cell(_values(runs, section, s, n, "us_per_step")) for s in systems) + " |")
    return lines + [""]


def _ratio_table(runs: Runs) -> list[str]:
    peers = [s for s in ("plain", "diskcache", "dbos", "langgraph") if _ns(runs, "first", s)]
    lines = ["Ratios of medians, durable_nb first run / other system (same invocation):", "",
             "| N | " + " | ".join(f"/ {p}" for p in peers) + " |",
             "|---:|" + "---:|" * len(peers)]
    for n in _ns(runs, "first", "durable_nb"):
        ours = _median(_values(runs, "first", "durable_nb", n, "us_per_step"))
        lines.append(f"| {n:,} | " + " | ".join(
            _ratio(ours, _median(_values(runs, "first", p, n, "us_per_step")), "{:.3g}")
            for p in peers) + " |")
    return lines + [""]


def _replay_notes(runs: Runs) -> list[str]:
    lines = []
    for system in ("durable_nb", "dbos", "langgraph"):
        for n in _ns(runs, "replay", system):
            again = _values(runs, "replay", system, n, "executed")
            if again and max(again) > 0:
                lines.append(f"- {system} N={n:,}: the resumed run executed {max(again):g} "
                             f"step(s) again that had completed before the crash.")
    return lines


def _bytes_table(runs: Runs) -> list[str]:
    rows = []
    for system in ("diskcache", "durable_nb", "dbos", "langgraph"):
        section = "first" if system == "diskcache" else "replay"
        for n in _ns(runs, section, system):
            disk = _median(_values(runs, section, system, n, "disk_bytes"))
            payload = _median(_values(runs, "replay", "durable_nb", n, "payload_bytes"))
            if disk is None or not payload:
                continue
            logical = _median(_values(runs, section, system, n, "entry_bytes"))
            rows.append(f"| {system} | {n:,} | {payload / n:.0f} | {disk / n:.0f} | "
                        f"{disk / payload:.2f} | "
                        + (f"{logical / n:.0f} ({logical / payload:.2f} x)" if logical else "–")
                        + " |")
    if not rows:
        return []
    return ["### 4. Bytes per step", "",
            "Disk = the store's files after the run ended and the store was closed.", "",
            "| system | N | payload B/step | disk B/step | disk / payload | entry B/step |",
            "|---|---:|---:|---:|---:|---:|", *rows, ""]


def _transcript(runs: Runs) -> list[str]:
    n = max(_ns(runs, "transcript") or [0])
    versions = [(name, runs.get(f"transcript/{name}/{n}", [])[:1]) for name in
                ("durable_nb", "before")]
    versions = [(name, found[0]) for name, found in versions if found]
    if not versions:
        return []
    rounds = versions[0][1]["rounds"]
    tenth = max(len(rounds) // 5, 1)
    total = lambda rs, key: sum(r[key] for r in rs)  # noqa: E731
    avg = lambda rs, key: sum(r[key] for r in rs) / len(rs)  # noqa: E731
    lines = [f"### 4b. Journal growth over a {len(rounds)}-round agent transcript", "",
             "Each round: one `ctx.chat` with the whole conversation so far, one tool call via "
             "`ctx.run`. Journal = the run's entries and blobs as stored (keys and values), "
             "read from the store before and after each round. New content = the "
             "completion's JSON + the tool result's JSON.", "",
             "| | journal: total bytes | per round, first rounds | per round, last rounds | "
             "last / first | journal / new content |", "|---|---:|---:|---:|---:|---:|"]
    for name, entry in versions:
        rs = entry["rounds"]
        first, last = avg(rs[:tenth], "journal"), avg(rs[-tenth:], "journal")
        label = "this checkout" if name == "durable_nb" else f"before ({entry.get('version')})"
        lines.append(f"| {label} | {total(rs, 'journal'):,} | {first:,.0f} | {last:,.0f} | "
                     f"{last / first:.2f} x | {total(rs, 'journal') / total(rs, 'new_content'):.2f}"
                     f" x |")
    lines += [f"| new content | {total(rounds, 'new_content'):,} | "
              f"{avg(rounds[:tenth], 'new_content'):,.0f} | "
              f"{avg(rounds[-tenth:], 'new_content'):,.0f} | | |",
              f"| requests sent | {total(rounds, 'request'):,} | "
              f"{avg(rounds[:tenth], 'request'):,.0f} | {avg(rounds[-tenth:], 'request'):,.0f} "
              f"| | |", "",
              f"First / last = the first and last {tenth} rounds. The requests (what storing "
              f"each request whole would cost) grow with the square of the rounds. On disk "
              f"after the run: " + ", ".join(
                  f"{e['disk_bytes']:,} bytes ({'this checkout' if name == 'durable_nb' else 'before'})"
                  for name, e in versions) + ".", ""]
    return lines


def _batch_rows(runs: Runs) -> list[tuple[str, int, list[dict], list[dict]]]:
    rows = []
    for system in ("durable_nb", "loopback_alone", "dbos"):
        for c in _ns(runs, "batch", system):
            rows.append((system, c, runs.get(f"batch/{system}/{c}", []),
                         runs.get(f"batch_rerun/{system}/{c}", [])))
    return rows


def _batch_targets(runs: Runs) -> list[tuple[str, str, bool | None]]:
    rows: list[tuple[str, str, bool | None]] = []
    for system, c, done, again in _batch_rows(runs):
        if system != "durable_nb" or not done:
            continue
        ratio = statistics.median(r["seconds"] / r["ideal_seconds"] for r in done)
        if c == 32 or len(_ns(runs, "batch", "durable_nb")) == 1:
            rows.append((f"batch wall time <= 1.25 x ideal (C={c})", f"{ratio:.2f} x", ratio <= 1.25))
        if again:
            rerun = statistics.median(r["seconds"] for r in again)
            rows.append((f"re-running the finished batch < 3 s (C={c})", f"{rerun:.2f} s",
                         rerun < 3.0))
    return rows


def _batch(runs: Runs) -> list[str]:
    rows = _batch_rows(runs)
    if not rows:
        return []
    first = rows[0][2][0]
    lines = [f"### 8. A batch: {first['items']:,} items x {first['rounds']} LLM rounds", "",
             "`durable_nb.map(handler, items, concurrency=C)`, each round a `ctx.chat` against "
             "the loopback server (another process) answering after a fixed delay; ideal = "
             "items x rounds x delay / C. `loopback_alone`: the same calls from C threads with "
             "no durability (what the server and the client manage on this machine); `dbos`: "
             "the same batch as DBOS workflows on a queue of C (`worker_concurrency`), each "
             "round a `@DBOS.step`, default SQLite database. Re-run: the finished batch "
             "called again in a fresh process.", "",
             "| system | C | wall s | ideal s | / ideal | calls/s | peak RSS MB | re-run s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for system, c, done, again in rows:
        calls = first["items"] * first["rounds"]
        lines.append(
            f"| {system} | {c} | {_cell([r['seconds'] for r in done], '{:.2f}')} | "
            f"{done[0]['ideal_seconds']:.2f} | "
            f"{_cell([r['seconds'] / r['ideal_seconds'] for r in done], '{:.2f}')} | "
            f"{_cell([calls / r['seconds'] for r in done], '{:.0f}')} | "
            f"{_cell([r['peak_rss_mb'] for r in done], '{:.0f}')} | "
            f"{_cell([r['seconds'] for r in again], '{:.2f}') if again else '–'} |")
    return lines + [""]


def _registry(runs: Runs) -> list[str]:
    ns = _ns(runs, "registry")
    if not ns:
        return []
    n = ns[-1]
    made = runs.get(f"registry_make/durable_nb/{n}", [{}])[0]
    what = {"runs": "`durable_nb.runs()`: all runs", "runs_running": "`runs(\"running\")`",
            "runs_unfinished": "`runs((\"running\", \"waiting_approval\"))`",
            "runs_newest_50": "`runs(limit=50, newest_first=True)`",
            "scan": "the `%load_ext` scan (`describe_unfinished`)",
            "cli_runs_running": "`durable-nb runs --status running` (in-process)",
            "cli_runs": "`durable-nb runs`: every run (in-process)"}
    lines = [f"### 9. The registry at {n:,} runs", "",
             f"A journal of {n:,} runs (97 % DONE, 1.5 % FAILED, 1 % RUNNING, 0.5 % "
             f"WAITING_APPROVAL, 3 steps each; {made.get('disk_bytes', 0) / 2**20:,.0f} MB), "
             f"each listing in a fresh process (the journal opened, not the interpreter, in "
             f"the time).", "", "| listing | runs found | ms |", "|---|---:|---:|"]
    for op in what:
        found = runs.get(f"registry/{op}/{n}", [])
        if found:
            lines.append(f"| {what[op]} | {found[0]['found']:,} | "
                         f"{_cell([r['ms'] for r in found], '{:,.0f}')} |")
    return lines + [""]


PG_SYSTEMS = {"durable_nb_pg": "durable_nb, PostgreSQL", "dbos_pg": "DBOS, PostgreSQL",
              "durable_nb": "durable_nb, disk (reference)"}


def _pg_targets(runs: Runs) -> list[tuple[str, str, bool | None]]:
    rows: list[tuple[str, str, bool | None]] = []
    for n in _ns(runs, "pg_first", "durable_nb_pg"):
        ours = _median(_values(runs, "pg_first", "durable_nb_pg", n, "us_per_step"))
        dbos = _median(_values(runs, "pg_first", "dbos_pg", n, "us_per_step"))
        replay = _median(_values(runs, "pg_replay", "durable_nb_pg", n, "us_per_step"))
        dbos_replay = _median(_values(runs, "pg_replay", "dbos_pg", n, "us_per_step"))
        if ours is not None and dbos:
            rows.append((f"PostgreSQL: step, durable_nb / DBOS on the same server (N={n:,}; "
                         f"reported, no target)", f"{ours:,.0f} / {dbos:,.0f} us = "
                         f"{ours / dbos:.2f} x", None))
        if replay is not None and dbos_replay:
            rows.append((f"PostgreSQL: replay, durable_nb / DBOS (N={n:,}; reported, no "
                         f"target)", f"{replay:,.0f} / {dbos_replay:,.0f} us = "
                         f"{replay / dbos_replay:.2f} x", None))
    return rows


def _pg(runs: Runs) -> list[str]:
    ns = _ns(runs, "pg_first")
    if not ns:
        return []
    server = runs.get("pg_server/postgres/0", [{}])[0]
    systems = [s for s in PG_SYSTEMS if _ns(runs, "pg_first", s)]
    lines = ["### 10. PostgreSQL: durable_nb and DBOS on one server", "",
             f"One PostgreSQL {server.get('version', '?')} server started by the benchmark "
             f"(tests/postgres.py: a throw-away cluster on 127.0.0.1, TCP; default settings: "
             f"fsync={server.get('fsync', '?')}, synchronous_commit="
             f"{server.get('synchronous_commit', '?')}, shared_buffers="
             f"{server.get('shared_buffers', '?')}), on this machine, sharing its 2 cores with "
             f"the benchmark. Each run on a fresh database of it: durable_nb with "
             f"`journal=\"postgresql://...\"`, DBOS with `system_database_url` there. The "
             f"same no-op steps as section 1; replay in a fresh process as in section 2 (DBOS: "
             f"until its recovered workflow's last step). durable_nb on a journal directory "
             f"measured in the same rotation, for reference. us per step:", "",
             "| N | " + " | ".join(f"{PG_SYSTEMS[s]}: first run | replay" for s in systems)
             + " |", "|---:|" + "---:|---:|" * len(systems)]
    for n in ns:
        lines.append(f"| {n:,} | " + " | ".join(
            f"{_cell(_values(runs, 'pg_first', s, n, 'us_per_step'), '{:,.0f}')} | "
            f"{_cell(_values(runs, 'pg_replay', s, n, 'us_per_step'), '{:,.0f}')}"
            for s in systems) + " |")
    lines.append("")
    if "dbos_pg" in systems and "durable_nb_pg" in systems:
        lines += ["Ratios of medians, durable_nb / DBOS, both on PostgreSQL:", "",
                  "| N | first run | replay |", "|---:|---:|---:|"]
        for n in ns:
            m = lambda sec, s, n=n: _median(_values(runs, sec, s, n, "us_per_step"))  # noqa: E731
            lines.append(f"| {n:,} | {_ratio(m('pg_first', 'durable_nb_pg'), m('pg_first', 'dbos_pg'))}"
                         f" | {_ratio(m('pg_replay', 'durable_nb_pg'), m('pg_replay', 'dbos_pg'))} |")
        lines.append("")
    for system in systems:
        for n in ns:
            again = _values(runs, "pg_replay", system, n, "executed")
            if again and max(again) > 0:
                lines.append(f"- {system} N={n:,}: the resumed run executed {max(again):g} "
                             f"step(s) again.")
    return lines


def _dask_rows(runs: Runs) -> list[tuple[str, int, list[dict]]]:
    rows = []
    def order(key: str) -> tuple:
        workers = key[1:].split("-")[0]
        return (key == "threads", int(workers) if workers.isdigit() else 0, key)

    for key in sorted({k.split("/")[1] for k in runs if k.startswith("dask/")}, key=order):
        for c in _ns(runs, "dask", key):
            rows.append((key, c, runs[f"dask/{key}/{c}"]))
    return rows


def _dask_targets(runs: Runs) -> list[tuple[str, str, bool | None]]:
    rows = _dask_rows(runs)
    rate = {key: _median([r["items"] / r["seconds"] for r in done]) for key, _, done in rows
            if key != "threads"}
    if "w1" not in rate:
        return []
    out: list[tuple[str, str, bool | None]] = []
    for key, _, done in rows:
        if key == "threads" or key == "w1":
            continue
        k = int(key[1:].split("-")[0])
        off = ", Dask's worker profiler off" if key.endswith("-noprofile") else ""
        out.append((f"Dask: items/s with {k} worker processes{off} / 1 worker (ideal {k} x; "
                    f"reported, 2 cores)", f"{rate[key] / rate['w1']:.2f} x", None))
    return out


def _dask(runs: Runs) -> list[str]:
    rows = _dask_rows(runs)
    if not rows:
        return []
    first = rows[0][2][0]
    delay = first["ideal_seconds"] * first["concurrency"] / (first["items"] * first["rounds"])
    lines = [f"### 11. A batch on a Dask cluster: {first['items']:,} items x {first['rounds']} "
             f"LLM rounds @ {delay * 1000:.0f} ms", "",
             "`durable_nb.map(handler, items, executor=client, journal=\"postgresql://...\", "
             "concurrency=C)` on a `distributed.LocalCluster(n_workers=k, threads_per_worker=t, "
             "processes=True)`, C = k x t; each round a `ctx.chat` against the loopback server "
             "(another process) answering after a fixed delay; the journal on the PostgreSQL "
             "server of section 10 (a fresh database per run). The handler is a module-level "
             "function of benchmarks/workloads.py (Dask ships it by reference). Timed from the "
             "`map` call to its return, the cluster started and every worker warmed first "
             "(imports, tokenizer, first connection). ideal = items x rounds x delay / C. "
             "\"no Dask\": the same `map` on C threads in one process. **All on this machine's "
             "2 cores**: the workers, the scheduler, the process calling `map`, the loopback "
             "server and PostgreSQL.", "",
             "| executor | C | wall s | ideal s | / ideal | items/s | calls/s | cluster start s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for key, c, done in rows:
        what = ("no Dask (threads)" if key == "threads"
                else f"{key[1:].split('-')[0]} worker(s) x {done[0]['threads']} threads"
                + (", Dask's worker profiler off" if key.endswith("-noprofile") else ""))
        lines.append(
            f"| {what} | {c} | {_cell([r['seconds'] for r in done], '{:.2f}')} | "
            f"{done[0]['ideal_seconds']:.2f} | "
            f"{_cell([r['seconds'] / r['ideal_seconds'] for r in done], '{:.2f}')} | "
            f"{_cell([r['items'] / r['seconds'] for r in done], '{:.1f}')} | "
            f"{_cell([r['items'] * r['rounds'] / r['seconds'] for r in done], '{:.0f}')} | "
            f"{_cell([r['cluster_seconds'] for r in done], '{:.1f}')} |")
    return lines + [""]


def _rss_table(runs: Runs) -> list[str]:
    rows = []
    for system in SYSTEMS:
        for n in _ns(runs, "first", system):
            rows.append(f"| {system} | {n:,} | "
                        f"{_cell(_values(runs, 'first', system, n, 'rss_growth_mb'))} | "
                        f"{_cell(_values(runs, 'replay', system, n, 'rss_growth_mb'))} |")
    return ["### 5. Peak RSS growth during the run (MB)", "",
            "`ru_maxrss` at the end minus at the start of the timed part, in the run's own "
            "process (the step results are not kept by the loop).", "",
            "| system | N | first run | replay |", "|---|---:|---:|---:|", *rows, ""]


def _chat(runs: Runs) -> list[str]:
    ns = _ns(runs, "chat")
    if not ns:
        return []
    n = ns[0]
    bare = _values(runs, "chat", "bare", n, "us_per_step")
    ours = _values(runs, "chat", "ctx.chat", n, "us_per_step")
    mb, mo = _median(bare), _median(ours)
    return ["### 3. `ctx.chat` against a bare `client.chat.completions.create`", "",
            f"{n} calls per run to the loopback server (a separate process), same client and "
            f"request; times in ms per call.", "",
            "| bare | ctx.chat | ratio | journaling cost per call |", "|---:|---:|---:|---:|",
            f"| {_cell([v / 1000 for v in bare], '{:.3f}')} | "
            f"{_cell([v / 1000 for v in ours], '{:.3f}')} | {_ratio(mo, mb)} | "
            + (f"{mo - mb:.0f} us" if mo is not None and mb is not None else "–") + " |", ""]


def _kernel(runs: Runs) -> list[str]:
    lines = []
    for entry in _all(runs, "widget")[:1]:
        s = entry["seconds"]
        lines += [f"### 6. Panel cost: {entry['n']:,}-step loop in a real kernel", "",
                  "Loop time inside the kernel; `%%durable_agent` with its panel displayed "
                  "against `durable_nb.execute` with no panel (no frontend attached, so the "
                  "kernel's side: observer calls, redraws, comm messages).", "",
                  "| with panel (s) | without (s) | overhead |", "|---:|---:|---:|",
                  f"| {_cell(s['panel'], '{:.3f}')} | {_cell(s['no_panel'], '{:.3f}')} | "
                  f"{entry['overhead'] * 100:+.1f} % |", ""]
    restarts = _all(runs, "restart")
    if restarts:
        col = lambda key: _cell([e[key] for e in restarts], "{:.3f}")  # noqa: E731
        lines += [f"### 7. Restart latency on a {restarts[0]['n']:,}-step journal", "",
                  "A `%%durable_agent` cell dies after its steps; the kernel is restarted, the "
                  "setup cell (`import durable_nb`, `%load_ext durable_nb`) and the agent cell "
                  "re-run. Seconds:", "",
                  "| kernel restart | setup cell | agent cell sent -> first new step |",
                  "|---:|---:|---:|",
                  f"| {col('kernel_restart')} | {col('setup_cell')} | "
                  f"{col('to_first_new_step')} |", ""]
    return lines


def _panel(runs: Runs) -> dict | None:
    """Section 12's runs of every invocation pooled (each alternates its runs; on a loaded
    machine the loop's wall time varies by tens of percent from run to run), or None."""
    entries = _all(runs, "panel")
    if not entries:
        return None
    pool = lambda key: {v: [x for e in entries for x in e[key][v]]  # noqa: E731
                        for v in ("browser", "no-browser")}
    seconds = pool("seconds")
    # Each repeat ran one of each back to back: their ratio cancels the load's drift.
    paired = [b / n for e in entries
              for b, n in zip(e["seconds"]["browser"], e["seconds"]["no-browser"])]
    return {"n": entries[0]["n"], "invocations": len(entries), "seconds": seconds,
            "paired": statistics.median(paired) - 1,
            "kernel_cpu": pool("kernel_cpu"), "cpu_seconds": pool("cpu_seconds"),
            "done_shown_after": [x for e in entries for x in e["done_shown_after"]],
            "loadavg_1min": [x for e in entries for x in e["loadavg_1min"]],
            "overhead": statistics.median(seconds["browser"])
            / statistics.median(seconds["no-browser"]) - 1}


def _browser(runs: Runs) -> list[str]:
    lines = []
    entry = _panel(runs)
    if entry is not None:
        s, loads = entry["seconds"], entry["loadavg_1min"]
        lines += [f"### 12. The panel in a real browser: {entry['n']:,}-step loop", "",
                  "One `%%durable_agent` cell of N `ctx.run` no-op steps, its loop timed inside "
                  "the kernel: run with Shift+Enter in JupyterLab in headless Chromium, which "
                  "shows its panel, against the same cell in a kernel with no frontend "
                  "(jupyter_client), alternating run by run; the server and the browser stay up "
                  "for both. Every browser run ended showing the run's exact step counts. "
                  "\"DONE shown\": seconds from the loop's end until the page showed DONE. "
                  f"{len(s['browser'])} runs of each from {entry['invocations']} invocation(s), "
                  "pooled.", "",
                  "Overhead: ratio of the medians; paired: median of the ratios of the two "
                  "runs of each repeat.", "",
                  "| with the browser (s) | no frontend (s) | overhead | paired | DONE shown (s) "
                  "| load average (1 min) |", "|---:|---:|---:|---:|---:|---:|",
                  f"| {_cell(s['browser'], '{:.3f}')} | {_cell(s['no-browser'], '{:.3f}')} | "
                  f"{entry['overhead'] * 100:+.1f} % | {entry['paired'] * 100:+.1f} % | "
                  f"{_cell(entry['done_shown_after'], '{:.2f}')} | "
                  f"{min(loads):.2f}..{max(loads):.2f} |", ""]
        cpu, loop = entry["cpu_seconds"], entry["kernel_cpu"]
        used = lambda v, k: _cell([c[k] for c in cpu[v]], "{:.2f}")  # noqa: E731
        lines += ["CPU seconds during a run (they do not depend on what else the machine "
                  "runs, the loop's wall time does): the kernel process during the loop "
                  "(`time.process_time()`), and the processes other than the kernels (the "
                  "JupyterLab server, Chromium, playwright's driver; with no frontend they "
                  "idle) from the cell's start to its end (with the browser: until the page showed "
                  "DONE):", "",
                  "| | kernel, loop | server and browser |", "|---|---:|---:|",
                  *[f"| {name} | {_cell(loop[v], '{:.2f}')} | "
                    f"{used(v, 'server and browser')} |"
                    for name, v in (("with the browser", "browser"),
                                    ("no frontend", "no-browser"))], ""]
    return lines


def markdown(runs: Runs, notes: list[str], *, command: str, wall_seconds: float,
             plot: Path | None) -> str:
    """The whole RESULTS.md."""
    target_rows = targets(runs)
    ran = sorted(runs.get("invocation/run/0", []), key=lambda r: r["at"])
    if len(ran) > 1 or (ran and ran[0]["command"] != command):
        produced = (f"Produced by {len(ran)} invocation(s), "
                    + "; ".join(f"`{r['command']}` ({r['seconds'] / 60:.1f} min)" for r in ran)
                    + f", {sum(r['seconds'] for r in ran) / 60:.1f} min in all, reported by "
                      f"`{command}` on {time.strftime('%Y-%m-%d %H:%M %Z')}.")
    else:
        produced = (f"Produced by `{command}` on {time.strftime('%Y-%m-%d %H:%M %Z')} in "
                    f"{wall_seconds / 60:.1f} min.")
    lines = ["# Benchmarks", "",
             produced + " Medians with (min..max) over runs; systems alternate run by run, "
             "each run in a fresh process and a fresh temp directory.",
             "", *machine(runs), *_load(runs), "",
             "Each step returns a ~225-byte dict and does no work. durable_nb: `ctx.run` "
             "inside `Runner.run`; diskcache: `Cache.set(key, json)` per step, the floor with "
             "our store; DBOS: `@DBOS.step` in a `@DBOS.workflow`, default SQLite system "
             "database; LangGraph: `@task` in an `@entrypoint` with `SqliteSaver`, "
             "`durability=\"sync\"`.", "",
             "## Targets", "", "| target | measured | |", "|---|---:|---|",
             *[f"| {t} | {m} | {_met(ok)} |" for t, m, ok in target_rows], ""]
    if (Path(__file__).parent / "FINDINGS.md").exists():
        lines += ["Causes of the missed targets, with profiler evidence and proposed fixes: "
                  "[FINDINGS.md](FINDINGS.md).", ""]
    if plot is not None:
        lines += [f"![cost per step against N]({plot.name})", ""]
    lines += _step_table(runs, "first", "### 1. First run, us per step")
    lines += _ratio_table(runs)
    lines += _step_table(runs, "replay", "### 2. Replay in a fresh process, us per step\n\n"
                                         "The first run died (os._exit) after its last step; "
                                         "a new process resumes it, timed from the resume "
                                         "call to its result.")
    lines += _replay_notes(runs) + ([""] if _replay_notes(runs) else [])
    lines += _chat(runs) + _bytes_table(runs) + _transcript(runs) + _rss_table(runs)
    lines += _kernel(runs)
    lines += _batch(runs) + _registry(runs) + _pg(runs) + _dask(runs) + _browser(runs)
    if notes:
        lines += ["## Notes", "", *[f"- {n}" for n in notes], ""]
    return "\n".join(lines)


def headline(runs: Runs) -> str:
    """A few lines for the terminal."""
    return "\n".join(f"{t}: {m} ({_met(ok).strip('*')})" for t, m, ok in targets(runs))


def plot(runs: Runs, path: Path) -> Path | None:
    """us per step against N, first run and replay, one line per system; None without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    for ax, section, title in ((axes[0], "first", "first run"),
                               (axes[1], "replay", "replay in a fresh process")):
        for system in SYSTEMS:
            ns = _ns(runs, section, system)
            medians = [_median(_values(runs, section, system, n, "us_per_step")) for n in ns]
            if ns:  # one colour per system in both panels
                ax.plot(ns, medians, marker="o", label=system,
                        color=f"C{SYSTEMS.index(system)}")
        ax.set(xscale="log", yscale="log", xlabel="N steps", title=title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("µs per step (median)")
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
