"""The measured workloads, each run in a fresh subprocess by :mod:`benchmarks.run`.

``python -m benchmarks.workloads SPEC_JSON`` runs one workload and prints one line
``BENCH_RESULT {json}`` as its last stdout line. A spec names a ``system`` and, for the step
systems, a ``mode``:

- ``first``: N no-op steps, each returning a ~200-byte dict, timed from the call that starts
  the run to the end of its last step. The durable systems then die with ``os._exit`` before
  the run finishes, leaving a journal to resume, as after a kernel crash.
- ``replay``: a fresh process resumes that run (timed from the resume call to its result),
  checks that no step ran again, and measures the store's size on disk.

Peak RSS growth is measured around the timed part (``ru_maxrss``).
"""

from __future__ import annotations

import json
import os
import resource
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any, Callable

PAYLOAD = {"step": 0, "tool": "lookup", "status": "ok", "score": 0.5, "tags": ["a", "b", "c"],
           "text": "lorem ipsum dolor sit amet, " * 5}

_executed = 0


def noop(i: int) -> dict:
    """The step body: no work, a ~200-byte result."""
    global _executed
    _executed += 1
    return {**PAYLOAD, "step": i}


def payload_bytes(n: int) -> int:
    """JSON size of the results of ``n`` steps."""
    return sum(len(json.dumps(noop(i), separators=(",", ":"))) for i in range(n))


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _dir_bytes(directory: Path, pattern: str = "*") -> int:
    # A connection another thread opened (the run's heartbeat) can outlive close() and keep
    # the write-ahead log; fold it into the database first so that every byte counts once.
    for database in directory.glob("*.db"):
        connection = sqlite3.connect(database)
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        connection.close()
    return sum(p.stat().st_size for p in directory.rglob(pattern) if p.is_file())


class _Clock:
    """Start, end and peak-RSS marks of the timed part."""

    def __init__(self) -> None:
        self.rss0 = _peak_rss_mb()
        self.t0 = time.perf_counter()
        self.t1: float | None = None

    def stop(self) -> None:
        self.t1 = time.perf_counter()

    def result(self, n: int, **extra: Any) -> dict:
        end = self.t1 if self.t1 is not None else time.perf_counter()
        seconds = end - self.t0
        return {"seconds": seconds, "us_per_step": seconds / max(n, 1) * 1e6,
                "rss_growth_mb": _peak_rss_mb() - self.rss0, "executed": _executed, **extra}


def _finish(result: dict) -> None:
    print("BENCH_RESULT " + json.dumps(result), flush=True)


def _crash(clock: _Clock, n: int) -> None:
    """End a first run as a crash would: report, then die before the run is finished."""
    clock.stop()
    _finish(clock.result(n))
    sys.stderr.flush()
    os._exit(0)


# -- the step systems ----------------------------------------------------------------------

def plain(spec: dict) -> dict:
    n = spec["n"]
    clock = _Clock()
    for i in range(n):
        noop(i)
    clock.stop()
    return clock.result(n)


def raw_diskcache(spec: dict) -> dict:
    import diskcache

    n = spec["n"]
    cache = diskcache.Cache(spec["dir"])
    clock = _Clock()
    for i in range(n):
        cache.set(f"step:{i}", json.dumps(noop(i), separators=(",", ":")))
    clock.stop()
    cache.close()
    return clock.result(n, disk_bytes=_dir_bytes(Path(spec["dir"])))


def durable(spec: dict) -> dict:
    from durable_nb.journal import DiskJournal
    from durable_nb.runner import Runner

    n, first = spec["n"], spec["mode"] == "first"
    journal = DiskJournal(spec["dir"])
    clock = _Clock()

    def handler(ctx: Any) -> int:
        for i in range(n):
            ctx.run("noop", noop, i)
        if first:
            _crash(clock, n)
        return n

    Runner("bench", handler, journal=journal).run()
    clock.stop()
    result = clock.result(n)
    if n <= 10_000:
        result["entry_bytes"] = sum(len(f"step:bench:{e.position}") + len(e.to_json())
                                    for e in journal.steps("bench"))
    journal.close()
    return {**result, "disk_bytes": _dir_bytes(Path(spec["dir"])),
            "payload_bytes": payload_bytes(n)}


def dbos(spec: dict) -> dict:
    import logging

    from dbos import DBOS, SetWorkflowID

    n, first = spec["n"], spec["mode"] == "first"
    # A replaying process is another executor, so that DBOS.launch() does not start the
    # recovery in the background before the clock runs; it is recovered explicitly below.
    DBOS(config={"name": "bench", "system_database_url": f"sqlite:///{spec['dir']}/dbos.sqlite",
                 "log_level": "WARNING", "executor_id": "local" if first else "replayer"})
    logging.getLogger("dbos").setLevel(logging.WARNING)
    clock: _Clock | None = None

    @DBOS.step()
    def step(i: int) -> dict:
        return noop(i)

    @DBOS.workflow()
    def workflow(count: int) -> int:
        for i in range(count):
            step(i)
        if first and clock is not None:
            _crash(clock, count)
        return count

    DBOS.launch()
    clock = _Clock()
    if first:
        with SetWorkflowID("bench"):
            workflow(n)
    handles = DBOS._recover_pending_workflows(["local"])
    assert len(handles) == 1, f"expected one pending workflow, found {len(handles)}"
    handles[0].get_result()
    clock.stop()
    result = clock.result(n)
    DBOS.destroy()
    return {**result, "disk_bytes": _dir_bytes(Path(spec["dir"]), "dbos.sqlite*"),
            "payload_bytes": payload_bytes(n)}


