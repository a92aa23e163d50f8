"""durable_nb.serde: values and step errors round-trip; decoding fails only with DecodeError
and never imports or runs code named by the journal."""

from __future__ import annotations

import datetime
import json
import math
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import httpx
import openai
import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletion

import durable_nb as dn
from durable_nb import serde
from durable_nb.errors import SerializationError, StepFailed, TerminalError
from durable_nb.serde import DecodeError, MAX_DEPTH
from tests.openai_http import HTTP

REPO = Path(__file__).resolve().parents[1]


def round_trip(value):
    """encode -> JSON text -> decode, as a value goes through the journal."""
    return serde.decode(serde.loads(serde.dumps(serde.encode(value))))


def nested_list(levels: int) -> list:
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


# --- values -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Point:
    x: int
    y: int


serde.register_type(Point, lambda p: [p.x, p.y], lambda v: Point(*v), name="tests.Point")

UTC_PLUS_2 = datetime.timezone(datetime.timedelta(hours=2))


@pytest.mark.parametrize("value", [
    None, True, False, 0, -7, 2**100, 1.5, "", "ünïcode ✓",
    [], {}, [1, "a", None, [2.5]], {"a": {"b": [1, {"c": None}]}},
    (), (1, "a", (2,)), {1, 2, 3}, frozenset({"x", "y"}), set(),
    b"", b"\x00\xff binary",
    datetime.datetime(2026, 1, 1, 12, 30, 15, 123456),
    datetime.datetime(2026, 1, 1, 12, 30, tzinfo=UTC_PLUS_2),
    datetime.date(2026, 12, 1),
    Decimal("1.10"), Decimal("-0.000"), Decimal("1E+30"),
    float("inf"), float("-inf"),
    {"$t": "tuple", "v": [1, 2]},            # user data that looks like a tag
    {1: "int key", ("t", 1): "tuple key"},    # keys JSON cannot hold
    {"$t": 1, 2: 3},
    [(1, 2), {"k": frozenset({b"x"})}],
    Point(1, 2), [Point(3, 4)],
], ids=lambda value: _case_id(value))
def test_every_supported_value_round_trips_with_its_type(value):
    back = round_trip(value)
    assert back == value
    assert type(back) is type(value)
    if isinstance(value, Decimal):
        assert str(back) == str(value)  # the exponent too, not only the number
    if isinstance(value, datetime.datetime):
        assert back.tzinfo == value.tzinfo


def test_nan_round_trips():
    assert math.isnan(round_trip(float("nan")))


def test_openai_response_types_round_trip():
    completion = ChatCompletion.model_validate({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1767225600,
        "model": "gpt-4o-mini",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": None,
            "tool_calls": [{"id": "call_1", "type": "function",
                            "function": {"name": "f", "arguments": "{\"x\": 1}"}}]}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    })
    back = round_trip(completion)
    assert type(back) is ChatCompletion
    assert back == completion
    assert back.choices[0].message.tool_calls[0].function.arguments == "{\"x\": 1}"


def test_encode_refuses_values_decode_would_refuse():
    assert round_trip(nested_list(MAX_DEPTH)) == nested_list(MAX_DEPTH)
    with pytest.raises(SerializationError, match=f"more than {MAX_DEPTH} containers deep"):
        serde.encode(nested_list(MAX_DEPTH + 1))
    cycle: list = []
    cycle.append(cycle)
    with pytest.raises(SerializationError, match="containers deep"):
        serde.encode(cycle)


def test_unencodable_values_name_the_part_that_fails():
    with pytest.raises(SerializationError, match=r"result\['b'\]\[1\] is a builtins.object"):
        serde.encode({"a": 1, "b": [2, object()]})


# --- decoding fails with DecodeError only -----------------------------------------------------

def _case_id(data) -> str:
    try:
        text = repr(data)[:60]
    except ValueError:  # repr() of a huge int
        return f"huge {type(data).__name__}"
    # The same id in every process (pytest-xdist's workers must collect the same tests): no
    # object's address, no set's order (it follows the process's hash seed).
    if isinstance(data, (set, frozenset)) and data:
        text = f"{type(data).__name__}({sorted(map(repr, data))})"
    return re.sub(r" at 0x[0-9a-f]+", "", text)


