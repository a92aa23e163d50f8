"""ctx.chat against endpoints that fail: one retry layer, errors that say where and how to go
on, any OpenAI-compatible client. The real openai client over HTTP to the loopback server;
every count is taken at the server."""

from __future__ import annotations

import socket
import traceback

import openai
import pytest

import durable_nb as dn
from durable_nb import Status
from durable_nb.llm.endpoints import DEFAULT_RETRY, MAX_RETRY_WAIT, default_client, is_transient
from durable_nb.execution.retry import RetryPolicy
from durable_nb.testing import LoopbackServer, Quirks, Reply, ToolCall
from tests.openai_http import HTTP

KEY = "sk-test-do-not-journal-0123456789"
USER = {"role": "user", "content": "hi"}
FAST = RetryPolicy(max_attempts=4, initial_delay=0.01, max_delay=0.05)


@pytest.fixture
def server():
    with LoopbackServer(["fine"]) as srv:
        yield srv


def one_chat(client, **more):
    def handler(ctx):
        return ctx.chat(client=client, model="gpt-4", messages=[USER], **more
                        ).choices[0].message.content
    return handler


def client_for(server, **options):
    return openai.OpenAI(base_url=server.url, api_key=KEY, **options)


def journal_text(journal):
    return "".join(repr(entry) for run in journal.list_runs()
                   for entry in journal.steps(run.run_id)) + "".join(
        run.to_json() for run in journal.list_runs())


# --- retried: transient failures ---------------------------------------------------------------

@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 504])
def test_a_transient_status_is_retried_honouring_retry_after(journal, server, status):
    server.fail_next(2, status, retry_after=0.01)
    assert dn.execute("r", one_chat(client_for(server)), journal=journal) == "fine"
    assert (server.count(kind="failure"), server.count()) == (2, 1)


def test_a_client_with_its_own_retries_does_not_stack_them_on_ours(journal, server):
    client = client_for(server, max_retries=5)  # openai would send 6 requests per call
    server.fail_next(50, 503, retry_after=0.01)
    with pytest.raises(dn.EndpointError) as caught:
        dn.execute("r", one_chat(client), journal=journal)
    assert server.count(kind="failure") == DEFAULT_RETRY.max_attempts == 4
    assert caught.value.attempts == 4 and caught.value.transient
    assert "Tried 4 times" in str(caught.value)
    assert client.max_retries == 5  # the user's client is left as it was


def test_connection_resets_are_retried(journal, server):
    server.drop_next(2)
    assert dn.execute("r", one_chat(client_for(server), retry=FAST), journal=journal) == "fine"
    assert (server.count(kind="dropped"), server.count()) == (2, 1)


def test_a_server_that_is_still_loading_is_waited_for(journal):
    with LoopbackServer(["loaded"], quirks=Quirks(loading_for=2)) as srv:
        assert dn.execute("r", one_chat(client_for(srv), retry=FAST), journal=journal) == "loaded"
        assert (srv.count(kind="failure"), srv.count()) == (2, 1)


def test_a_gateway_error_page_is_retried(journal, server):
    server.fail_next(1, 500, body="<html><body><h1>500 Internal Server Error</h1></body></html>",
                     retry_after=0.01)
    assert dn.execute("r", one_chat(client_for(server)), journal=journal) == "fine"
    assert server.count(kind="failure") == 1


def test_retries_stop_when_the_server_asks_to_wait_longer_than_the_limit(journal, server):
    server.fail_next(1, 429, retry_after=MAX_RETRY_WAIT + 60)
    with pytest.raises(dn.EndpointError, match=r"asks to wait 120 s before trying again"):
        dn.execute("r", one_chat(client_for(server)), journal=journal)
    assert server.count(kind="failure") == 1


def test_the_total_wait_of_the_default_policy_is_bounded():
    # The default schedule (no retry-after) waits at most this much in all: a dead endpoint
    # fails in seconds, not after 12-14 s of stacked retries.
    most = sum(min(DEFAULT_RETRY.max_delay, DEFAULT_RETRY.initial_delay * 2 ** i)
               * (1 + DEFAULT_RETRY.jitter) for i in range(DEFAULT_RETRY.max_attempts - 1))
    assert most <= 4.2 <= MAX_RETRY_WAIT


# --- not retried: requests the server refuses --------------------------------------------------

@pytest.mark.parametrize("status, advice", [
    (400, "Shorten the messages (ctx.compact)"),
    (401, "Check the API key"),
    (403, "Check the API key"),
    (404, "Check the URL"),
    (422, "Not retried"),
])
def test_a_deterministic_4xx_is_sent_once_and_fails_with_the_servers_message(
        journal, server, status, advice):
    server.fail_next(5, status, retry_after=0.01)
    with pytest.raises(dn.EndpointError) as caught:
        dn.execute("r", one_chat(client_for(server, max_retries=2)), journal=journal)
    assert server.count(kind="failure") == 1
    error = caught.value
    assert error.status_code == status and not error.transient
    assert f"{server.url}/chat/completions answered HTTP {status}" in str(error)
    assert "Not retried" in str(error) and advice in str(error)
    assert isinstance(error.__cause__, openai.APIStatusError)


