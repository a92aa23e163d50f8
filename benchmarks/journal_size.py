"""Bytes on disk per step and per run of the disk journal, against the payload.

``python -m benchmarks.journal_size [--steps 200] [--runs 2000]``: each workload writes a fresh
directory journal in a child process (so that SQLite's write-ahead log is checkpointed and
removed when it exits, as it is after any run) and reports the directory's bytes:

- ``ctx.run`` steps whose results are text of 4, 16 and 64 KiB (LLM-size results): disk
  bytes per step against the result's JSON (the payload);
- a chat loop: ``ctx.chat`` to the bundled loopback server answering 4 KiB of text per
  round, the reply appended to the conversation each round (as an agent does): disk bytes
  per round against the new content (the completion's JSON);
- small runs: many two-step runs of ~300 bytes each, bytes per run.

Where the bytes are: each workload also reports the journal's keys and values by kind (run
records, steps, blobs), as stored, and what SQLite adds (pages, indexes, free space).

Not a test: it prints figures; the goal (issue 42) is disk <= 1.5 x payload for results of
4 KiB and more.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WRITE_RESULTS = r"""
import json, random, string, sys
import durable_nb as dn
size, steps, where = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rnd = random.Random(size)
letters = string.ascii_letters + "      "
results = ["".join(rnd.choice(letters) for _ in range(size)) for _ in range(steps)]
def agent(ctx):
    for text in results:
        ctx.run("generate", lambda text=text: text)
dn.execute("sizes", agent, journal=where)
print(json.dumps({"payload": sum(len(json.dumps(r)) for r in results), "steps": steps}))
"""

WRITE_CHAT = r"""
import json, random, string, sys
import openai
import durable_nb as dn
from durable_nb.testing import LoopbackServer
size, rounds, where = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
rnd = random.Random(size)
letters = string.ascii_letters + "      "
replies = ["".join(rnd.choice(letters) for _ in range(size)) for _ in range(rounds)]
new_content = []
def agent(ctx):
    messages = [{"role": "system", "content": "You are a terse analyst."},
                {"role": "user", "content": "Write the report."}]
    for _ in range(rounds):
        reply = ctx.chat(model="loopback-1", messages=messages)
        new_content.append(len(reply.model_dump_json()))
        messages.append(dn.assistant_message(reply))
        messages.append({"role": "user", "content": "Go on."})
with LoopbackServer(replies) as server:
    client = openai.OpenAI(base_url=server.url, api_key="bench", max_retries=0)
    dn.execute("chat", agent, journal=where, client=client)
print(json.dumps({"payload": sum(new_content), "steps": rounds}))
"""

WRITE_SMALL_RUNS = r"""
import json, sys
import durable_nb as dn
runs, where = int(sys.argv[1]), sys.argv[2]
journal = dn.DiskJournal(where)
def agent(ctx):
    rows = ctx.run("fetch", lambda: {"region": "north", "rows": list(range(20))})
    return ctx.run("summarise", lambda: {"text": "revenue up 4% on Q2 " * 3, "n": len(rows)})
for i in range(runs):
    dn.execute(f"run-{i:06d}", agent, journal=journal)
journal.close()
print(json.dumps({"payload": 0, "steps": 2 * runs, "runs": runs}))
"""


def disk_bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


def by_kind(directory: Path) -> dict[str, int]:
    """Keys and values as stored, by key kind (``step``, ``blob``, ``run`` ...): what the
    journal holds, before SQLite's own pages and indexes. Read-only."""
    import sqlite3

    con = sqlite3.connect(f"file:{directory / 'cache.db'}?mode=ro", uri=True)
    try:
        rows = con.execute(
            "SELECT substr(key, 1, instr(key || ':', ':') - 1), "
            "sum(length(CAST(key AS BLOB)) + coalesce(length(CAST(value AS BLOB)), size)) "
            "FROM Cache GROUP BY 1").fetchall()
    finally:
        con.close()
    return {kind: total for kind, total in rows}


def measure(script: str, args: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="dnb-size-") as tmp:
        where = Path(tmp) / "journal"
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        done = subprocess.run([sys.executable, "-c", script, *args, str(where)], env=env,
                              capture_output=True, text=True, cwd=tmp)
        if done.returncode != 0:
            raise SystemExit(f"the workload failed:\n{done.stderr[-3000:]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        result["disk"] = disk_bytes(where)
        result["kinds"] = by_kind(where)
    return result


def rows(steps: int, runs: int) -> list[dict]:
    out = []
    for size in (4096, 16384, 65536):
        out.append({"what": f"ctx.run, {size // 1024} KiB results",
                    **measure(WRITE_RESULTS, [str(size), str(steps)])})
    out.append({"what": "ctx.chat loop, 4 KiB replies",
                **measure(WRITE_CHAT, ["4096", str(max(steps // 4, 10))])})
    out.append({"what": f"{runs:,} runs of 2 small steps", **measure(WRITE_SMALL_RUNS, [str(runs)])})
    return out


def table(results: list[dict]) -> str:
    lines = ["| workload | steps | disk B/step | payload B/step | disk / payload | "
             "disk B/run | stored (keys + values) by kind, B/step |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for r in results:
        steps, runs = r["steps"], r.get("runs", 1)
        kinds = ", ".join(f"{k} {v / steps:,.0f}" for k, v in sorted(r["kinds"].items()))
        ratio = f"{r['disk'] / r['payload']:.2f} x" if r["payload"] else ""
        payload = f"{r['payload'] / steps:,.0f}" if r["payload"] else ""
        lines.append(f"| {r['what']} | {steps:,} | {r['disk'] / steps:,.0f} | {payload} | "
                     f"{ratio} | {r['disk'] / runs:,.0f} | {kinds} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="steps per size (default 200)")
    parser.add_argument("--runs", type=int, default=2000, help="small runs (default 2,000)")
    args = parser.parse_args(argv)
    print(table(rows(args.steps, args.runs)))


if __name__ == "__main__":
    main()