def langgraph(spec: dict) -> dict:
    import sqlite3

    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.func import entrypoint, task

    n, first = spec["n"], spec["mode"] == "first"
    conn = sqlite3.connect(f"{spec['dir']}/langgraph.sqlite", check_same_thread=False)
    clock: _Clock | None = None

    @task
    def step(i: int) -> dict:
        return noop(i)

    @entrypoint(checkpointer=SqliteSaver(conn))
    def workflow(count: int) -> int:
        for i in range(count):
            step(i).result()
        if first and clock is not None:
            _crash(clock, count)
        return count

    config = {"configurable": {"thread_id": "bench"}}
    clock = _Clock()
    # durability="sync": each task's result is written before the run goes on, the same
    # guarantee the other durable systems give (LangGraph's default "async" writes behind).
    workflow.invoke(n if first else None, config, durability="sync")
    clock.stop()
    result = clock.result(n)
    conn.close()
    return {**result, "disk_bytes": _dir_bytes(Path(spec["dir"]), "langgraph.sqlite*"),
            "payload_bytes": payload_bytes(n)}


# -- ctx.chat against the bare client ------------------------------------------------------

CHAT_MESSAGES = [{"role": "system", "content": "You are a terse sales analyst."},
                 {"role": "user", "content": "Summarise Q3 revenue by region in one line."}]


def chat(spec: dict) -> dict:
    import openai

    n = spec["n"]
    client = openai.OpenAI(base_url=spec["url"], api_key="bench", max_retries=0)
    request = {"model": "loopback-1", "messages": CHAT_MESSAGES}
    client.chat.completions.create(**request)  # connect and warm up outside the clock
    # ctx.chat counts the request's tokens; the tokenizer loads once per process, not per call.
    from durable_nb.tokens import count_message_tokens

    count_message_tokens(CHAT_MESSAGES, "loopback-1")
    if spec["durable"]:
        from durable_nb.runner import Runner

        clock = _Clock()

        def handler(ctx: Any) -> None:
            for _ in range(n):
                ctx.chat(client=client, **request)

        Runner("chat", handler, journal=spec["dir"]).run()
    else:
        clock = _Clock()
        for _ in range(n):
            client.chat.completions.create(**request)
    clock.stop()
    return clock.result(n)


# -- journal growth over an agent transcript -----------------------------------------------

def transcript(spec: dict) -> dict:
    """A ``rounds``-round tool-calling agent on the loopback server; journal bytes per round
    against the new content of each round and the size of each request."""
    import openai

    from durable_nb.journal import DiskJournal
    from durable_nb.runner import RunOptions, Runner
    from durable_nb.testing import LoopbackServer, Reply, ToolCall

    rounds = spec["n"]
    script = [Reply(content=f"Round {r}: checking.",
                    tool_calls=[ToolCall("lookup", {"query": f"region {r}"})])
              for r in range(rounds)]
    tools = [{"type": "function", "function": {
        "name": "lookup", "description": "Look a region up.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                       "required": ["query"]}}}]
    per_round: list[dict] = []
    entry_bytes = [0]

    class Meter:
        def on_step(self, entry: Any, replayed: bool) -> None:
            entry_bytes[0] += len(f"step:transcript:{entry.position}") + len(entry.to_json())

        def on_record(self, record: Any) -> None:
            pass

    def lookup(query: str) -> str:
        return f"{query}: revenue 1.2M, up 4% on Q2; top product widgets. " * 4

    def agent(ctx: Any) -> str:
        messages: list[dict] = [*CHAT_MESSAGES]
        for _ in range(rounds):
            before = entry_bytes[0]
            request_bytes = len(json.dumps(messages))
            reply = ctx.chat(model="loopback-1", messages=messages, tools=tools)
            message = reply.choices[0].message.model_dump(exclude_none=True)
            new_content = len(reply.model_dump_json())
            messages.append(message)
            for call in reply.choices[0].message.tool_calls or []:
                query = json.loads(call.function.arguments)["query"]
                output = ctx.run("lookup", lookup, query)
                new_content += len(json.dumps(output))
                messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
            per_round.append({"journal": entry_bytes[0] - before, "new_content": new_content,
                              "request": request_bytes})
        return "done"

    journal = DiskJournal(spec["dir"])
    with LoopbackServer(script) as server:
        client = openai.OpenAI(base_url=server.url, api_key="bench", max_retries=0)
        Runner("transcript", agent, journal=journal, observer=Meter(),
               options=RunOptions(client=client)).run()
    journal.close()
    return {"rounds": per_round, "disk_bytes": _dir_bytes(Path(spec["dir"]))}


SYSTEMS: dict[str, Callable[[dict], dict]] = {
    "plain": plain, "diskcache": raw_diskcache, "durable_nb": durable, "dbos": dbos,
    "langgraph": langgraph, "chat": chat, "transcript": transcript,
}


def main(argv: list[str]) -> None:
    spec = json.loads(argv[0])
    if spec["system"] in ("widget", "restart"):
        from . import kernel

        _finish(getattr(kernel, spec["system"])(spec))
    else:
        _finish(SYSTEMS[spec["system"]](spec))


if __name__ == "__main__":
    main(sys.argv[1:])