def test_a_500_whose_body_shows_a_bad_request_is_sent_once(journal):
    # llama-cpp-python answers a tool-call message without "content" with this 500, every time.
    with LoopbackServer([Reply(tool_calls=[ToolCall("f", {})]), "x"],
                        quirks=Quirks(require_content=True)) as srv:
        client = client_for(srv)

        def handler(ctx):
            messages = [USER]
            message = ctx.chat(client=client, model="gpt-4", messages=messages).choices[0].message
            messages += [message.model_dump(exclude_none=True),  # drops "content"
                         {"role": "tool", "tool_call_id": message.tool_calls[0].id,
                          "content": "ok"}]
            return ctx.chat(client=client, model="gpt-4", messages=messages).choices[0].message.content

        with pytest.raises(dn.EndpointError) as caught:
            dn.execute("r", handler, journal=journal)
        assert (srv.count(kind="failure"), srv.count()) == (1, 1)
    message = str(caught.value)
    assert "answered HTTP 500: 'dict object' has no attribute 'content'" in message
    assert "durable_nb.assistant_message(message)" in message
    assert caught.value.step == 1


# --- errors that say where and how to go on ----------------------------------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_dead_endpoint_fails_with_its_url_the_step_and_how_to_go_on(journal):
    url = f"http://127.0.0.1:{_free_port()}/v1"  # nothing listens there
    client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=2)

    def handler(ctx):
        ctx.run("before", lambda: 1)
        return ctx.chat(client=client, model="gpt-4", messages=[USER], retry=FAST)

    with pytest.raises(dn.EndpointError) as caught:
        dn.execute("r", handler, journal=journal)
    message = str(caught.value)
    assert f"ctx.chat failed at step 1 (model 'gpt-4'): cannot reach {url}/chat/completions" in message
    assert "Tried 4 times" in message and "Check that the server runs at that URL" in message
    assert message.endswith("The run is kept; re-run the cell (or durable_nb.execute(...)) to "
                            "continue from step 1.")
    assert KEY not in message and isinstance(caught.value.__cause__, openai.APIConnectionError)
    record = dn.get_run("r", journal=journal)
    assert record.status is Status.FAILED and record.failed_step == 1


def test_the_run_goes_on_from_the_failed_step_when_executed_again(journal, server):
    ran = []

    def handler(ctx):
        ctx.run("before", lambda: ran.append("before"))
        return ctx.chat(client=client_for(server), model="gpt-4", messages=[USER]
                        ).choices[0].message.content

    server.fail_next(1, 400)
    with pytest.raises(dn.EndpointError, match="continue from step 1"):
        dn.execute("r", handler, journal=journal)
    assert dn.execute("r", handler, journal=journal) == "fine"
    assert ran == ["before"] and server.count() == 1
    steps = list(journal.steps("r"))
    assert [(s.kind, s.ok) for s in steps] == [("run", True), ("chat", True)]


def test_an_endpoint_error_caught_by_the_loop_is_replayed_as_it_was(journal, server):
    seen = []

    def handler(ctx):
        try:
            ctx.chat(client=client_for(server), model="gpt-4", messages=[USER])
        except dn.EndpointError as exc:
            seen.append((exc.status_code, exc.url))
            return "gave up"
        return "answered"

    server.fail_next(1, 403)
    assert dn.execute("r", handler, journal=journal) == "gave up"
    assert dn.execute("r", handler, journal=journal) == "gave up"  # replayed: no new request
    assert server.count(kind="failure") == 1 and server.count() == 0
    assert seen[0] == seen[-1] == (403, f"{server.url}/chat/completions")


def test_api_keys_reach_neither_errors_nor_the_journal(journal, server):
    server.fail_next(1, 401)
    with pytest.raises(dn.EndpointError) as caught:
        dn.execute("r", one_chat(client_for(server)), journal=journal)
    dn.execute("ok", one_chat(client_for(server)), journal=journal)
    assert KEY not in str(caught.value) and KEY not in journal_text(journal)


def test_a_bug_in_the_call_is_not_taken_for_an_endpoint_error(journal, server):
    with pytest.raises(TypeError, match="no_such_option"):
        dn.execute("r", one_chat(client_for(server), no_such_option=1), journal=journal)
    assert server.count() == server.count(kind="failure") == 0


