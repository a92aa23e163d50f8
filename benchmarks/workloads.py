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
    """durable_nb's steps on a journal directory, or on PostgreSQL when ``spec["url"]`` is
    a ``postgresql://`` URL (the journal opened as ``journal="postgresql://..."`` opens it)."""
    from durable_nb.journal import DiskJournal, open_journal
    from durable_nb.runner import Runner

    n, first, url = spec["n"], spec["mode"] == "first", spec.get("url")
    if url:
        journal = open_journal(url)
    else:
        journal = DiskJournal(spec["dir"], durability=spec.get("durability", "process"))
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
    if url:
        journal.dispose()
        return {**result, "payload_bytes": payload_bytes(n)}
    if n <= 10_000:
        result["entry_bytes"] = sum(len(f"step:bench:{e.position}") + len(e.to_json())
                                    for e in journal.steps("bench"))
    journal.close()
    return {**result, "disk_bytes": _dir_bytes(Path(spec["dir"])),
            "payload_bytes": payload_bytes(n)}


def dbos(spec: dict) -> dict:
    import logging

    from dbos import DBOS, SetWorkflowID

    n, first, url = spec["n"], spec["mode"] == "first", spec.get("url")
    # A replaying process is another executor, so that DBOS.launch() does not start the
    # recovery in the background before the clock runs; it is recovered explicitly below.
    # ``spec["url"]``: a PostgreSQL system database instead of the default SQLite file.
    DBOS(config={"name": "bench",
                 "system_database_url": url or f"sqlite:///{spec['dir']}/dbos.sqlite",
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
        if clock is not None:
            clock.stop()  # the replay ends here (see below)
        return count

    DBOS.launch()
    clock = _Clock()
    if first:
        with SetWorkflowID("bench"):
            workflow(n)
    handles = DBOS._recover_pending_workflows(["local"])
    assert len(handles) == 1, f"expected one pending workflow, found {len(handles)}"
    # The recovered workflow runs in a thread of its own and its handle polls the database
    # for the result, by default every second: the clock stops in the workflow instead, at
    # the end of its last step (before DBOS writes its outcome), and the poll is kept slow
    # so as not to take the GIL from the replay.
    handles[0].get_result(polling_interval_sec=0.1)
    if clock.t1 is None:
        clock.stop()
    result = clock.result(n)
    DBOS.destroy()
    if url:
        return {**result, "payload_bytes": payload_bytes(n)}
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
    from durable_nb.llm.tokens import count_message_tokens

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

def _logical_bytes(journal: Any, run_id: str) -> int:
    """Bytes of the run's entries and blobs as stored (keys and values; value files by their
    size): what the journal holds for the run, however the version at hand lays it out."""
    total = 0
    for prefix in (f"step:{run_id}:", f"blob:{run_id}:"):
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        row = journal._cache._sql(
            "SELECT coalesce(sum(length(CAST(key AS BLOB)) + "
            "coalesce(length(CAST(value AS BLOB)), size)), 0) FROM Cache "
            "WHERE key >= ? AND key < ?", (prefix, end)).fetchone()
        total += row[0]
    return total


def transcript(spec: dict) -> dict:
    """A ``rounds``-round tool-calling agent on the loopback server: the journal's growth
    each round (its entries and blobs, read from the store) against the new content of the
    round and the size of the request sent. Runs on older versions of durable_nb too
    (``PYTHONPATH`` to another checkout): "before" and "after" a change of the layout."""
    import openai

    try:
        from durable_nb.journal import DiskJournal
    except ImportError:  # before the journal interface (d1affa2 and earlier)
        from durable_nb.journal import Journal as DiskJournal
    from durable_nb.runner import Runner, RunOptions
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
    journal = DiskJournal(spec["dir"])

    def lookup(query: str) -> str:
        return f"{query}: revenue 1.2M, up 4% on Q2; top product widgets. " * 4

    def agent(ctx: Any) -> str:
        messages: list[dict] = [*CHAT_MESSAGES]
        for _ in range(rounds):
            before = _logical_bytes(journal, "transcript")
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
            per_round.append({"journal": _logical_bytes(journal, "transcript") - before,
                              "new_content": new_content, "request": request_bytes})
        return "done"

    with LoopbackServer(script) as server:
        client = openai.OpenAI(base_url=server.url, api_key="bench", max_retries=0)
        Runner("transcript", agent, journal=journal, options=RunOptions(client=client)).run()
    journal.close()
    return {"rounds": per_round, "disk_bytes": _dir_bytes(Path(spec["dir"])),
            "version": spec.get("version", "this checkout")}


# -- a batch: items x LLM rounds against a slow loopback server --------------------------

BATCH_SCRIPT = ["round 0: looked it up.", "round 1: checked it.", "round 2: final answer."]


def _batch_client(spec: dict) -> Any:
    """One OpenAI client for every item, its connection pool as large as the concurrency
    (openai's default keeps 100 idle connections: more items in flight would reconnect)."""
    import httpx
    import openai

    size = max(int(spec["concurrency"]), 1)
    http = openai.DefaultHttpxClient(limits=httpx.Limits(max_connections=size * 2,
                                                         max_keepalive_connections=size * 2))
    return openai.OpenAI(base_url=spec["url"], api_key="bench", max_retries=0, http_client=http)


def _batch_messages(item: int, replies: list[str]) -> list[dict]:
    messages = [{"role": "user", "content": f"Summarise ticket {item} in one line."}]
    for reply in replies:
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "go on"}]
    return messages