def _tagged(children):
    return st.fixed_dictionaries(
        {"$t": st.sampled_from(["tuple", "set", "frozenset", "bytes", "datetime", "date",
                                "decimal", "dict", "float", "model", "tests.Point", "os.system",
                                "builtins.eval", "nope"]) | st.text() | children,
         "v": children},
        optional={"cls": st.sampled_from([
            "openai.types.chat.ChatCompletion", "openai.types.chat.chat_completion.ChatCompletion",
            "openai.types.chat.chat_completion.BaseModel", "openai.types.missing.Model",
            "concurrent.futures.ProcessPoolExecutor", "antigravity.Fly", "os.system", "tuple",
            "tests.Point"]) | st.text() | children})


json_data = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from(["$t", "v", "cls", "x"]) | st.text(), children, max_size=4)
    | _tagged(children),
    max_leaves=25)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_data)
def test_fuzz_decode_returns_or_raises_decode_error(data):
    before = set(sys.modules)
    try:
        serde.decode(data)
    except DecodeError:
        pass
    assert set(sys.modules) == before


@settings(max_examples=300, deadline=None)
@given(st.text() | st.binary())
def test_fuzz_loads_returns_or_raises_decode_error(text):
    try:
        serde.loads(text)
    except DecodeError:
        pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_data | st.fixed_dictionaries(
    {"type": st.sampled_from(["builtins.KeyError", "builtins.int", "openai.RateLimitError",
                              "os.system", "antigravity.Fly"]) | st.text(),
     "message": st.text() | json_data},
    optional={"args": json_data, "attrs": json_data, "terminal": json_data}))
def test_fuzz_decode_error_returns_an_exception_or_raises_decode_error(data):
    before = set(sys.modules)
    try:
        assert isinstance(serde.decode_error(data), Exception)
    except DecodeError:
        pass
    assert set(sys.modules) == before


@pytest.mark.parametrize("data", [
    {"$t": "unknown.Tag", "v": 1},
    {"$t": ["unhashable"], "v": 1},
    {"$t": "tuple"},                                   # no "v"
    {"$t": "tuple", "v": "abc"},                       # a str is not the list a tuple needs
    {"$t": "set", "v": [[1]]},                         # unhashable member
    {"$t": "bytes", "v": "not base64!"},
    {"$t": "datetime", "v": "yesterday"},
    {"$t": "decimal", "v": [0, [1], 0]},
    {"$t": "float", "v": 1.5},
    {"$t": "dict", "v": {"a": 1}},
    {"$t": "dict", "v": [[1, 2, 3]]},
    {"$t": "dict", "v": [[[1], 2]]},                   # unhashable key
    {"$t": "model", "cls": "openai.types.chat.ChatCompletion", "v": [1]},  # not an object
    # a model of the user's is validated; openai's reply types are built as received
    {"$t": "model", "cls": "tests.test_serde.Invoice", "v": {"number": "F-1"}},
    {"$t": "model", "cls": 7, "v": {}},
    {"$t": "tests.Point", "v": [1, 2, 3]},             # the registered decoder raises TypeError
    {1: "non-str key"},
    (1, 2),                                            # not JSON data
    {"x": object()},
    {"$t": 10**5000, "v": 1},                          # no repr() of it in the message either
], ids=_case_id)
def test_bad_data_raises_decode_error(data):
    with pytest.raises(DecodeError):
        serde.decode(data)


