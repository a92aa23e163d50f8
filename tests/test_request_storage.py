"""What a chat step was asked, as the journal keeps it: each message once per run, and each
request's list of messages as a chain extending an earlier request's list, so that a long
conversation grows the journal with its new messages only, while the panel, exports, input
diffs and copies still see every request whole. Real runs against the loopback server, real
journals on disk."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import openai
import pytest

import durable_nb as dn
from durable_nb import DiskJournal
from durable_nb.execution import load_request
from durable_nb.export import export_data
from durable_nb.journal import copy_run
from durable_nb.journal.blobs import expand_list, referenced_blobs
from durable_nb.testing import LoopbackServer

MODEL = "loopback-1"


def _conversation(client: openai.OpenAI, rounds: int, topic: str = "sales"):
    def agent(ctx):
        messages = [{"role": "system", "content": "You are terse."},
                    {"role": "user", "content": f"Tell me about {topic}."}]
        for turn in range(rounds):
            reply = ctx.chat(model=MODEL, messages=messages, client=client)
            messages.append(dn.assistant_message(reply.choices[0].message))
            messages.append({"role": "user", "content": f"{topic}: go on ({turn})"})
        return len(messages)
    return agent


def _stored_bytes(journal: DiskJournal, run_id: str) -> int:
    """The bytes of the run's entries and blobs as stored."""
    entries = sum(len(e.to_json()) for e in journal.steps(run_id))
    rows = journal._cache._sql("SELECT value FROM Cache WHERE key >= ? AND key < ?",
                               (f"blob:{run_id}:", f"blob:{run_id};")).fetchall()
    return entries + sum(len(v or "") for v, in rows)


@pytest.fixture
def server():
    with LoopbackServer([f"a short answer, number {i}." for i in range(200)]) as srv:
        yield srv


def test_each_chat_entry_costs_the_journal_its_new_messages_not_the_conversation(
        tmp_path: Path, server):
    journal = DiskJournal(tmp_path / "j")
    client = openai.OpenAI(base_url=server.url, api_key="k", max_retries=0)
    sizes = []
    for rounds in (10, 40):
        run_id = f"talk{rounds}"
        dn.execute(run_id, _conversation(client, rounds), journal=journal)
        entries = list(journal.steps(run_id))
        sizes.append(_stored_bytes(journal, run_id) / rounds)
        # The last request's entry refers to its list the way the first one does: one node.
        assert entries[-1].request["messages"].keys() == {"$list"}
        assert len(json.dumps(entries[-1].request)) == len(json.dumps(entries[0].request))
        # ... and the list reads back whole: every message of the last request, in order.
        whole = load_request(entries[-1].request, lambda d: journal.get_blob(run_id, d))
        assert whole["messages"] == server.requests[-1]["messages"]
    # Four times the rounds: about the same bytes per round (the square would be ~4 x).
    assert sizes[1] < sizes[0] * 1.3, sizes


def test_interleaved_conversations_each_read_back_as_they_were_sent(tmp_path: Path, server):
    journal = DiskJournal(tmp_path / "j")
    client = openai.AsyncOpenAI(base_url=server.url, api_key="k", max_retries=0)

    async def talk(ctx, topic: str) -> None:
        messages = [{"role": "user", "content": f"About {topic}?"}]
        for turn in range(4):
            reply = await ctx.chat_async(model=MODEL, messages=messages, client=client)
            messages.append(dn.assistant_message(reply.choices[0].message))
            messages.append({"role": "user", "content": f"{topic} {turn}"})

    async def agent(ctx):
        await asyncio.gather(*(talk(ctx, topic) for topic in ("tea", "rain", "maps")))

    dn.execute("three", agent, journal=journal)
    sent = {json.dumps(body["messages"], sort_keys=True) for body in server.requests}
    read = {json.dumps(load_request(e.request, lambda d: journal.get_blob("three", d))
                       ["messages"], sort_keys=True) for e in journal.steps("three")}
    assert read == sent and len(read) == 12


def test_copying_a_conversation_reads_each_list_node_at_most_twice(tmp_path: Path, server):
    # Once following the chain, once taking it along: a chain behind a node already copied
    # is not followed again (else a copy reads the square of the rounds).
    source, target = DiskJournal(tmp_path / "a"), DiskJournal(tmp_path / "b")
    client = openai.OpenAI(base_url=server.url, api_key="k", max_retries=0)
    dn.execute("talk", _conversation(client, 30), journal=source)
    reads: dict[str, int] = {}
    get_blob = source.get_blob

    def counted(run_id: str, digest: str) -> str | None:
        reads[digest] = reads.get(digest, 0) + 1
        return get_blob(run_id, digest)

    source.get_blob = counted  # type: ignore[method-assign]
    assert copy_run(source, "talk", target, "talk") is not None
    nodes = [e.request["messages"]["$list"] for e in source.steps("talk")]
    assert len(set(nodes)) == 30 and max(reads[n] for n in nodes) <= 2
    for entry in target.steps("talk"):  # and the copy is whole
        assert len(expand_list(entry.request["messages"]["$list"],
                               lambda d: target.get_blob("talk", d)) or []) > 0


def test_a_copied_run_takes_its_list_nodes_along_and_exports_its_prompts(tmp_path: Path,
                                                                        server):
    source, target = DiskJournal(tmp_path / "a"), DiskJournal(tmp_path / "b")
    client = openai.OpenAI(base_url=server.url, api_key="k", max_retries=0)
    dn.execute("talk", _conversation(client, 5), journal=source)
    assert copy_run(source, "talk", target, "talk") is not None
    for entry in target.steps("talk"):
        missing = [d for d in referenced_blobs(entry.request,
                                               lambda d: target.get_blob("talk", d))
                   if target.get_blob("talk", d) is None]
        assert missing == []
        assert expand_list(entry.request["messages"]["$list"],
                           lambda d: target.get_blob("talk", d)) is not None
    rounds = export_data(dn.get_run("talk", journal=target), journal=target)["rounds"]
    assert [len(r["chat"]["request"]["new_messages"]) for r in rounds] == [2, 2, 2, 2, 2]
    assert rounds[4]["chat"]["request"]["new_messages"][1]["content"] == "sales: go on (3)"