def batch(spec: dict) -> dict:
    """``items`` x ``rounds`` ``ctx.chat`` calls through ``durable_nb.map(concurrency=C)``,
    timed from the call to its return; ``mode: "rerun"`` is the same call again in a fresh
    process once the batch is DONE (every item answered from the journal)."""
    import durable_nb

    items, rounds = spec["n"], spec["rounds"]
    client = _batch_client(spec)
    client.chat.completions.create(model="loopback-1", messages=_batch_messages(-1, []))
    from durable_nb.llm.tokens import count_message_tokens

    count_message_tokens(_batch_messages(0, []), "loopback-1")  # the tokenizer loads once

    def handler(ctx: Any, item: int) -> str:
        replies: list[str] = []
        for _ in range(rounds):
            reply = ctx.chat(model="loopback-1", messages=_batch_messages(item, replies))
            replies.append(reply.choices[0].message.content)
        return replies[-1]

    clock = _Clock()
    result = durable_nb.map(handler, range(items), batch_id="bench", key="index",
                            concurrency=spec["concurrency"], journal=spec["dir"], client=client)
    clock.stop()
    counts = result.counts
    assert counts == {"DONE": items}, counts
    out = clock.result(items * rounds, items=items, rounds=rounds,
                       concurrency=spec["concurrency"], peak_rss_mb=_peak_rss_mb())
    if spec.get("mode") != "rerun":
        out["ideal_seconds"] = items * rounds * spec["delay"] / spec["concurrency"]
    return out


def batch_dbos(spec: dict) -> dict:
    """The same batch as DBOS workflows on a queue of the same concurrency, each LLM round a
    ``@DBOS.step``, DBOS's default SQLite system database."""
    import logging

    from dbos import DBOS

    items, rounds, concurrency = spec["n"], spec["rounds"], spec["concurrency"]
    client = _batch_client(spec)
    client.chat.completions.create(model="loopback-1", messages=_batch_messages(-1, []))
    DBOS(config={"name": "bench", "system_database_url": f"sqlite:///{spec['dir']}/dbos.sqlite",
                 "log_level": "WARNING", "max_executor_threads": concurrency + 8})
    logging.getLogger("dbos").setLevel(logging.WARNING)

    @DBOS.step()
    def chat(item: int, replies: list[str]) -> str:
        reply = client.chat.completions.create(model="loopback-1",
                                               messages=_batch_messages(item, replies))
        return reply.choices[0].message.content

    ends: list[float] = []

    @DBOS.workflow()
    def ticket(item: int) -> str:
        replies: list[str] = []
        for _ in range(rounds):
            replies.append(chat(item, replies))
        ends.append(time.perf_counter())
        return replies[-1]

    DBOS.launch()
    queue = DBOS.register_queue("bench", worker_concurrency=concurrency,
                                polling_interval_sec=0.05)
    clock = _Clock()
    handles = [queue.enqueue(ticket, item) for item in range(items)]
    for handle in handles:
        handle.get_result(polling_interval_sec=0.1)
    # The batch ends with its last item's last step, not at the handles' next poll (every
    # 0.1 s here, a second by default): a handle polls the database for its result.
    clock.t1 = max(ends)
    out = clock.result(items * rounds, items=items, rounds=rounds, concurrency=concurrency,
                       peak_rss_mb=_peak_rss_mb(),
                       ideal_seconds=items * rounds * spec["delay"] / concurrency)
    DBOS.destroy()
    return out