def test_deeply_nested_data_is_refused_at_the_limit():
    with pytest.raises(DecodeError, match=f"MAX_DEPTH={MAX_DEPTH}"):
        serde.decode(nested_list(10_000))
    deep_dict: dict = {}
    for _ in range(10_000):
        deep_dict = {"a": deep_dict}
    with pytest.raises(DecodeError, match=f"MAX_DEPTH={MAX_DEPTH}"):
        serde.decode(deep_dict)
    deep_tuple: dict = {"$t": "tuple", "v": []}
    for _ in range(10_000):
        deep_tuple = {"$t": "tuple", "v": [deep_tuple]}
    with pytest.raises(DecodeError, match=f"MAX_DEPTH={MAX_DEPTH}"):
        serde.decode(deep_tuple)
    deep_model = {"$t": "model", "cls": "openai.types.chat.ChatCompletion",
                  "v": {"id": nested_list(10_000)}}
    with pytest.raises(DecodeError, match=f"MAX_DEPTH={MAX_DEPTH}"):
        serde.decode(deep_model)
    with pytest.raises(DecodeError):
        serde.decode(nested_list(MAX_DEPTH + 1))


def test_deeply_nested_json_text_is_refused():
    with pytest.raises(DecodeError, match="nested too deeply"):
        serde.loads("[" * 10_000 + "]" * 10_000)
    with pytest.raises(DecodeError, match="nested too deeply"):
        serde.loads('{"a":' * 10_000 + "1" + "}" * 10_000)
    with pytest.raises(DecodeError, match="not valid JSON"):
        serde.loads('{"a": ')


def test_names_that_are_not_loaded_pydantic_models_are_refused():
    for name in ("concurrent.futures.ProcessPoolExecutor", "antigravity.Fly", "os.system",
                 "builtins.eval", "pydantic.main.BaseModel.model_validate"):
        with pytest.raises(DecodeError, match="not a pydantic model loaded"):
            serde.decode({"$t": "model", "cls": name, "v": {}})


# In a fresh interpreter, so that nothing the test process imported earlier can hide an import.
_NO_IMPORT_SCRIPT = textwrap.dedent("""
    import json, sys
    import concurrent.futures  # loaded, with its lazy module __getattr__ armed
    if sys.argv[2] == "openai loaded":
        import openai  # the one import decoding may make itself, for "openai." names
    from durable_nb import serde

    watched = ["concurrent.futures.process", "antigravity", "this", "openai.types.missing"]
    preloaded = [name for name in watched if name in sys.modules]
    before = set(sys.modules)
    models, errors = {}, {}
    for name in json.loads(sys.argv[1]):
        try:
            serde.decode({"$t": "model", "cls": name, "v": {}})
            models[name] = "decoded"
        except serde.DecodeError:
            models[name] = "DecodeError"
        except BaseException as exc:
            models[name] = type(exc).__name__
        rebuilt = serde.decode_error({"type": name, "message": "m", "args": ["m"]})
        errors[name] = type(rebuilt).__name__
    new_modules = sorted(set(sys.modules) - before)
    # The control: attribute access on the module does import, so the check above can see it.
    getattr(concurrent.futures, "ProcessPoolExecutor")
    print(json.dumps({"preloaded": preloaded, "new_modules": new_modules, "models": models,
                      "errors": errors,
                      "control_imported": "concurrent.futures.process" in sys.modules}))
""")

HOSTILE_NAMES = [
    "concurrent.futures.ProcessPoolExecutor",
    "concurrent.futures.process.BrokenProcessPool",   # an exception class, module not loaded
    "antigravity.Fly",
    "this.s",
    "os.system",
    "builtins.eval",
    "openai.types.missing.Model",
    "openai.types.missing",
]


@pytest.mark.parametrize("openai_state, names", [
    # openai imported already: nothing at all is imported, whatever the names say.
    ("openai loaded", HOSTILE_NAMES),
    # openai not imported (every command, a kernel before its first model call): names that
    # are not openai's import nothing either, not even openai.
    ("openai not loaded", [n for n in HOSTILE_NAMES if not n.startswith("openai.")]),
])
def test_decoding_hostile_names_imports_nothing_in_a_fresh_process(openai_state, names):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", _NO_IMPORT_SCRIPT, json.dumps(names),
                           openai_state], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["preloaded"] == []
    assert result["new_modules"] == []
    assert result["models"] == dict.fromkeys(names, "DecodeError")
    assert result["errors"] == dict.fromkeys(names, "StepFailed")
    assert result["control_imported"] is True


