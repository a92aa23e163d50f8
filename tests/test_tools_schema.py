"""The @tool decorator: schemas from signatures and docstrings, argument checks, approval."""

from __future__ import annotations

import enum
import inspect
from typing import Annotated, Literal, Optional, TypedDict

import pytest
from pydantic import BaseModel
from typing_extensions import NotRequired

from durable_nb.llm.tools import Tool, parse_arguments, tool


class Unit(enum.Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


class Address(TypedDict):
    street: str
    city: str
    zip_code: NotRequired[int]


class LineItem(BaseModel):
    sku: str
    quantity: int = 1


class Order(BaseModel):
    items: list[LineItem]
    note: Optional[str] = None  # noqa: UP045 - the typing.Optional spelling is under test


# --- whole-schema snapshots ---------------------------------------------------------------

@tool
def get_weather(ctx, city: str, unit: Unit = Unit.CELSIUS, days: int | None = None) -> str:
    """Get the weather forecast
    for a city.

    Uses the national weather service.

    Args:
        city: The city name,
            e.g. Paris.
        unit (Unit): Temperature unit.
        days: How many days ahead.

    Returns:
        The forecast as text.
    """
    return f"{city}: sunny"


def test_google_docstring_enum_optional_and_ctx() -> None:
    assert get_weather.schema == {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather forecast for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "The city name, e.g. Paris."},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"],
                             "description": "Temperature unit.", "default": "celsius"},
                    "days": {"anyOf": [{"type": "integer"}, {"type": "null"}],
                             "description": "How many days ahead.", "default": None},
                },
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
    assert get_weather.takes_ctx


@tool(needs_approval=True)
def transfer(amount: float, to: Literal["alice", "bob"], tags: list[str],
             limits: dict[str, int], urgent: bool = False) -> None:
    """Transfer money.

    :param amount: Amount in EUR.
    :param str to: Who receives
        the money.
    :param tags: Labels for the ledger.
    :returns: nothing.
    """


def test_rest_docstring_literal_list_dict_bool() -> None:
    assert transfer.schema == {
        "type": "function",
        "function": {
            "name": "transfer",
            "description": "Transfer money.",
            "parameters": {
                "type": "object",
                "properties": {
                    "amount": {"type": "number", "description": "Amount in EUR."},
                    "to": {"type": "string", "enum": ["alice", "bob"],
                           "description": "Who receives the money."},
                    "tags": {"type": "array", "items": {"type": "string"},
                             "description": "Labels for the ledger."},
                    "limits": {"type": "object", "additionalProperties": {"type": "integer"}},
                    "urgent": {"type": "boolean", "default": False},
                },
                "required": ["amount", "to", "tags", "limits"],
                "additionalProperties": False,
            },
        },
    }
    assert not transfer.takes_ctx


@tool
def ship(address: Address, note: Annotated[str, "Shown to the courier."] = "") -> str:
    """Ship the parcel."""
    return "ok"


def test_typeddict_and_annotated_description() -> None:
    assert ship.schema["function"] == {
        "name": "ship",
        "description": "Ship the parcel.",
        "parameters": {
            "type": "object",
            "properties": {
                "address": {
                    "type": "object",
                    "properties": {"street": {"type": "string"}, "city": {"type": "string"},
                                   "zip_code": {"type": "integer"}},
                    "required": ["street", "city"],
                    "additionalProperties": False,
                },
                "note": {"type": "string", "description": "Shown to the courier.",
                         "default": ""},
            },
            "required": ["address"],
            "additionalProperties": False,
        },
    }


@tool
def place_order(order: Order) -> str:
    """Place an order.

    Args:
        order: What to order.
    """
    return "placed"


