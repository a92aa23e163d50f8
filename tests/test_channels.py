"""The channels (durable_nb.notify.channels): a plug-in found through the ``durable_nb.channels``
entry point delivers a parked run's request; what each built-in channel sends keeps outside
text where it cannot act (Slack's mrkdwn, e-mail headers), and a webhook request replayed under
another delivery id is refused. Real parts: a package pip-installed into a venv of its own,
HTTP receivers on loopback (the bundled one and Tornado, which normalises header names), an
SMTP server on loopback.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import site
import subprocess
import sys
import textwrap
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import durable_nb as dn
from durable_nb.errors import NotifyConfigError
from durable_nb.journal import open_journal
from durable_nb.notify import EmailConfig, NotifyConfig, SlackConfig, WebhookConfig
from durable_nb.notify.audit import notifications
from durable_nb.notify.delivery import drain
from durable_nb.notify.loopback import MailSink, WebhookReceiver, verify

REPO = Path(__file__).resolve().parents[1]
PLUGIN = REPO / "tests" / "fixtures" / "teams_channel"
SECRET = "a-secret-shared-with-the-receiver"
EVIL = "```\nignore that <https://evil.example/pay|Approve…> <!channel> & <@U123>\n```"


def _park(run_id: str, journal: Path, notify: Any, name: str = "pay",
          details: Any = None, title: str | None = None) -> None:
    def ask(ctx: dn.Context) -> Any:
        return ctx.approval(name, details if details is not None else {"memo": EVIL})

    assert dn.execute(run_id, ask, journal=str(journal), on_approval="park", notify=notify,
                      title=title) is None
    assert drain(30)


# --- a plug-in, installed --------------------------------------------------------------------

@pytest.fixture(scope="module")
def plugin_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv that sees this environment's packages (durable_nb among them) and has the
    Teams plug-in pip-installed: the python to run in it."""
    root = tmp_path_factory.mktemp("plugin")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; "
                              "print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    parents = "".join(f"import site; site.addsitedir({p!r})\n" for p in site.getsitepackages())
    Path(purelib, "_this_environment.pth").write_text(parents)
    source = shutil.copytree(PLUGIN, root / "teams_channel")  # the build writes beside it
    # pip, from this environment, builds it as any package is (an isolated build: setuptools
    # from pip's cache or PyPI) and installs it into the venv alone.
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(source)],
                   check=True, capture_output=True)
    return python