def test_an_openai_name_imports_openai_itself_and_no_module_the_name_gives():
    """The one import decoding may make: ``openai`` (a dependency named by durable_nb, not by
    the journal), for a name under ``openai.``; the module the name gives is never imported."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", _NO_IMPORT_SCRIPT,
                           json.dumps(["openai.types.missing.Model"]), "openai not loaded"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert "openai" in result["new_modules"]
    assert "openai.types.missing" not in result["new_modules"]
    assert result["models"] == {"openai.types.missing.Model": "DecodeError"}


_OPENAI_ON_DEMAND_SCRIPT = textwrap.dedent("""
    import json, sys
    from durable_nb import serde
    imported_with_serde = "openai" in sys.modules
    completion = {"id": "c1", "object": "chat.completion", "created": 1, "model": "m",
                  "choices": [{"index": 0, "finish_reason": "stop",
                               "message": {"role": "assistant", "content": "hi"}}]}
    chat = serde.decode({"$t": "model", "v": completion,
                         "cls": "openai.types.chat.chat_completion.ChatCompletion"})
    response = serde.decode({"$t": "openai.Response", "v": {"id": "r1", "output": []}})
    error = serde.decode_error({"type": "openai.RateLimitError", "message": "slow down",
                                "mro": ["openai.APIStatusError", "openai.APIError"]})
    import openai
    print(json.dumps({
        "imported_with_serde": imported_with_serde,
        "chat": type(chat) is openai.types.chat.ChatCompletion
        and chat.choices[0].message.content == "hi",
        "response": type(response) is openai.types.responses.Response and response.id == "r1",
        "error": isinstance(error, openai.APIStatusError),
    }))
""")


def test_openai_types_decode_in_a_process_that_had_not_imported_openai():
    """serde does not import openai with itself (every command would pay ~1 s for it); a
    journal value naming an openai class imports openai, the hard dependency, on demand, and
    the value comes back as the real openai type, as when openai was imported up front."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", _OPENAI_ON_DEMAND_SCRIPT], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"imported_with_serde": False, "chat": True,
                                       "response": True, "error": True}


# --- step errors ------------------------------------------------------------------------------

class QuotaExceeded(Exception):
    """A constructor whose arguments are not the exception's args."""

    def __init__(self, user: str, limit: int) -> None:
        super().__init__(f"{user} is over the quota of {limit}")
        self.user = user
        self.limit = limit


class TwoArgs(Exception):
    def __init__(self, what: str, count: int) -> None:
        super().__init__(what, count)


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")


def error_round_trip(exc: BaseException, terminal: bool = False) -> BaseException:
    """encode_error -> JSON text -> decode_error, as a step failure goes through the journal."""
    return serde.decode_error(serde.loads(serde.dumps(serde.encode_error(exc, terminal=terminal))))


def assert_same_error(back: BaseException, exc: BaseException) -> None:
    assert type(back) is type(exc)
    assert back.args == exc.args
    assert str(back) == str(exc)


@pytest.mark.parametrize("exc", [
    KeyError("k"),
    ValueError("a", 2),
    ValueError(),
    RuntimeError("boom"),
    FileNotFoundError(2, "No such file or directory"),
    json.JSONDecodeError("Expecting value", "x", 0),
    TwoArgs("apples", 3),
    QuotaExceeded("alice", 3),
    TerminalError("the card was declined"),
    StepFailed("some.Type", "message"),
], ids=repr)
def test_errors_round_trip_with_type_args_and_message(exc):
    assert_same_error(error_round_trip(exc), exc)


def test_except_clauses_match_the_rebuilt_error():
    with pytest.raises(KeyError) as caught:
        raise error_round_trip(KeyError("k"))
    assert caught.value.args == ("k",)
    assert str(caught.value) == "'k'"


def test_constructor_attributes_come_back():
    back = error_round_trip(QuotaExceeded("alice", 3))
    assert (back.user, back.limit) == ("alice", 3)


