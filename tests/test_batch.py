"""Durable batches: every item its own run, a second call finishes only what is unfinished,
approvals park items while the others go on, limits shared by all items hold."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
import time

import openai
import pytest

import durable_nb as dn
from durable_nb import Status
from durable_nb.batches.limits import BatchLimits
from durable_nb.testing import LoopbackServer


@pytest.fixture
def server():
    with LoopbackServer(["answer one", "answer two"]) as s:
        yield s


def _classifier(client, effects):
    def handler(ctx, item):
        reply = ctx.chat(model="gpt-4o-mini", client=client, max_tokens=20,
                         messages=[{"role": "user", "content": f"classify {item['text']}"}])
        label = ctx.run("label", lambda: effects.append(item["id"]) or f"label-{item['id']}")
        return {"id": item["id"], "label": label, "reply": reply.choices[0].message.content}
    return handler


def _items(n):
    return [{"id": i, "text": f"ticket {i}"} for i in range(n)]


def test_every_item_is_a_run_and_outcomes_come_in_item_order(journal, server):
    client = openai.OpenAI(base_url=server.url, api_key="k", max_retries=0)
    effects = []
    result = dn.map(_classifier(client, effects), _items(12), batch_id="eval",
                    key=lambda item: item["id"], concurrency=4, journal=journal)
    assert [item.key for item in result] == [str(i) for i in range(12)]
    assert result.results() == [{"id": i, "label": f"label-{i}", "reply": "answer one"}
                                 for i in range(12)]
    assert result.counts == {"DONE": 12}
    assert sorted(effects) == list(range(12))
    assert {r.run_id for r in dn.runs(journal=journal)} == {f"eval/{i}" for i in range(12)}
    assert result.tokens == sum(dn.get_run(f"eval/{i}", journal=journal).tokens
                                for i in range(12)) > 0


def test_a_second_call_finishes_only_what_is_unfinished(journal, server):
    client = openai.OpenAI(base_url=server.url, api_key="k", max_retries=0)
    effects = []
    handler = _classifier(client, effects)
    fail_once = {3}

    def flaky(ctx, item):
        if item["id"] in fail_once:
            fail_once.discard(item["id"])
            raise RuntimeError("the tool broke")
        return handler(ctx, item)

    first = dn.map(flaky, _items(6), batch_id="eval", key=lambda i: i["id"], journal=journal)
    assert first.counts == {"DONE": 5, "FAILED": 1} and "the tool broke" in first[3].error
    requests = server.count()
    again = dn.map(flaky, _items(8), batch_id="eval", key=lambda i: i["id"], journal=journal)
    assert again.counts == {"DONE": 8}
    assert [item.replayed for item in again] == [True] * 3 + [False] + [True] * 2 + [False] * 2
    # Only the failed item and the two new ones paid for an LLM call; no tool ran twice.
    assert server.count() == requests + 1 + 2
    assert sorted(effects) == list(range(8))


def test_removed_items_are_kept_and_reported(journal):
    dn.map(lambda ctx, x: ctx.run("double", lambda: x * 2), [1, 2, 3], batch_id="b",
           key="index", journal=journal)
    shorter = dn.map(lambda ctx, x: ctx.run("double", lambda: x * 2), [1, 2], batch_id="b",
                     key="index", journal=journal)
    assert shorter.results() == [2, 4] and shorter.removed == ["2"]
    assert dn.get_run("b/2", journal=journal).status is Status.DONE
    assert dn.batch("b", journal=journal).removed == ["2"]


def test_failed_items_are_kept_with_retry_failed_false(journal):
    calls = []

    def handler(ctx, x):
        calls.append(x)
        raise ValueError(f"bad {x}")

    dn.map(handler, [1], batch_id="b", journal=journal)
    kept = dn.map(handler, [1], batch_id="b", journal=journal, retry_failed=False)
    assert kept[0].status is Status.FAILED and calls == [1]


def test_content_keys_are_stable_when_the_list_is_reordered(journal):
    seen = []
    items = ["alpha", "beta", "gamma"]
    dn.map(lambda ctx, x: ctx.run("s", lambda: seen.append(x) or x.upper()), items,
           batch_id="b", journal=journal)
    again = dn.map(lambda ctx, x: ctx.run("s", lambda: seen.append(x) or x.upper()),
                   list(reversed(items)), batch_id="b", journal=journal)
    assert again.results() == ["GAMMA", "BETA", "ALPHA"]
    assert sorted(seen) == sorted(items)  # nothing ran again
    assert dn.item_keys(["a", "a"]) == [dn.item_keys(["a"])[0], dn.item_keys(["a"])[0] + "~2"]


def test_an_item_waiting_for_approval_parks_and_the_others_go_on(journal):
    def handler(ctx, x):
        if x == 2:
            if not ctx.approval("publish", {"item": x}).approved:
                return "rejected"
        return ctx.run("work", lambda: f"did {x}")

    parked = dn.map(handler, [1, 2, 3], batch_id="b", key="index", journal=journal, wait=False)
    assert [item.status for item in parked] == [Status.DONE, Status.WAITING_APPROVAL, Status.DONE]
    dn.approve("b/1", "fine", journal=journal)
    resumed = dn.map(handler, [1, 2, 3], batch_id="b", key="index", journal=journal)
    assert resumed.results() == ["did 1", "did 2", "did 3"]


def test_map_waits_for_decisions_given_elsewhere(journal):
    def approver():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            record = journal.find_run("b/0")
            if record is not None and record.status is Status.WAITING_APPROVAL:
                dn.reject("b/0", "no", journal=journal)
                return
            time.sleep(0.02)

    thread = threading.Thread(target=approver)
    thread.start()
    result = dn.map(lambda ctx, x: ctx.approval("go").approved, [0], batch_id="b",
                    key="index", journal=journal, poll_interval=0.02)
    thread.join()
    assert result.results() == [False]


def test_a_batch_token_budget_stops_items_before_the_call_that_would_pass_it(journal, server):
    client = openai.OpenAI(base_url=server.url, api_key="k", max_retries=0)
    result = dn.map(_classifier(client, []), _items(10), batch_id="b", key=lambda i: i["id"],
                    journal=journal, concurrency=3, max_total_tokens=60)
    done = [item for item in result if item.status is Status.DONE]
    stopped = [item for item in result if item.status is Status.FAILED]
    assert done and stopped
    assert all("batch's token budget" in item.error for item in stopped)
    assert result.tokens <= 60
    assert server.count() == len(done)  # a stopped item sent nothing


class _FakeTime:
    """A clock that moves only when slept on: rate limits tested without waiting."""

    def __init__(self):
        self.now = 0.0
        self.slept = []

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


def test_a_retry_after_pauses_every_item_not_just_the_one_that_got_it():
    fake = _FakeTime()
    limits = BatchLimits(requests_per_minute=600, clock=fake.clock, sleep=fake.sleep)
    limits.pause(1.5)  # one item's call got a 429 asking for 1.5 s
    limits.before_call("b/1", "0", 10, 0.0)  # another item's call waits it out
    assert sum(fake.slept) == pytest.approx(1.5)


def test_requests_per_minute_space_calls_out():
    fake = _FakeTime()
    limits = BatchLimits(requests_per_minute=60, clock=fake.clock, sleep=fake.sleep)
    for i in range(60):  # a minute's worth goes at once
        limits.before_call("b/x", str(i), 10, 0.0)
    assert fake.slept == []
    limits.before_call("b/x", "60", 10, 0.0)  # the 61st waits for one request's worth: 1 s
    assert sum(fake.slept) == pytest.approx(1.0)


def test_tokens_per_minute_space_calls_out():
    fake = _FakeTime()
    limits = BatchLimits(tokens_per_minute=600, clock=fake.clock, sleep=fake.sleep)
    limits.before_call("b/x", "0", 600, 0.0)  # the whole minute's worth
    limits.before_call("b/x", "1", 300, 0.0)  # waits until 300 tokens refilled: 30 s
    assert sum(fake.slept) == pytest.approx(30.0)


# Keys that never swap results (issue 17, item 12) ---------------------------------------

@dataclasses.dataclass
class Ticket:
    id: int
    text: str


def _answer(ctx, item):
    text = item.text if isinstance(item, Ticket) else item
    return ctx.run("answer", lambda: f"answer to {text}")


def test_inserting_a_dataclass_item_leaves_every_other_item_its_own_result(journal):
    first = [Ticket(1, "refund"), Ticket(2, "login")]
    assert dn.map(_answer, first, batch_id="b", journal=journal).results() == \
        ["answer to refund", "answer to login"]
    inserted = [Ticket(0, "invoice"), *first]
    again = dn.map(_answer, inserted, batch_id="b", journal=journal)
    assert again.results() == ["answer to invoice", "answer to refund", "answer to login"]
    assert [item.replayed for item in again] == [False, True, True]
    assert not any("~" in k for k in dn.item_keys(inserted))


def test_keys_that_clean_to_the_same_text_keep_their_results_when_reordered(journal):
    names = ["ann smith", "ann/smith", "ann-smith"]
    assert len(set(dn.item_keys(names, key=str))) == 3
    dn.map(_answer, names, batch_id="b", key=str, journal=journal)
    again = dn.map(_answer, list(reversed(names)), batch_id="b", key=str, journal=journal)
    assert again.results() == [f"answer to {n}" for n in reversed(names)]
    assert all(item.replayed for item in again)
    # Each key is made from its own item: positions play no part.
    assert dn.item_keys(list(reversed(names)), key=str) == \
        list(reversed(dn.item_keys(names, key=str)))


def test_plain_json_items_keep_their_content_keys():
    # The digest of the canonical JSON text, as journals written before hold it.
    text = json.dumps({"q": "hello"}, sort_keys=True, ensure_ascii=False)
    digest = hashlib.blake2b(text.encode(), digest_size=6).hexdigest()
    assert dn.item_keys([{"q": "hello"}]) == [digest]


def test_an_item_whose_value_cannot_be_digested_is_refused_asking_for_key(journal):
    class Handle:
        pass

    with pytest.raises(dn.SerializationError, match="key="):
        dn.map(_answer, [Handle()], batch_id="b", journal=journal)
    assert dn.map(_answer, [Handle()], batch_id="b", key=lambda h: "h1",
                  journal=journal).counts == {"DONE": 1}