def test_a_channel_installed_through_the_entry_point_delivers_a_parked_request(
        plugin_venv: Path, tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    journal.mkdir()
    with WebhookReceiver() as teams:
        (journal / "notify.toml").write_text(f'[teams]\nurl = "{teams.url}"\n')
        script = textwrap.dedent(f"""
            import durable_nb as dn
            from durable_nb.notify import channel_names, load_config
            from durable_nb.notify.delivery import drain

            assert channel_names() == ("webhook", "slack", "email", "teams"), channel_names()
            env = {{"DURABLE_NB_NOTIFY_CONFIG": "/nonexistent.toml",
                    "DURABLE_NB_NOTIFY_TEAMS_URL": "https://teams.example/hook"}}
            assert list(load_config(None, env).channels()) == ["teams"]
            ask = lambda ctx: ctx.approval("pay", {{"memo": "[click](https://evil.example)"}})
            assert dn.execute("r", ask, journal={str(journal)!r}, on_approval="park",
                              notify="teams", title="Refunds") is None
            assert drain(30)
        """)
        # durable_nb from this checkout, as the suite's kernels and children take it
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        proc = subprocess.run([str(plugin_venv), "-c", script], capture_output=True, text=True,
                              timeout=120, cwd=tmp_path, env=env)
        assert proc.returncode == 0, proc.stderr
        [request] = teams.wait_for(1)
    card = request["json"]["attachments"][0]["content"]
    assert card["type"] == "AdaptiveCard"
    assert card["body"][0]["text"] == "Approval needed: pay"
    assert "\\[click\\]\\(https://evil.example\\)" in card["body"][2]["text"]
    rows = notifications(open_journal(str(journal)), "r")
    assert [(r["channel"], r["state"]) for r in rows] == [("teams", "sent")]
    assert re.fullmatch(r"r/[^/]+/teams", request["json"]["durable_nb_delivery"])


def test_without_the_plug_in_its_channel_is_unknown(tmp_path: Path) -> None:
    with pytest.raises(NotifyConfigError, match="unknown channel 'teams': use webhook, slack, "
                                                "email"):
        dn.RunOptions(notify="teams")
    (tmp_path / "notify.toml").write_text('[teams]\nurl = "https://teams.example/hook"\n')
    from durable_nb.notify import load_config
    with pytest.raises(NotifyConfigError, match=r"unknown section \[teams\]"):
        load_config(tmp_path)


# --- Slack: outside text stays text ------------------------------------------------------------

def _mrkdwn_texts(payload: dict) -> list[str]:
    """Every text Slack formats (links, mentions) in a Block Kit payload."""
    found = [payload["text"]]

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "mrkdwn":
                found.append(node["text"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(payload["blocks"])
    return found


def test_slack_shows_a_tool_argument_and_a_title_as_text_never_as_links_or_mentions(
        tmp_path: Path) -> None:
    with WebhookReceiver() as slack:
        _park("r", tmp_path / "j", NotifyConfig(slack=SlackConfig(slack.url)),
              name="pay <!here>", title="Refund <https://evil.example|approve here> `x`")
        [request] = slack.wait_for(1)
    payload = request["json"]
    for text in _mrkdwn_texts(payload):
        assert "<https://evil" not in text and "<!channel>" not in text, text
        assert "<!here>" not in text and "<@U123>" not in text, text
    assert "&lt;https://evil.example|approve here&gt;" in json.dumps(payload)
    [details] = [b for b in payload["blocks"] if b["type"] == "section" and "text" in b]
    assert details["text"]["type"] == "plain_text"  # Slack formats nothing in it
    assert json.loads(details["text"]["text"]) == {"memo": EVIL}


# --- e-mail: outside text in headers -----------------------------------------------------------

def test_a_tool_name_with_line_breaks_adds_no_header_to_the_email(tmp_path: Path) -> None:
    with MailSink() as sink:
        config = NotifyConfig(email=EmailConfig(host=sink.host, port=sink.port,
                                                sender="dnb@example.org",
                                                to=("oncall@example.org",)))
        _park("r", tmp_path / "j", config,
              name="pay\r\nBcc: evil@example.org\r\nX-Injected: yes\r\n\r\nfake body",
              details={"note": "<script>alert(1)</script>"})
        [message] = sink.wait_for(1)
    assert [e["to"] for e in sink.envelopes] == [["oncall@example.org"]]
    assert message["Bcc"] is None and message["X-Injected"] is None
    assert message["Subject"].strip() == ("Approval needed: pay Bcc: evil@example.org X-Injected: yes "
                                  "fake body (run r)")
    assert "Run r waits for a decision on pay" in message.get_body(("plain",)).get_content()


def test_the_email_html_part_escapes_what_it_shows() -> None:
    from durable_nb.notify.channels import Notice
    notice = Notice(delivery_id="r/q/email", run_id="r", request_id="q", digest="d" * 64,
                    name="<b>pay</b>", details={"note": "<script>alert(1)</script>"},
                    requested_at=0.0, timeout_at=None, title="<i>t</i>", notebook=None,
                    journal="/j", links=({"to": "ana@example.org",
                                          "url": "https://hub.example/d/T?a=1&b=\"2\""},))
    message = EmailConfig(host="h", sender="dnb@example.org", to=("ana@example.org",)) \
        .message(notice, "ana@example.org")
    page = message.get_body(("html",)).get_content()
    assert "<script>" not in page and "<b>pay" not in page and "<i>t" not in page
    assert "&lt;script&gt;" in page and 'href="https://hub.example/d/T?a=1&amp;b=&quot;2&quot;"' \
        in page


# --- the webhook: a replay under another delivery id ---------------------------------------------

class TornadoReceiver:
    """A Tornado HTTP server on loopback, in a thread: it hands each request's headers over
    as Tornado names them (``X-Durable-Nb-Delivery``) to the docs' ``verify`` and to
    :func:`durable_nb.notify.loopback.verify`, and keeps both verdicts."""

    def __init__(self, docs_verify: Any) -> None:
        import tornado.httpserver
        import tornado.netutil
        import tornado.web
        self.verdicts: list[dict] = []
        self.arrived = threading.Condition()
        seen: set = set()
        receiver = self

        class Hook(tornado.web.RequestHandler):
            def post(self) -> None:
                headers = dict(self.request.headers.get_all())
                try:
                    docs = docs_verify(SECRET, headers, self.request.body, seen)
                except Exception as exc:  # kept: the test shows it
                    docs = f"{type(exc).__name__}: {exc}"
                with receiver.arrived:
                    receiver.verdicts.append({
                        "names": sorted(headers), "headers": headers, "body": self.request.body,
                        "docs": docs, "loopback": verify(SECRET, headers, self.request.body)})
                    receiver.arrived.notify_all()
                self.write("ok")

        sockets = tornado.netutil.bind_sockets(0, "127.0.0.1")
        self.url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}/hook"
        self.loop = asyncio.new_event_loop()
        started = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(self.loop)
            server = tornado.httpserver.HTTPServer(tornado.web.Application([("/hook", Hook)]))
            server.add_sockets(sockets)
            self.loop.call_soon(started.set)
            self.loop.run_forever()
            server.stop()

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        started.wait(10)

    def wait_for(self, count: int) -> list[dict]:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.verdicts) >= count, 30)
            return list(self.verdicts)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def _docs_verify() -> Any:
    page = (REPO / "docs" / "pages" / "guide" / "notifications.md").read_text()
    [snippet] = [s for s in re.findall(r"```py\n(.*?)```", page, re.S) if "def verify" in s]
    namespace: dict = {}
    exec(snippet, namespace)
    return namespace["verify"]


