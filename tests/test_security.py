"""The journal is data, not code, and it never holds a secret."""

import json
import pickle
import sqlite3
import sys

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import durable_nb as dn
from durable_nb import serde
from durable_nb.journal import StepEntry
from durable_nb.testing import LoopbackServer


class _Boom:
    """Unpickling this creates a marker file: proof that code ran."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _raw_db(journal):
    return sqlite3.connect(journal.directory / "cache.db")


def test_pickled_value_in_the_journal_is_refused_not_executed(journal, tmp_path):
    dn.execute("r", lambda ctx: ctx.run("a", lambda: 1), journal=journal)
    dn.execute("s", lambda ctx: 1, journal=journal)
    marker = tmp_path / "code-ran"
    payload = pickle.dumps(_Boom(str(marker)))
    with _raw_db(journal) as db:  # a hostile edit: mode 4 is diskcache's pickle mode
        db.execute("UPDATE Cache SET mode = 4, value = ? WHERE key = 'step:r:0'", (payload,))
        db.execute("UPDATE Cache SET mode = 4, value = ? WHERE key = 'run:s'", (payload,))
    with pytest.raises(dn.CorruptEntry, match="pickled value"):
        dn.execute("r", lambda ctx: ctx.run("a", lambda: 1), journal=journal)
    with pytest.raises(dn.CorruptEntry):
        dn.runs(journal=journal)
    assert not marker.exists()


def test_model_classes_not_loaded_are_not_imported(journal):
    dn.execute("r", lambda ctx: ctx.run("a", lambda: 1), journal=journal)
    hostile = StepEntry(0, "0", "a", "run", result={"$t": "model", "cls": "antigravity.Fly",
                                                    "v": {}})
    journal._cache.set("step:r:0", hostile.to_json())  # a hostile edit of the entry
    assert "antigravity" not in sys.modules
    with pytest.raises(dn.CorruptEntry, match="not a pydantic model loaded"):
        dn.execute("r", lambda ctx: ctx.run("a", lambda: 1), journal=journal)
    assert "antigravity" not in sys.modules


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children) | st.dictionaries(
        st.sampled_from(["$t", "v", "cls", "x"]) | st.text(), children)
    | st.fixed_dictionaries({"$t": st.sampled_from(
        ["tuple", "set", "bytes", "datetime", "date", "decimal", "dict", "float", "model",
         "os.system", "builtins.eval"]), "v": children, "cls": st.text()}),
    max_leaves=20)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_decoder_fuzz_only_fails_cleanly_and_imports_nothing(data):
    before = set(sys.modules)
    try:
        serde.decode(data)
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError):
        pass
    assert set(sys.modules) - before == set()


@settings(max_examples=300, deadline=None)
@given(st.text() | st.binary().map(lambda b: b.decode("latin-1")))
def test_entry_parser_fuzz_gives_an_entry_or_a_clear_error(text):
    try:
        entry = StepEntry.from_json(3, text)
    except (ValueError, TypeError):
        return
    assert isinstance(entry.name, str) and isinstance(entry.kind, str)


def test_round_trip_of_encodable_values_is_exact():
    import datetime
    from decimal import Decimal

    value = {"a": (1, [2, {3}]), "b": b"\x00", "c": datetime.datetime(2026, 1, 1, 12, 30),
             "d": Decimal("1.10"), "e": {("t", 1): frozenset({"x"})}, "f": float("-inf")}
    assert serde.decode(json.loads(serde.dumps(serde.encode(value)))) == value


def test_api_keys_and_auth_headers_never_reach_the_journal(journal):
    secret = "sk-test-SECRET-7f3a9c"
    with LoopbackServer() as server:
        client = openai.OpenAI(base_url=server.url, api_key=secret,
                               default_headers={"Authorization": f"Bearer {secret}"})

        def handler(ctx):
            reply = ctx.chat(client=client, model="gpt-4o-mini",
                             messages=[{"role": "user", "content": "hello"}],
                             extra_headers={"X-Api-Key": secret})
            return reply.choices[0].message.content

        dn.execute("r", handler, journal=journal)
        assert server.count() == 1
    journal.close()
    for path in journal.directory.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert secret.encode() not in data, path
            assert b"Bearer" not in data, path