def test_extra_attributes_come_back():
    exc = ValueError("bad row")
    exc.code = 7
    exc.details = {"row": 3, "columns": ("a", "b")}
    exc.add_note("while reading sales.csv")
    back = error_round_trip(exc)
    assert_same_error(back, exc)
    assert back.code == 7
    assert back.details == {"row": 3, "columns": ("a", "b")}
    assert back.__notes__ == ["while reading sales.csv"]


def _status_response(http, status: int, body: dict):
    request = http.Request("POST", "https://api.openai.com/v1/chat/completions",
                           headers={"Authorization": "Bearer sk-test-SECRET-7f3a9c"})
    return http.Response(status, json=body, headers={"x-request-id": "req_123"}, request=request)


@pytest.mark.parametrize("http", sorted({HTTP, httpx}, key=lambda m: m.__name__),
                         ids=lambda m: m.__name__)
@pytest.mark.parametrize(("status", "cls"), [(429, openai.RateLimitError),
                                             (418, openai.APIStatusError)])
def test_openai_status_errors_built_by_the_client_round_trip(http, status, cls):
    body = {"error": {"message": "Rate limit reached for gpt-4o", "type": "requests",
                      "param": None, "code": "rate_limit_exceeded"}}
    client = openai.OpenAI(api_key="sk-test-SECRET-7f3a9c", base_url="https://api.openai.com/v1")
    # How openai's client turns an HTTP error response into an exception.
    exc = client._make_status_error_from_response(_status_response(http, status, body))
    assert type(exc) is cls

    data = serde.encode_error(exc, terminal=False)
    text = serde.dumps(data)
    assert "SECRET" not in text and "Bearer" not in text  # the request's headers stay out

    back = serde.decode_error(serde.loads(text))
    assert_same_error(back, exc)
    assert isinstance(back, openai.APIStatusError)
    assert back.status_code == status
    assert back.body == body["error"]
    assert (back.code, back.type, back.request_id) == ("rate_limit_exceeded", "requests",
                                                       "req_123")
    assert back.message == exc.message


def test_openai_status_error_built_directly_round_trips():
    response = _status_response(HTTP, 500, {"error": {"message": "oops"}})
    exc = openai.InternalServerError("Error code: 500", response=response, body=None)
    back = error_round_trip(exc)
    assert_same_error(back, exc)
    assert isinstance(back, openai.APIStatusError) and back.status_code == 500


def test_terminal_flag_is_journaled():
    assert serde.encode_error(TerminalError("no"), terminal=True)["terminal"] is True
    assert serde.encode_error(ValueError("no"), terminal=False)["terminal"] is False


def test_unencodable_args_keep_type_and_message():
    exc = ValueError(object())
    data = serde.encode_error(exc, terminal=False)
    assert "args" not in data
    back = serde.decode_error(data)
    assert type(back) is ValueError
    assert str(back) == str(exc)


def test_attributes_that_may_hold_credentials_are_not_journaled():
    exc = RuntimeError("upstream refused")
    exc.headers = {"Authorization": "Bearer sk-live-SECRET"}
    exc.api_key = "sk-live-SECRET"
    exc.status = 401
    data = serde.encode_error(exc, terminal=False)
    assert "SECRET" not in serde.dumps(data)
    assert data["attrs"] == {"status": 401}


def test_a_broken_str_does_not_break_journaling_or_replay():
    data = serde.encode_error(Unprintable("x"), terminal=False)
    assert data["message"] == "<unprintable Unprintable>"
    # An exception whose str() raises would break whatever shows it: replay gives StepFailed.
    back = serde.decode_error(data)
    assert type(back) is StepFailed
    assert back.type_name == f"{__name__}.Unprintable"


def test_journals_without_args_rebuild_from_the_message():
    back = serde.decode_error({"type": "builtins.ValueError", "message": "boom",
                               "terminal": False})
    assert type(back) is ValueError and back.args == ("boom",)