def test_pydantic_model_uses_model_json_schema_with_defs_hoisted() -> None:
    assert place_order.parameters == {
        "type": "object",
        "properties": {
            "order": {
                "type": "object",
                "title": "Order",
                "properties": {
                    "items": {"type": "array", "title": "Items",
                              "items": {"$ref": "#/$defs/LineItem"}},
                    "note": {"anyOf": [{"type": "string"}, {"type": "null"}],
                             "default": None, "title": "Note"},
                },
                "required": ["items"],
                "description": "What to order.",
            },
        },
        "required": ["order"],
        "additionalProperties": False,
        "$defs": {
            "LineItem": {
                "type": "object",
                "title": "LineItem",
                "properties": {"sku": {"type": "string", "title": "Sku"},
                               "quantity": {"type": "integer", "title": "Quantity",
                                            "default": 1}},
                "required": ["sku"],
            },
        },
    }


@tool(name="now", description="The current UTC time.")
def current_time() -> str:
    return "2025-01-01T00:00:00Z"


def test_no_parameters_and_overridden_name_and_description() -> None:
    assert current_time.schema == {
        "type": "function",
        "function": {
            "name": "now",
            "description": "The current UTC time.",
            "parameters": {"type": "object", "properties": {}, "required": [],
                           "additionalProperties": False},
        },
    }


# --- docstrings ----------------------------------------------------------------------------

def test_missing_docstring_gives_empty_description() -> None:
    @tool
    def bare(x: int) -> int:
        return x

    assert bare.description == ""
    assert bare.parameters["properties"] == {"x": {"type": "integer"}}


def test_google_args_with_types_blank_lines_and_following_sections() -> None:
    @tool
    def search(query: str, limit: int = 10) -> list[str]:
        """Search the index.

        Args:
            query (str): Words to look for. Supports
                quoted phrases: "like this".

            limit (int, optional): At most this many hits.

        Raises:
            ValueError: never documented as an argument.
        """
        return []

    props = search.parameters["properties"]
    assert props["query"]["description"] == (
        'Words to look for. Supports quoted phrases: "like this".')
    assert props["limit"]["description"] == "At most this many hits."
    assert search.description == "Search the index."


def test_docstring_starting_with_args_has_no_description() -> None:
    @tool
    def echo(text: str) -> str:
        """Args:
            text: What to echo.
        """
        return text

    assert echo.description == ""
    assert echo.parameters["properties"]["text"]["description"] == "What to echo."


# --- what the decorator refuses ---------------------------------------------------------------

def test_var_args_are_rejected_with_a_clear_error() -> None:
    def many(*names: str) -> None: ...

    def options(**opts: str) -> None: ...

    with pytest.raises(TypeError, match=r"\*names cannot be described.*declare each argument"):
        tool(many)
    with pytest.raises(TypeError, match=r"\*\*opts cannot be described"):
        tool(options)


def test_positional_only_parameters_are_rejected() -> None:
    def f(x: int, /) -> None: ...

    with pytest.raises(TypeError, match="positional-only"):
        tool(f)


def test_unsupported_types_name_the_parameter_and_the_supported_types() -> None:
    def f(pair: tuple[int, int]) -> None: ...

    def g(table: dict[int, str]) -> None: ...

    with pytest.raises(TypeError, match=r"parameter 'pair'.*Use str, int, float"):
        tool(f)
    with pytest.raises(TypeError, match="dict keys must be str"):
        tool(g)


def test_names_the_api_refuses_are_rejected() -> None:
    with pytest.raises(ValueError, match=r"Pass @tool\(name=...\)"):
        tool(lambda x: x)
    assert tool(lambda: 1, name="one").name == "one"


# --- the Tool object ------------------------------------------------------------------------

def test_tool_is_still_callable_like_the_function() -> None:
    assert isinstance(get_weather, Tool)
    assert get_weather(None, "Oslo") == "Oslo: sunny"
    assert list(inspect.signature(get_weather).parameters) == ["ctx", "city", "unit", "days"]


def test_schema_is_a_copy() -> None:
    get_weather.schema["function"]["parameters"]["properties"].clear()
    assert "city" in get_weather.schema["function"]["parameters"]["properties"]


# --- validate ---------------------------------------------------------------------------------

def test_valid_arguments_come_back_as_a_new_dict() -> None:
    arguments = {"city": "Paris", "days": None, "unit": "fahrenheit"}
    checked = get_weather.validate(arguments)
    assert checked == arguments and checked is not arguments