def test_a_webhook_replayed_under_another_delivery_id_is_refused_by_the_documented_receiver(
        tmp_path: Path) -> None:
    receiver = TornadoReceiver(_docs_verify())
    try:
        _park("r", tmp_path / "j", NotifyConfig(webhook=WebhookConfig(receiver.url, SECRET)))
        [genuine] = receiver.wait_for(1)
        assert "X-Durable-Nb-Delivery" in genuine["names"]  # not as durable_nb wrote it
        assert (genuine["docs"], genuine["loopback"]) == (True, None)
        replayed = {**genuine["headers"], "X-Durable-Nb-Delivery": "r/another-id/webhook"}
        replayed.pop("Content-Length", None)
        urllib.request.urlopen(urllib.request.Request(
            receiver.url, data=genuine["body"], headers=replayed, method="POST"), timeout=10)
        _, replay = receiver.wait_for(2)
    finally:
        receiver.stop()
    assert replay["docs"] is False
    assert replay["loopback"] == "bad signature"


# --- the docs' how-to -----------------------------------------------------------------------------

def test_the_write_a_channel_page_shows_the_tested_plug_in_and_its_example_runs(
        plugin_venv: Path, tmp_path: Path) -> None:
    page = (REPO / "docs" / "pages" / "guide" / "channels.md").read_text()
    module, example = re.findall(r"```python\n(.*?)```", page, re.S)
    assert module == (PLUGIN / "durable_nb_teams.py").read_text()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([str(plugin_venv), "-c", example], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env=env)
    assert (proc.returncode, proc.stdout) == (0, "Approval needed: pay\n"), proc.stderr


# --- the registry ---------------------------------------------------------------------------------

def _installed(site_dir: Path, name: str, module: str, source: str) -> None:
    """A distribution as pip leaves it in site-packages: the module, and a dist-info whose
    entry_points.txt declares ``name`` in ``durable_nb.channels``."""
    dist = site_dir / f"dnb_{name}-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: dnb-{name}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[durable_nb.channels]\n{name} = {module}\n")
    (site_dir / f"{module.split(':')[0]}.py").write_text(source)


def test_a_broken_plug_in_stops_only_the_runs_that_use_it_naming_itself(tmp_path: Path) -> None:
    site_dir = tmp_path / "site"
    _installed(site_dir, "pager", "dnb_pager:Pager", "import not_installed_anywhere\n")
    _installed(site_dir, "fax", "dnb_fax:Fax", textwrap.dedent("""
        class Fax:
            name = "fax"
            env = {"FAX_NUMBER": "number"}
            from_config = recipients = message = send = None
    """))
    script = textwrap.dedent("""
        from durable_nb.errors import NotifyConfigError
        from durable_nb.notify import channel_names, load_config

        print(channel_names())
        env = {"DURABLE_NB_NOTIFY_CONFIG": "/nonexistent.toml",
               "DURABLE_NB_NOTIFY_WEBHOOK": "https://example.org/hook"}
        print(list(load_config(None, env).channels()))
        for variable in ("DURABLE_NB_NOTIFY_PAGER_URL", "DURABLE_NB_NOTIFY_FAX_NUMBER"):
            try:
                load_config(None, {**env, variable: "1"})
            except NotifyConfigError as exc:
                print(exc)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(site_dir), str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    names, configured, broken, misnamed = proc.stdout.splitlines()
    assert names == "('webhook', 'slack', 'email', 'pager', 'fax')"
    assert configured == "['webhook']"  # the broken ones, unused, stop nothing
    assert broken == ("the channel plug-in 'pager' (dnb_pager:Pager) cannot be loaded: "
                      "ModuleNotFoundError: No module named 'not_installed_anywhere'. "
                      "Reinstall or uninstall it.")
    assert misnamed == ("the channel plug-in 'fax' (dnb_fax:Fax) reads FAX_NUMBER: its "
                        "variables must start with DURABLE_NB_NOTIFY_FAX_.")
