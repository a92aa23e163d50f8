"""What a step is asked, compared by value (issue 17, items 3, 4 and 9): every argument type
the journal encodes is fingerprinted by its value, arguments added to a step journaled without
any are a change, values that cannot be compared are refused before the step runs,
``ctx.state`` keeps a copy of what it is given, and a wrapped step failure is retried on
resume. Real diskcache journals, the public API only."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import uuid
from decimal import Decimal
from pathlib import Path

import pydantic
import pytest

import durable_nb as dn


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass
class Order:
    sku: str
    qty: int
    when: dt.date


class Address(pydantic.BaseModel):
    city: str
    zip: str


# Each: (a value, an edited value of the same type).
EDITS = {
    "Decimal": (Decimal("10.00"), Decimal("12.50")),
    "datetime": (dt.datetime(2024, 5, 1, 9, 30), dt.datetime(2024, 5, 1, 9, 31)),
    "date": (dt.date(2024, 5, 1), dt.date(2024, 5, 2)),
    "time": (dt.time(9, 30), dt.time(9, 45)),
    "Path": (Path("/data/in.csv"), Path("/data/out.csv")),
    "Enum": (Colour.RED, Colour.BLUE),
    "UUID": (uuid.UUID(int=1), uuid.UUID(int=2)),
    "dataclass": (Order("a", 1, dt.date(2024, 5, 1)), Order("a", 2, dt.date(2024, 5, 1))),
    "pydantic": (Address(city="Lyon", zip="69001"), Address(city="Lyon", zip="69002")),
    "nested": ({"total": [Decimal("1.5")]}, {"total": [Decimal("1.6")]}),
}


def _charge(calls: list, value):
    def agent(ctx):
        return ctx.run("charge", lambda v: calls.append(v) or len(calls), value)
    return agent


@pytest.mark.parametrize("kind", EDITS)
def test_an_edited_argument_of_every_encoded_type_is_an_input_change(journal, kind):
    first, edited = EDITS[kind]
    calls: list = []
    assert dn.execute("r", _charge(calls, first), journal=journal) == 1
    # The same value again replays (nothing runs); an edited one is reported, not replayed.
    assert dn.execute("r", _charge(calls, first), journal=journal) == 1
    with pytest.raises(dn.InputChanged):
        dn.execute("r", _charge(calls, edited), journal=journal)
    assert calls == [first]


def test_arguments_added_to_a_step_journaled_without_any_are_a_change(journal):
    calls: list = []

    def without(ctx):
        return ctx.run("fetch", lambda: calls.append("no args") or "old")

    def with_argument(ctx):
        return ctx.run("fetch", lambda url: calls.append(url) or "new", "https://b.example")

    assert dn.execute("r", without, journal=journal) == "old"
    # A step that still has no arguments replays from its empty fingerprint.
    assert dn.execute("r", without, journal=journal) == "old"
    with pytest.raises(dn.InputChanged, match="arguments were added"):
        dn.execute("r", with_argument, journal=journal)
    assert calls == ["no args"]

    assert dn.execute("back", with_argument, journal=journal) == "new"
    with pytest.raises(dn.InputChanged):  # and back: the arguments were removed
        dn.execute("back", without, journal=journal)


def test_a_value_that_cannot_be_compared_is_refused_before_the_step_runs(journal):
    calls: list = []

    class Client:  # an object with no value to compare
        pass

    def agent(ctx):
        return ctx.run("send", lambda c, to: calls.append(to), Client(), to="a@example.com")

    with pytest.raises(dn.SerializationError, match=r"args\[0\] is a .*Client.*closure"):
        dn.execute("r", agent, journal=journal)
    assert calls == []
    assert journal.count_steps("r") == 0


def test_state_keeps_a_copy_so_mutating_the_assigned_object_does_not_break_resume(journal):
    crash = {"on": True}
    sent: list = []

    def agent(ctx):
        items = ["a"]
        ctx.state["items"] = items
        items.append("b")  # after the assignment: the state keeps ["a"], as replay rebuilds it
        got = ctx.run("use", lambda xs: sent.append(list(xs)) or len(xs), ctx.state["items"])
        if crash["on"]:
            raise RuntimeError("crash after the step")
        return got

    with pytest.raises(RuntimeError):
        dn.execute("r", agent, journal=journal)
    crash["on"] = False
    assert dn.execute("r", agent, journal=journal) == 1
    assert sent == [["a"]]


class AppError(Exception):
    pass


def test_a_wrapped_transient_step_failure_is_retried_on_resume(journal):
    attempts: list = []

    def fetch():
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("upstream reset the connection")
        return "page"

    def agent(ctx):
        try:
            return ctx.run("fetch", fetch)
        except ConnectionError as exc:
            raise AppError("could not fetch the page") from exc

    with pytest.raises(AppError):
        dn.execute("r", agent, journal=journal)
    # The run failed because of step "fetch" (wrapped): resuming tries it again.
    assert dn.execute("r", agent, journal=journal) == "page"
    assert len(attempts) == 2
    assert dn.get_run("r", journal=journal).status is dn.Status.DONE


def test_numpy_scalars_are_compared_by_value(journal):
    numpy = pytest.importorskip("numpy")
    calls: list = []
    assert dn.execute("r", _charge(calls, numpy.int64(3)), journal=journal) == 1
    assert dn.execute("r", _charge(calls, numpy.int64(3)), journal=journal) == 1
    with pytest.raises(dn.InputChanged):
        dn.execute("r", _charge(calls, numpy.int64(4)), journal=journal)


def test_a_step_that_wraps_its_inner_steps_transient_failure_is_retried_with_it(journal):
    attempts: list = []

    def fetch():
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("upstream reset the connection")
        return "page"

    def load(ctx):
        try:
            return ctx.run("fetch", fetch)
        except ConnectionError as exc:
            raise AppError("could not load") from exc

    def agent(ctx):
        return ctx.run("load", load, ctx)

    with pytest.raises(AppError):
        dn.execute("r", agent, journal=journal)
    assert dn.execute("r", agent, journal=journal) == "page"
    assert len(attempts) == 2


def test_a_failure_handled_before_is_not_retried_for_the_step_that_failed_in_its_handler(
        journal):
    calls = {"primary": 0, "fallback": 0}

    def primary():
        calls["primary"] += 1
        raise ConnectionError("primary is down")

    def fallback():
        calls["fallback"] += 1
        if calls["fallback"] == 1:
            raise TimeoutError("fallback timed out")
        return "from fallback"

    def agent(ctx):
        try:
            return ctx.run("primary", primary)
        except ConnectionError:
            return ctx.run("fallback", fallback)  # its failure's context is primary's

    with pytest.raises(TimeoutError):
        dn.execute("r", agent, journal=journal)
    # The fallback failed the run: it is tried again; the handled primary failure replays.
    assert dn.execute("r", agent, journal=journal) == "from fallback"
    assert calls == {"primary": 1, "fallback": 2}