def test_missing_required_argument_says_what_is_expected() -> None:
    with pytest.raises(ValueError) as caught:
        get_weather.validate({})
    assert str(caught.value) == ("invalid arguments for tool 'get_weather': missing required "
                                 "argument 'city' (a string). Call it again with corrected "
                                 "arguments.")


def test_unknown_argument_lists_the_accepted_ones() -> None:
    with pytest.raises(ValueError, match="unknown argument 'town'; the accepted arguments "
                                         "are: city, unit, days"):
        get_weather.validate({"city": "Paris", "town": "Paris"})


def test_wrong_types_and_enum_values_are_all_reported() -> None:
    with pytest.raises(ValueError) as caught:
        get_weather.validate({"city": 3, "unit": "kelvin", "days": "2"})
    message = str(caught.value)
    assert "argument 'city' must be a string, got integer 3" in message
    assert 'argument \'unit\' must be one of "celsius", "fahrenheit", got "kelvin"' in message
    assert "argument 'days' must be an integer or null, got \"2\"" in message


def test_booleans_are_not_numbers() -> None:
    with pytest.raises(ValueError, match="argument 'amount' must be a number, got boolean true"):
        transfer.validate({"amount": True, "to": "bob", "tags": [], "limits": {}})
    transfer.validate({"amount": 5, "to": "bob", "tags": [], "limits": {}})  # int is a number


def test_nested_problems_name_their_path() -> None:
    with pytest.raises(ValueError) as caught:
        transfer.validate({"amount": 1.5, "to": "bob", "tags": ["a", 2], "limits": {"x": "y"}})
    message = str(caught.value)
    assert "argument 'tags[1]' must be a string, got integer 2" in message
    assert "argument 'limits.x' must be an integer, got string \"y\"" in message


def test_typeddict_fields_are_checked() -> None:
    with pytest.raises(ValueError) as caught:
        ship.validate({"address": {"street": "Main St 1", "country": "NO"}})
    message = str(caught.value)
    assert "missing required argument 'address.city' (a string)" in message
    assert "unknown argument 'address.country'" in message
    ship.validate({"address": {"street": "Main St 1", "city": "Oslo", "zip_code": 150}})


def test_pydantic_refs_are_followed() -> None:
    with pytest.raises(ValueError) as caught:
        place_order.validate({"order": {"items": [{"quantity": "two"}]}})
    message = str(caught.value)
    assert "missing required argument 'order.items[0].sku' (a string)" in message
    assert "argument 'order.items[0].quantity' must be an integer" in message
    place_order.validate({"order": {"items": [{"sku": "A1"}], "note": None}})


def test_arguments_must_be_an_object() -> None:
    with pytest.raises(ValueError, match="must be a JSON object, got array"):
        get_weather.validate([1, 2])  # type: ignore[arg-type]


# --- parse_arguments --------------------------------------------------------------------------

def test_parse_arguments_reads_a_json_object() -> None:
    assert parse_arguments(get_weather, '{"city": "Paris"}') == {"city": "Paris"}


def test_parse_arguments_treats_an_empty_string_as_no_arguments() -> None:
    assert parse_arguments(current_time, "") == {}


def test_parse_arguments_rejects_broken_json() -> None:
    with pytest.raises(ValueError, match=r"^arguments are not valid JSON: .*one JSON object"):
        parse_arguments(get_weather, '{"city": "Par')


def test_parse_arguments_rejects_non_objects() -> None:
    with pytest.raises(ValueError, match="must be a JSON object, got array"):
        parse_arguments(get_weather, '["Paris"]')


# --- approval ---------------------------------------------------------------------------------

def test_approval_defaults_to_false_and_can_be_always() -> None:
    assert not get_weather.requires_approval({"city": "Paris"})
    assert transfer.requires_approval({"amount": 1})


def test_approval_predicate_sees_the_arguments() -> None:
    @tool(needs_approval=lambda args: args["amount"] > 100)
    def pay(amount: float) -> None:
        """Pay."""

    assert pay.requires_approval({"amount": 150})
    assert not pay.requires_approval({"amount": 100})