def test_is_transient_reads_the_servers_verdict():
    assert is_transient(openai.APIConnectionError(request=_request()))
    assert is_transient(openai.APITimeoutError(request=_request()))
    assert is_transient(_status(500, {"message": "The server had an error", "type": "server_error"}))
    assert not is_transient(_status(500, {"message": "1 validation error: Field required"}))
    assert not is_transient(_status(429, {"message": "quota", "code": "insufficient_quota"}))
    assert is_transient(_status(400, {"message": "x"}, {"x-should-retry": "true"}))
    assert not is_transient(_status(503, {"message": "x"}, {"x-should-retry": "false"}))
    assert not is_transient(_status(501, {"message": "not implemented"}))


def _request():
    return HTTP.Request("POST", "http://127.0.0.1:1/v1/chat/completions")


def _status(status, body, headers=None):
    response = HTTP.Response(status, json={"error": body}, headers=headers or {},
                               request=_request())
    return openai.OpenAI(api_key="k", base_url="http://127.0.0.1:1/v1")._make_status_error(
        "error", body=body, response=response)


# --- any OpenAI-compatible client ------------------------------------------------------------

@pytest.mark.parametrize("where", ["azure_endpoint", "base_url"])
def test_azure_openai_clients_work_and_their_errors_name_the_endpoint(journal, server, where):
    root = server.url.removesuffix("/v1")
    place = {"azure_endpoint": root} if where == "azure_endpoint" else {"base_url": server.url}
    client = openai.AzureOpenAI(api_key=KEY, api_version="2024-10-21", max_retries=2, **place)
    assert dn.execute("r", one_chat(client), journal=journal) == "fine"
    server.fail_next(1, 404)
    with pytest.raises(dn.EndpointError) as caught:
        dn.execute("e", one_chat(client), journal=journal)
    assert server.count(kind="failure") == 1
    url = caught.value.url
    assert url.startswith(root) and url.endswith("/deployments/gpt-4/chat/completions")
    assert "api-version" not in str(caught.value) and KEY not in str(caught.value)


def test_async_azure_client_works_streamed(journal, server):
    client = openai.AsyncAzureOpenAI(api_key=KEY, api_version="2024-10-21",
                                     azure_endpoint=server.url.removesuffix("/v1"))

    async def handler(ctx):
        reply = await ctx.chat_async(client=client, model="gpt-4", messages=[USER], stream=True)
        return reply.choices[0].message.content

    assert dn.execute("r", handler, journal=journal) == "fine"
    assert server.count() == 1


