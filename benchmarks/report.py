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
__all__ = ["headline", "machine", "markdown", "plot", "targets"]

Runs = dict[str, list[dict]]
SYSTEMS = ("plain", "diskcache", "durable_nb", "dbos", "langgraph")
PACKAGES = ("durable-nb", "diskcache", "dbos", "langgraph", "langgraph-checkpoint-sqlite",
            "openai", "ipykernel", "ipywidgets", "jupyter_client", "matplotlib")
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


def machine() -> list[str]:
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
            f"- Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}",
            "- Versions: " + ", ".join(versions)]


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
    for entry in _all(runs, "widget")[:1]:
        rows.append((f"panel overhead <= 10 % (N={entry['n']:,})",
                     f"{entry['overhead'] * 100:+.1f} %", entry["overhead"] <= 0.10))
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
    entries = _all(runs, "transcript")
    if not entries:
        return []
    rounds = entries[0]["rounds"]
    total = lambda key: sum(r[key] for r in rounds)  # noqa: E731
    tenth = max(len(rounds) // 5, 1)
    avg = lambda key, part: sum(r[key] for r in part) / len(part)  # noqa: E731
    return [f"### 4b. Journal growth over a {len(rounds)}-round agent transcript", "",
            "Each round: one `ctx.chat` with the whole conversation so far, one tool call via "
            "`ctx.run`. New content = the completion's JSON + the tool result's JSON.", "",
            "| | journal entries | new content | requests sent |", "|---|---:|---:|---:|",
            f"| total bytes | {total('journal'):,} | {total('new_content'):,} | "
            f"{total('request'):,} |",
            f"| per round, first {tenth} rounds | {avg('journal', rounds[:tenth]):,.0f} | "
            f"{avg('new_content', rounds[:tenth]):,.0f} | {avg('request', rounds[:tenth]):,.0f} |",
            f"| per round, last {tenth} rounds | {avg('journal', rounds[-tenth:]):,.0f} | "
            f"{avg('new_content', rounds[-tenth:]):,.0f} | "
            f"{avg('request', rounds[-tenth:]):,.0f} |", "",
            f"Journal / new content: {total('journal') / total('new_content'):.2f} x; the "
            f"requests (what a journal of inputs would hold) grow with the square of the "
            f"rounds: {total('request') / total('journal'):.1f} x the journal. On disk after "
            f"the run: {entries[0]['disk_bytes']:,} bytes.", ""]


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


def markdown(runs: Runs, notes: list[str], *, command: str, wall_seconds: float,
             plot: Path | None) -> str:
    """The whole RESULTS.md."""
    target_rows = targets(runs)
    lines = ["# Benchmarks", "",
             f"Produced by `{command}` on {time.strftime('%Y-%m-%d %H:%M %Z')} in "
             f"{wall_seconds / 60:.1f} min. Medians with (min..max) over runs; systems "
             f"alternate run by run, each run in a fresh process and a fresh temp directory.",
             "", *machine(), "",
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
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