def loopback_alone(spec: dict) -> dict:
    """The loopback server without any durability: ``concurrency`` threads making
    ``items x rounds`` calls between them with the same client and requests, to see what the
    server (and the client) can do on this machine."""
    from concurrent.futures import ThreadPoolExecutor

    items, rounds, concurrency = spec["n"], spec["rounds"], spec["concurrency"]
    client = _batch_client(spec)
    client.chat.completions.create(model="loopback-1", messages=_batch_messages(-1, []))

    def one(item: int) -> None:
        replies: list[str] = []
        for _ in range(rounds):
            reply = client.chat.completions.create(model="loopback-1",
                                                   messages=_batch_messages(item, replies))
            replies.append(reply.choices[0].message.content)

    clock = _Clock()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(one, range(items)))
    clock.stop()
    return clock.result(items * rounds, items=items, rounds=rounds, concurrency=concurrency,
                        peak_rss_mb=_peak_rss_mb(),
                        ideal_seconds=items * rounds * spec["delay"] / concurrency)


# -- a batch on a Dask cluster -------------------------------------------------------------

#: One OpenAI client per worker process and server URL (made on the worker: a client cannot
#: be pickled; kept, so that each item does not open new connections).
_WORKER_CLIENTS: dict[str, Any] = {}


def _worker_client(url: str) -> Any:
    client = _WORKER_CLIENTS.get(url)
    if client is None:
        client = _WORKER_CLIENTS[url] = _batch_client({"url": url, "concurrency": 32})
    return client


def dask_item(url: str, rounds: int, ctx: Any, item: int) -> str:
    """The item handler of the Dask batch: ``rounds`` ``ctx.chat`` calls, as in
    :func:`batch`. Module-level, so Dask ships it by reference (``functools.partial`` binds
    ``url`` and ``rounds``) and the workers import it from this module."""
    client = _worker_client(url)
    replies: list[str] = []
    for _ in range(rounds):
        reply = ctx.chat(model="loopback-1", messages=_batch_messages(item, replies),
                         client=client)
        replies.append(reply.choices[0].message.content)
    return replies[-1]


def dask_warm(url: str, journal: str) -> int:
    """Run on every worker before the clock: the imports, the tokenizer, the client's first
    connection and the journal's connection pool, which each worker makes once."""
    import durable_nb
    from durable_nb.journal import open_journal
    from durable_nb.llm.tokens import count_message_tokens

    _worker_client(url).chat.completions.create(model="loopback-1",
                                                messages=_batch_messages(-1, []))
    count_message_tokens(_batch_messages(0, []), "loopback-1")
    open_journal(journal).find_run("warm-up")
    assert durable_nb.map
    return os.getpid()


def dask_batch(spec: dict) -> dict:
    """``items`` x ``rounds`` ``ctx.chat`` calls through ``durable_nb.map(executor=client)``
    on a ``LocalCluster`` of ``workers`` processes x ``threads`` threads (``concurrency =
    workers x threads``), the journal on PostgreSQL (``spec["journal"]``), timed from the
    call to its return with the cluster started and warmed. ``workers: 0``: the same map on
    threads in this process (no Dask), ``concurrency`` as given."""
    import functools
    import logging

    import durable_nb

    # By its module name, not __main__: Dask then ships the handler by reference.
    from benchmarks.workloads import dask_item as handler_function
    from benchmarks.workloads import dask_warm as warm

    items, rounds, workers = spec["n"], spec["rounds"], spec["workers"]
    handler = functools.partial(handler_function, spec["url"], rounds)
    cluster = client = None
    started = time.perf_counter()
    if workers:
        if not spec.get("profile", True):
            # Dask's worker samples every thread's stack every 10 ms by default (its
            # dashboard's profile): the workers inherit the setting from the environment.
            os.environ["DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED"] = "False"
        import distributed

        concurrency = workers * spec["threads"]
        cluster = distributed.LocalCluster(
            n_workers=workers, threads_per_worker=spec["threads"], processes=True,
            dashboard_address=None, silence_logs=logging.WARNING)
        client = distributed.Client(cluster)
        client.wait_for_workers(workers)
        pids = client.run(warm, spec["url"], spec["journal"])
        assert len(set(pids.values())) == workers, pids
    else:
        concurrency = spec["concurrency"]
        warm(spec["url"], spec["journal"])
    cluster_seconds = time.perf_counter() - started
    clock = _Clock()
    result = durable_nb.map(handler, range(items), batch_id="bench", key="index",
                            concurrency=concurrency, journal=spec["journal"], executor=client)
    clock.stop()
    assert result.counts == {"DONE": items}, result.counts
    out = clock.result(items * rounds, items=items, rounds=rounds, workers=workers,
                       threads=spec.get("threads") if workers else None,
                       profile=spec.get("profile", True),
                       concurrency=concurrency, cluster_seconds=cluster_seconds,
                       ideal_seconds=items * rounds * spec["delay"] / concurrency)
    if client is not None:
        client.close()
        cluster.close()
    return out


