"""A real JupyterHub on loopback for the tests: configurable-http-proxy (from npm), the dummy
authenticator (one shared password), SimpleLocalProcessSpawner single-user servers with
durable_nb's server extension, and the durable-nb service (``durable_nb.hub.service``)
started by the hub over one shared PostgreSQL journal with a role per person
(tests/hub_roles.py).

The proxy is found at ``$DURABLE_NB_CHP`` or in the npm prefix .ci/run installs it to
(``~/.cache/durable-nb/chp``); without it the tests skip, except under ``CI=true``.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from durable_nb.notify.loopback import free_port

CHP_PREFIX = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "durable-nb" / "chp"
PASSWORD = "hub-test-password"


def proxy_command() -> str:
    """configurable-http-proxy's command; skip the test without it (fail under CI=true)."""
    found = os.environ.get("DURABLE_NB_CHP") or str(CHP_PREFIX / "node_modules/.bin/"
                                                      "configurable-http-proxy")
    if Path(found).is_file() or shutil.which(found):
        return found
    why = (f"configurable-http-proxy is not installed ({found}; npm install --prefix "
           f"{CHP_PREFIX} configurable-http-proxy)")
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {why}; .ci/run installs it")
    pytest.skip(why)


def _config(hub: "Hub") -> str:
    """jupyterhub_config.py: everything from the hub's attributes, as an admin writes it."""
    return f"""
import json
c = get_config()  # noqa
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {hub.port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {free_port()}
c.JupyterHub.public_url = {hub.public_url!r}
c.JupyterHub.db_url = "sqlite:///" + {str(hub.root / "hub.sqlite")!r}
c.JupyterHub.cookie_secret_file = {str(hub.root / "cookie_secret")!r}
c.JupyterHub.cleanup_servers = True
c.ConfigurableHTTPProxy.command = [{hub.proxy!r}]
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{free_port()}"
c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = {PASSWORD!r}
c.Authenticator.allow_all = True
c.JupyterHub.spawner_class = "simple"
c.Spawner.cmd = [{str(Path(sys.executable).parent / "jupyterhub-singleuser")!r}]
c.Spawner.args = ["--allow-root"]
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
journal_urls = json.loads({json.dumps(hub.database.urls)!r})
c.Spawner.environment = {{
    # Each person's server logs in to the journal as her own role.
    "DURABLE_NB_JOURNAL": lambda spawner: journal_urls[spawner.user.name],
    "DURABLE_NB_HUB_SERVICE": {hub.service_url!r},
    "JUPYTER_CONFIG_DIR": {str(hub.root / "jupyter-config")!r},
    "JUPYTER_DATA_DIR": {str(hub.root / "jupyter-data")!r},
}}
# The server's token may reach the durable-nb service as its user (and nothing more).
c.Spawner.server_token_scopes = ["users:activity!user", "access:servers!server",
                                 "access:services!service=durable-nb"]
c.JupyterHub.services = [
    {{"name": "durable-nb", "url": "http://127.0.0.1:{free_port()}",
      "command": [{sys.executable!r}, "-m", "durable_nb.hub.service"],
      "oauth_no_confirm": True,
      "environment": {{"DURABLE_NB_JOURNAL": journal_urls["service"],
                      "DURABLE_NB_HUB_CONFIG": {str(hub.root / "durable-nb-hub.json")!r},
                      "DURABLE_NB_HUB_PUBLIC_URL": {hub.public_url!r},
                      **json.loads({json.dumps(hub.service_env)!r})}}}},
    {{"name": "test-admin", "api_token": {hub.admin_token!r}}},
]
c.JupyterHub.load_roles = [
    {{"name": "user", "scopes": ["self", "access:services!service=durable-nb"]}},
    {{"name": "test-admin", "services": ["test-admin"],
      "scopes": ["admin:users", "admin:servers", "tokens", "access:servers", "read:hub",
                 "access:services"]}},
]
"""


