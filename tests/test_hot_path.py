"""The shortcuts of the step hot path keep what the slow paths guaranteed.

- DiskJournal.append_step writes with SQL of its own on diskcache's connection: value files
  of refused writes are removed, blobs a run has are not duplicated, large values still land
  in files;
- DiskJournal.steps reads entries many a query, in position order, stopping at a gap;
- the run record a step rewrites is written by one UPDATE where diskcache's set() would make
  the same row (its listing tag read from the record's first fields), by set() otherwise;
- token counts remembered per text are those tiktoken counts, within their bound;
- a lease text verified at one write is not parsed again, and any other text still fences;
- a replayed result that is plain JSON skips the decoding pass, but only where that cannot
  change what replay returns (tags, even spelled with escapes, and deep nesting still go
  through serde.decode) and where no observer holds the entry.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import durable_nb as dn
from durable_nb.runner import Runner
from durable_nb import serde
from durable_nb.errors import RunLeased
from durable_nb.journal import DiskJournal, RunRecord, Status, StepEntry
from durable_nb.journal.disk_layout import record_tag, run_tag
from durable_nb.journal.records import PLAIN_MAX_BRACKETS
from durable_nb.llm import tokens


def _entry(position: int, result: object = "ok") -> StepEntry:
    return StepEntry(position, str(position), "s", "run", result=result, started_at=1.0,
                     finished_at=2.0)


def _value_files(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*.val")]


def test_plain_bracket_limit_is_serde_max_depth():
    assert PLAIN_MAX_BRACKETS == serde.MAX_DEPTH


@pytest.mark.parametrize("text, plain", [
    ('{"id":"0","n":"a","k":"run","r":{"a":[1,2],"b":"x"},"t0":0,"t1":0}', True),
    ('{"id":"0","n":"a","k":"run","r":"text","t0":0,"t1":0}', True),
    ('{"id":"0","n":"a","k":"run","r":{"$t":"tuple","v":[1]},"t0":0,"t1":0}', False),
    ('{"id":"0","n":"a","k":"run","r":{"\\u0024t":"tuple","v":[1]},"t0":0,"t1":0}', False),
    ('{"id":"0","n":"a","k":"run","r":' + "[" * 201 + "]" * 201 + ',"t0":0,"t1":0}', False),
    ('{"id":"0","n":"a","k":"run","ok":false,"e":{"type":"KeyError"},"t0":0,"t1":0}', False),
])
def test_which_entries_skip_the_decoding_pass(text, plain):
    entry = StepEntry.from_json(0, text)
    assert entry.plain_result is plain
    if plain:
        assert serde.decode(entry.result) == entry.result


def test_a_tag_spelled_with_an_escape_is_still_decoded_as_a_tag(journal):
    dn.execute("r", lambda ctx: ctx.run("a", lambda: 1), journal=journal)
    journal._cache.set("step:r:0", '{"id":"0","n":"a","k":"run","r":{"\\u0024t":"model",'
                                   '"cls":"os.system","v":{}},"t0":0,"t1":0}')
    with pytest.raises(dn.CorruptEntry, match="run 'r' step 0"):
        dn.execute("r", lambda ctx: ctx.run("a", lambda: 1), journal=journal)


def test_plain_nesting_deeper_than_max_depth_is_still_refused(journal):
    dn.execute("r", lambda ctx: ctx.run("a", lambda: 1), journal=journal)
    deep = "[" * (serde.MAX_DEPTH + 1) + "]" * (serde.MAX_DEPTH + 1)
    journal._cache.set("step:r:0", '{"id":"0","n":"a","k":"run","r":' + deep + ',"t0":0,"t1":0}')
    with pytest.raises(dn.CorruptEntry, match="run 'r' step 0"):
        dn.execute("r", lambda ctx: ctx.run("a", lambda: 1), journal=journal)


def test_replayed_plain_results_are_equal_and_private_to_the_code(journal):
    seen = []

    class Keeper:
        def on_step(self, entry, replayed):
            seen.append(entry)

        def on_record(self, record):
            pass

    def handler(ctx):
        rows = ctx.run("load", lambda: {"rows": [1, 2], "name": "x"})
        rows["rows"].append(3)  # the code changes what it got
        return rows

    first = Runner("r", handler, journal=journal).run().result
    again = Runner("r", handler, journal=journal).run().result  # no observer: no copy
    assert first == again == {"rows": [1, 2, 3], "name": "x"}
    watched = Runner("r", handler, journal=journal, observer=Keeper()).run().result
    assert watched == first
    # The observer's entry still shows what was journaled, not what the code made of it.
    assert [e.result for e in seen if e.name == "load"] == [{"rows": [1, 2], "name": "x"}]


def test_a_refused_append_leaves_no_value_file(tmp_path):
    journal = DiskJournal(tmp_path / "j")
    journal.append_step("r", _entry(0))
    with pytest.raises(RunLeased):
        journal.append_step("r", _entry(0, "x" * 40_000))  # position taken
    with pytest.raises(RunLeased):
        journal.append_step("r", _entry(1, "x" * 40_000), token="never-held")  # fenced
    assert _value_files(tmp_path / "j") == []
    assert journal.get_step("r", 0).result == "ok"
    assert not journal.has_step("r", 1)


def test_large_values_and_blobs_land_in_files_once(tmp_path):
    journal = DiskJournal(tmp_path / "j")
    blob = json.dumps(["m" * 40_000])
    journal.append_step("r", _entry(0, "y" * 40_000), blobs={"d": blob})
    journal.append_step("r", _entry(1), blobs={"d": blob})  # the run has it: not stored again
    assert len(_value_files(tmp_path / "j")) == 2
    assert journal.get_step("r", 0).result == "y" * 40_000
    assert journal.get_blob("r", "d") == blob
    count = journal._cache._sql("SELECT count(*) FROM Cache WHERE key LIKE 'blob:%'").fetchone()
    assert count == (1,)


def test_steps_are_read_in_position_order_across_read_ahead_batches(tmp_path):
    journal = DiskJournal(tmp_path / "j")
    for position in range(600):
        journal.append_step("r", _entry(position, {"n": position}))
    journal.append_step("r", _entry(601))  # after a gap: not part of the journal
    entries = list(journal.steps("r"))
    assert [e.position for e in entries] == list(range(600))
    assert [e.result["n"] for e in entries] == list(range(600))
    assert [e.position for e in journal.steps("r", 598)] == [598, 599]
    assert journal.count_steps("r") == 600


def test_a_missing_value_file_is_a_corrupt_entry_when_steps_are_read(tmp_path):
    journal = DiskJournal(tmp_path / "j")
    journal.append_step("r", _entry(0))
    journal.append_step("r", _entry(1, "z" * 40_000))
    for path in _value_files(tmp_path / "j"):
        path.unlink()
    with pytest.raises(dn.CorruptEntry, match="value file is missing"):
        list(journal.steps("r"))


def _record_row(journal: DiskJournal, run_id: str) -> tuple:
    return journal._cache._sql(
        "SELECT tag, expire_time, size, mode, filename FROM Cache WHERE key = ? AND raw = 1",
        (f"run:{run_id}",)).fetchone()


def test_the_record_written_with_a_step_keeps_its_listing_tag_and_its_storage(tmp_path):
    journal = DiskJournal(tmp_path / "j")
    record = RunRecord("r", created_at=1764590000.5)
    journal.create_run(record)
    record.prompt_tokens = 7
    journal.append_step("r", _entry(0), record_json=record.to_json())  # same status: UPDATE
    assert _record_row(journal, "r") == (run_tag("RUNNING", 1764590000.5), None, 0, 1, None)
    record.status = Status.WAITING_APPROVAL  # another tag: written by diskcache's set()
    journal.append_step("r", _entry(1), record_json=record.to_json())
    assert journal.list_runs(status="waiting_approval")[0].prompt_tokens == 7
    assert journal.list_runs(status="running") == []
    record.context_summary = "s" * 40_000  # over 32 KiB: in a value file, then inline again
    journal.append_step("r", _entry(2), record_json=record.to_json())
    assert _record_row(journal, "r")[4] is not None and len(_value_files(tmp_path / "j")) == 1
    record.context_summary = None
    record.prompt_tokens = 9
    journal.append_step("r", _entry(3), record_json=record.to_json())
    assert _record_row(journal, "r")[4] is None and _value_files(tmp_path / "j") == []
    assert journal.get_run("r").prompt_tokens == 9
    size = journal._cache._sql("SELECT value FROM Settings WHERE key = 'size'").fetchone()[0]
    assert size == 0  # diskcache's own count of file bytes, kept by its triggers


@pytest.mark.parametrize("created_at", [0, 0.0, None, 1764590000.123456, 5, 1e15])
def test_the_listing_tag_read_from_the_records_first_fields_is_the_parsed_one(created_at):
    for status in Status:
        record = RunRecord('r"1', title='"status":"DONE","created_at":1', status=status,
                           created_at=created_at, source="x" * 5000)
        text = record.to_json()
        data = json.loads(text)
        assert text.startswith('{"status":')
        assert record_tag(text) == run_tag(data["status"], data["created_at"])
    older = json.dumps({"run_id": "r", "status": "DONE", "created_at": 3.0})  # other order
    assert record_tag(older) == run_tag("DONE", 3.0)


def test_token_counts_remembered_per_text_are_the_counted_ones(monkeypatch):
    monkeypatch.setattr(tokens, "_counts", {})
    monkeypatch.setattr(tokens, "_counts_chars", 0)
    monkeypatch.setattr(tokens, "_COUNTS_MAX_CHARS", 400)
    enc = tokens.encoding_for("gpt-4o")
    texts = [f"message number {i}: " + "word " * i for i in range(40)]
    first = [tokens._count_text(enc, t) for t in texts]
    again = [tokens._count_text(enc, t) for t in reversed(texts)]
    assert first == list(reversed(again)) == [len(enc.encode(t)) for t in texts]
    assert 0 < tokens._counts_chars <= 400
    assert tokens._counts_chars == sum(len(t) for _, t in tokens._counts)
    other = tokens.encoding_for("gpt-4")  # cl100k: its own counts
    assert tokens._count_text(other, texts[-1]) == len(other.encode(texts[-1]))


def test_a_lease_taken_over_fences_the_writer_that_wrote_under_it_before(tmp_path):
    journal = DiskJournal(tmp_path / "j")
    journal.acquire_lease("r", {"token": "a", "pid": 1}, lambda holder: True)
    journal.append_step("r", _entry(0), token="a")
    journal.append_step("r", _entry(1), token="a")  # the lease text read before: not parsed
    journal._cache.set("lease:r", json.dumps({"token": "b", "pid": 2}))  # taken over
    with pytest.raises(RunLeased):
        journal.append_step("r", _entry(2), token="a")
    journal.append_step("r", _entry(2), token="b")
    journal._cache.set("lease:r", json.dumps({"token": "a", "pid": 1}))  # the old text again
    with pytest.raises(RunLeased):
        journal.append_step("r", _entry(3), token="b")
    assert journal.count_steps("r") == 3