def test_a_type_from_an_unloaded_module_becomes_step_failed():
    assert "antigravity" not in sys.modules
    back = serde.decode_error({"type": "antigravity.Oops", "message": "m", "args": ["m"]})
    assert type(back) is StepFailed
    assert (back.type_name, back.message) == ("antigravity.Oops", "m")
    assert "antigravity" not in sys.modules


@pytest.mark.parametrize("type_name", ["builtins.int", "os.system", "builtins.KeyboardInterrupt",
                                       "builtins.SystemExit", "builtins.BaseException",
                                       "json.JSONDecodeError.__init__", "builtins"])
def test_a_type_name_that_is_not_an_exception_class_becomes_step_failed(type_name):
    back = serde.decode_error({"type": type_name, "message": "m", "args": ["m"]})
    assert type(back) is StepFailed
    assert str(back) == f"{type_name}: m"


@pytest.mark.parametrize("data", [None, "builtins.KeyError", {"message": "m"}, {"type": 3},
                                  {"type": "builtins.KeyError", "message": ["m"]},
                                  {"type": "builtins.KeyError", "message": 10**5000}],
                         ids=_case_id)
def test_a_malformed_error_description_raises_decode_error(data):
    with pytest.raises(DecodeError):
        serde.decode_error(data)


# --- values that round-trip (issue 17, item 10) -----------------------------------------------


class Invoice(pydantic.BaseModel):
    number: str
    total: Decimal
    due: datetime.date


class Loose(pydantic.BaseModel):
    data: object  # holds a tuple that its JSON dump turns into a list


def test_a_pydantic_model_of_any_loaded_class_is_replayed_by_its_class(journal):
    crash = {"on": True}
    made: list = []

    def agent(ctx):
        invoice = ctx.run("bill", lambda: made.append(1) or Invoice(
            number="F-1", total=Decimal("12.50"), due=datetime.date(2024, 6, 1)))
        if crash["on"]:
            raise RuntimeError("crash after the step")
        return invoice.model_dump(mode="json")

    with pytest.raises(RuntimeError):
        dn.execute("r", agent, journal=journal)
    crash["on"] = False
    # The journaled model is rebuilt as an Invoice (it was a CorruptEntry on every resume).
    assert dn.execute("r", agent, journal=journal)["total"] == "12.50"
    assert made == [1]


def test_a_model_the_journal_cannot_read_back_is_refused_at_the_first_run():
    class Local(pydantic.BaseModel):  # defined in a function: not findable by its name
        x: int

    with pytest.raises(SerializationError, match=r"register_type\(.*Local\)"):
        serde.encode(Local(x=1))
    with pytest.raises(SerializationError, match="not equal"):
        serde.encode(Loose(data=(1, 2)))
    assert round_trip(Loose(data=[1, 2])) == Loose(data=[1, 2])

    serde.register_type(Local)
    assert round_trip(Local(x=1)) == Local(x=1)


_RAISE_SMTP = """
import sys, durable_nb as dn
def send():
    import smtplib
    raise smtplib.SMTPRecipientsRefused({"a@example.com": (550, b"no such user")})
def agent(ctx):
    try:
        ctx.run("send", send)
    except OSError as exc:
        return f"caught {type(exc).__name__}: {sorted(exc.args[0])}"
print(dn.execute("r", agent, journal=sys.argv[1]))
print("smtplib" in sys.modules)
"""


def test_an_exception_replays_as_its_nearest_loaded_base_in_a_process_without_its_module(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    runs = [subprocess.run([sys.executable, "-c", _RAISE_SMTP, str(tmp_path / "j")], env=env,
                           capture_output=True, text=True, timeout=60) for _ in range(2)]
    assert all(run.returncode == 0 for run in runs), [run.stderr for run in runs]
    first, replay = (run.stdout.splitlines() for run in runs)
    expected = "caught SMTPRecipientsRefused: ['a@example.com']"
    assert first == [expected, "True"]
    # Replayed without importing smtplib, `except OSError` still catches it.
    assert replay == [expected, "False"]