class Hub:
    """One JupyterHub with the durable-nb service: ``start()``, ``stop()``."""

    def __init__(self, database: Any, users: tuple[str, ...] = ("ana", "bo", "cy"),
                 service_env: dict[str, str] | None = None) -> None:
        self.database = database
        self.service_env = dict(service_env or {})
        self.users = users
        self.proxy = proxy_command()
        self.root = Path(tempfile.mkdtemp(prefix="dnb-hub-"))
        self.port = free_port()
        self.public_url = f"http://127.0.0.1:{self.port}/"
        self.service_url = self.public_url + "services/durable-nb/"
        self.admin_token = secrets.token_hex(16)
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 120) -> "Hub":
        """Start the hub (its proxy and the service with it) and create the users; a hub
        that does not come up is stopped, its proxy and service too."""
        try:
            return self._start(timeout)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout: float) -> "Hub":
        config_d = self.root / "jupyter-config" / "jupyter_server_config.d"
        config_d.mkdir(parents=True)
        (config_d / "durable_nb.json").write_text(json.dumps(
            {"ServerApp": {"jpserver_extensions": {"durable_nb.server": True}}}))
        kernel = self.root / "jupyter-data" / "kernels" / "python3"
        kernel.mkdir(parents=True)
        (kernel / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3", "language": "python"}))
        users = {u: {"email": f"{u}@team.test", "role": self.database.user_roles[u]}
                 for u in self.users}
        (self.root / "durable-nb-hub.json").write_text(json.dumps({"users": users}))
        (self.root / "jupyterhub_config.py").write_text(_config(self))
        self.log = open(self.root / "hub.log", "w")
        self.process = subprocess.Popen(
            [str(Path(sys.executable).parent / "jupyterhub"), "-f",
             str(self.root / "jupyterhub_config.py")], cwd=self.root,
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self._until(lambda: self.api("GET", "info") is not None, timeout, "the hub's API")
        self._until(lambda: self._service_up(), timeout, "the durable-nb service")
        for user in self.users:
            self.api("POST", f"users/{user}")
        return self

    def _service_up(self) -> bool:
        try:
            urllib.request.urlopen(self.service_url + "api/decide", timeout=5)
        except urllib.error.HTTPError as exc:
            return exc.code in (302, 403, 405)
        except OSError:
            return False
        return True

    def _until(self, ready, timeout: float, what: str) -> None:
        until = time.monotonic() + timeout
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise AssertionError(f"the hub exited while waiting for {what}:\n{self.tail()}")
            try:
                if ready():
                    return
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > until:
                raise AssertionError(f"{what} not ready within {timeout} s:\n{self.tail()}")
            time.sleep(0.3)

    def tail(self) -> str:
        """The hub's log's end, and the first traceback in it (a service that failed)."""
        text = (self.root / "hub.log").read_text()
        first = text.find("Traceback")
        return (text[first:first + 3000] + "\n...\n" if first >= 0 else "") + text[-3000:]

    def api(self, method: str, path: str, body: Any = None, token: str | None = None) -> Any:
        """The hub's REST API (as the test's admin service, or ``token``): the JSON answer."""
        request = urllib.request.Request(
            f"{self.public_url}hub/api/{path}", method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"token {token or self.admin_token}",
                     "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            text = response.read()
        return json.loads(text) if text else {}

    def start_server(self, user: str, timeout: float = 120) -> str:
        """Start ``user``'s single-user server: its URL (``.../user/NAME/``)."""
        try:
            self.api("POST", f"users/{user}/server")
        except urllib.error.HTTPError as exc:
            if exc.code != 400:  # 400: running already
                raise
        self._until(lambda: (self.api("GET", f"users/{user}")["servers"].get("", {})
                             .get("ready")), timeout, f"{user}'s server")
        return f"{self.public_url}user/{user}/"

    def stop_server(self, user: str, timeout: float = 60) -> None:
        try:
            self.api("DELETE", f"users/{user}/server")
        except urllib.error.HTTPError as exc:
            if exc.code != 400:
                raise
        self._until(lambda: not self.api("GET", f"users/{user}")["servers"], timeout,
                    f"{user}'s server to stop")

    def token(self, user: str) -> str:
        """A new hub API token of ``user`` (as her browser session or server has one)."""
        return self.api("POST", f"users/{user}/tokens",
                        {"note": "test", "expires_in": 3600})["token"]

    def stop(self) -> None:
        """Stop the users' servers and the hub, then whatever is left of its process group
        (the proxy and the service, which a hub that failed leaves running)."""
        if self.process is not None:
            if self.process.poll() is None:
                for user in self.users:
                    try:
                        self.stop_server(user)
                    except (OSError, AssertionError, urllib.error.URLError):
                        pass
                self.process.terminate()
                try:
                    self.process.wait(30)
                except subprocess.TimeoutExpired:
                    pass
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait(10)
        if hasattr(self, "log"):
            self.log.close()
        shutil.rmtree(self.root, ignore_errors=True)


def run_in_kernel(server_url: str, token: str, code: str, timeout: float = 120) -> str:
    """Run ``code`` in a new kernel of the single-user server at ``server_url`` (through the
    proxy, with ``token``), as a person running a cell: its output and any traceback's last
    line, as text. The kernel is shut down after."""
    headers = {"Authorization": f"token {token}", "Content-Type": "application/json"}

    def call(method: str, path: str, body: Any = None) -> Any:
        request = urllib.request.Request(server_url + path, method=method, headers=headers,
                                         data=None if body is None else json.dumps(body).encode())
        with urllib.request.urlopen(request, timeout=60) as response:
            text = response.read()
        return json.loads(text) if text else None

    kernel = call("POST", "api/kernels", {"name": "python3"})["id"]
    try:
        return asyncio.run(_execute(server_url.replace("http", "ws", 1) +
                                    f"api/kernels/{kernel}/channels", token, code, timeout))
    finally:
        call("DELETE", f"api/kernels/{kernel}")


async def _execute(url: str, token: str, code: str, timeout: float) -> str:
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    connection = await websocket_connect(HTTPRequest(
        url, headers={"Authorization": f"token {token}"}))
    msg_id = uuid.uuid4().hex
    connection.write_message(json.dumps({
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "test",
                   "session": uuid.uuid4().hex, "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": False, "store_history": False,
                    "user_expressions": {}, "allow_stdin": False}}))
    out: list[str] = []
    replied = idle = False
    until = time.monotonic() + timeout
    while not (replied and idle):
        text = await asyncio.wait_for(connection.read_message(), until - time.monotonic())
        if text is None:
            raise AssertionError("the kernel's websocket closed")
        msg = json.loads(text)
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind = msg["header"]["msg_type"]
        if kind == "stream":
            out.append(msg["content"]["text"])
        elif kind == "error":
            out.append(f"{msg['content']['ename']}: {msg['content']['evalue']}\n")
        elif kind == "execute_reply":
            replied = True
        elif kind == "status" and msg["content"]["execution_state"] == "idle":
            idle = True
    connection.close()
    return "".join(out)