def test_the_default_client_comes_from_the_environment(journal, server, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", server.url)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    for name in ("OPENAI_API_TYPE", "AZURE_OPENAI_API_KEY", "AZURE_OPENAI_ENDPOINT",
                 "AZURE_OPENAI_AD_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    client = default_client()
    assert isinstance(client, openai.OpenAI) and client.max_retries == 0
    assert str(client.base_url).rstrip("/") == server.url
    assert dn.execute("r", lambda ctx: ctx.chat(model="gpt-4", messages=[USER])
                      .choices[0].message.content, journal=journal) == "fine"

    monkeypatch.delenv("OPENAI_API_KEY")
    monkeypatch.delenv("OPENAI_BASE_URL")
    monkeypatch.setenv("AZURE_OPENAI_API_KEY", KEY)
    monkeypatch.setenv("AZURE_OPENAI_ENDPOINT", server.url.removesuffix("/v1"))
    monkeypatch.setenv("OPENAI_API_VERSION", "2024-10-21")
    azure = default_client()
    assert isinstance(azure, openai.AzureOpenAI) and azure.max_retries == 0
    assert dn.execute("a", lambda ctx: ctx.chat(model="gpt-4", messages=[USER])
                      .choices[0].message.content, journal=journal) == "fine"
    assert server.count() == 2


def test_a_client_of_the_wrong_kind_is_refused_before_anything_is_sent(journal, server):
    aclient = openai.AsyncOpenAI(base_url=server.url, api_key=KEY)
    with pytest.raises(TypeError, match="needs a sync client"):
        dn.execute("r", one_chat(aclient), journal=journal)

    async def handler(ctx):
        return await ctx.chat_async(client=client_for(server), model="gpt-4", messages=[USER])

    with pytest.raises(TypeError, match="needs an async client"):
        dn.execute("a", handler, journal=journal)
    assert server.count() + server.count(kind="failure") == 0


# --- first errors: what a newcomer meets before any call worked --------------------------------

OFFLINE = ("To try it offline, start the bundled model server (`python -m durable_nb.testing` "
           "in a terminal) and set OPENAI_BASE_URL to the URL it prints and OPENAI_API_KEY to "
           "any value.")


def _printed(exc: BaseException) -> str:
    """What Python prints for ``exc`` uncaught (a script, a terminal)."""
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def test_no_api_key_is_one_short_message_with_the_url_and_the_offline_server(
        journal, monkeypatch):
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_API_TYPE", "AZURE_OPENAI_API_KEY",
                 "AZURE_OPENAI_ENDPOINT", "AZURE_OPENAI_AD_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(dn.EndpointError) as caught:
        dn.execute("r", lambda ctx: ctx.chat(model="gpt-4", messages=[USER]), journal=journal)
    assert str(caught.value) == ("no API key for https://api.openai.com/v1: set OPENAI_API_KEY, "
                                 "or pass client= with an api_key. Nothing was sent. " + OFFLINE)
    printed = _printed(caught.value)
    assert printed.count("no API key") == 1  # not once per exception of a chain
    assert "site-packages/openai" not in printed and "Missing credentials" not in printed


def test_an_unreachable_endpoint_names_the_url_and_the_offline_server(journal):
    url = f"http://127.0.0.1:{_free_port()}/v1"
    client = openai.OpenAI(base_url=url, api_key=KEY)
    with pytest.raises(dn.EndpointError) as caught:
        dn.execute("r", one_chat(client, retry=FAST), journal=journal)
    assert f"cannot reach {url}/chat/completions" in str(caught.value)
    assert OFFLINE in str(caught.value)


def test_a_wrong_api_key_names_the_url_the_key_variable_and_the_offline_server(journal, server):
    server.fail_next(1, 401, body={"error": {
        "message": "Incorrect API key provided: sk-wrong.", "type": "invalid_request_error",
        "param": None, "code": "invalid_api_key"}})
    with pytest.raises(dn.EndpointError) as caught:
        dn.execute("r", one_chat(client_for(server)), journal=journal)
    message = str(caught.value)
    assert f"{server.url}/chat/completions answered HTTP 401: Incorrect API key provided" \
        in message
    assert "Check the API key (OPENAI_API_KEY" in message and OFFLINE in message


@pytest.mark.parametrize("text, code", [
    ("The model `gpt-9` does not exist or you do not have access to it.", "model_not_found"),
    ("model 'gpt-9' not found, try pulling it first", None)])  # OpenAI; Ollama
def test_a_model_the_server_does_not_have_says_where_its_models_are_listed(
        journal, server, text, code):
    server.fail_next(1, 404, body={"error": {"message": text, "type": "invalid_request_error",
                                             "param": None, "code": code}})
    with pytest.raises(dn.EndpointError) as caught:
        dn.execute("r", one_chat(client_for(server)), journal=journal)
    message = str(caught.value)
    assert f"answered HTTP 404: {text}" in message
    assert f"Use a model this server has (GET {server.url}/models lists them)" in message
    assert "Check the URL" not in message


# The rate limit counts every request sent (issue 17, item 13) ----------------------------

class _FakeTime:
    """A clock that moves only when slept on: the limiter's waits are counted, not waited."""

    def __init__(self):
        self.now = 0.0

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_retries_after_a_5xx_pass_the_rate_limiter_like_the_first_request(
        server, journal, asynchronous):
    from durable_nb.batches.limits import BatchLimits

    fake = _FakeTime()
    limits = BatchLimits(requests_per_minute=3, clock=fake.clock, sleep=fake.sleep)
    server.fail_next(5, status=500)
    retry = RetryPolicy(max_attempts=6, initial_delay=0, max_delay=0, jitter=0)
    if asynchronous:
        async def handler(ctx):
            client = openai.AsyncOpenAI(base_url=server.url, api_key=KEY)
            reply = await ctx.chat_async(client=client, model="gpt-4", messages=[USER],
                                         retry=retry)
            return reply.choices[0].message.content
    else:
        handler = one_chat(client_for(server), retry=retry)
    assert dn.execute("r", handler, journal=journal, call_gate=limits) == "fine"
    sent = server.stats()["total"]
    assert sent == 6 and server.count(kind="failure") == 5
    assert limits.calls == sent  # every request passed the limiter, the retries too
    # 3 a minute: the first three at once, then one every 20 s of the limiter's clock.
    assert fake.now == pytest.approx(60.0)


def test_a_request_sent_again_without_stream_options_passes_the_rate_limiter(server, journal):
    from durable_nb.batches.limits import BatchLimits

    fake = _FakeTime()
    limits = BatchLimits(requests_per_minute=1, clock=fake.clock, sleep=fake.sleep)
    server.fail_next(1, status=400, body={"error": {
        "message": "Unrecognized request argument supplied: stream_options",
        "type": "invalid_request_error"}})
    handler = one_chat(client_for(server), stream=True)
    assert dn.execute("r", handler, journal=journal, call_gate=limits) == "fine"
    assert server.stats()["total"] == limits.calls == 2
    assert fake.now == pytest.approx(60.0)  # the second request waited for its minute