# -- the registry at scale ----------------------------------------------------------------

REGISTRY_OPS = ("runs", "runs_running", "runs_unfinished", "runs_newest_50", "scan",
                "cli_runs_running", "cli_runs")


def registry(spec: dict) -> dict:
    """``mode: "make"``: a journal of N finished-looking runs (97 % DONE, 1.5 % FAILED,
    1 % RUNNING, 0.5 % WAITING_APPROVAL; three steps each), written in one transaction.
    ``mode: "time"``: one listing, in a fresh process, on that journal (opened read-only as
    the CLI does, except the scan, which may mark expired runs)."""
    import contextlib
    import io
    import random

    from durable_nb.journal import DiskJournal, RunRecord, Status, StepEntry

    n = spec["n"]
    if spec["mode"] == "make":
        journal = DiskJournal(spec["dir"])
        rnd = random.Random(1)
        start = time.time() - n
        clock = _Clock()
        with journal._cache.transact(retry=True):
            for i in range(n):
                r = rnd.random()
                status = (Status.DONE if r < 0.97 else Status.FAILED if r < 0.985
                          else Status.RUNNING if r < 0.995 else Status.WAITING_APPROVAL)
                record = RunRecord(
                    run_id=f"eval-{i // 1000}/item-{i}", title=f"item {i}", status=status,
                    iteration=3, prompt_tokens=1200, completion_tokens=300, step_count=3,
                    created_at=start + i, updated_at=start + i,
                    result={"answer": "x" * 40} if status is Status.DONE else None,
                    pending_approval={"key": "2", "name": "send", "details": {"to": "a@b"}}
                    if status is Status.WAITING_APPROVAL else None)
                journal.create_run(record)
                for position in range(3):
                    journal._cache.add(f"step:{record.run_id}:{position}", StepEntry(
                        position, str(position), "chat", "chat", result={"a": 1}).to_json())
        clock.stop()
        journal.close()
        return clock.result(n, disk_bytes=_dir_bytes(Path(spec["dir"])))
    op = spec["op"]
    from durable_nb import registry as reg
    from durable_nb.cli import main as cli
    from durable_nb.notebook.scan import describe_unfinished

    journal = DiskJournal(spec["dir"], read_only=op != "scan")
    clock = _Clock()
    if op == "runs":
        found = len(reg.runs(journal=journal))
    elif op == "runs_running":
        found = len(reg.runs("running", journal=journal))
    elif op == "runs_unfinished":
        found = len(reg.runs(("running", "waiting_approval"), journal=journal))
    elif op == "runs_newest_50":
        found = len(reg.runs(journal=journal, limit=50, newest_first=True))
    elif op == "scan":
        found = len(describe_unfinished(journal))
    else:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            cli(["--journal", spec["dir"], "runs",
                 *(["--status", "running"] if op == "cli_runs_running" else [])])
        found = len(out.getvalue().splitlines()) - 1
    clock.stop()
    result = clock.result(1, found=found)
    result["ms"] = result.pop("seconds") * 1e3
    return result


SYSTEMS: dict[str, Callable[[dict], dict]] = {
    "plain": plain, "diskcache": raw_diskcache, "durable_nb": durable, "dbos": dbos,
    "durable_nb_power": lambda spec: durable({**spec, "durability": "power"}),
    "langgraph": langgraph, "chat": chat, "transcript": transcript, "batch": batch,
    "batch_dbos": batch_dbos, "loopback_alone": loopback_alone, "registry": registry,
    "dask_batch": dask_batch,
}


def main(argv: list[str]) -> None:
    spec = json.loads(argv[0])
    if spec.get("durable_nb_path"):  # measure another checkout of durable_nb ("before")
        sys.path.insert(0, spec["durable_nb_path"])
    if spec["system"] in ("widget", "restart", "browser"):
        from . import kernel

        _finish(getattr(kernel, spec["system"])(spec))
    else:
        _finish(SYSTEMS[spec["system"]](spec))


if __name__ == "__main__":
    main(sys.argv[1:])
