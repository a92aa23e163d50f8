"""Drive a real JupyterLab server in headless Debian Chromium (playwright sync API).

`JupyterLab` runs `jupyter lab` on 127.0.0.1 with a private token and private Jupyter dirs;
`LabPage` opens notebooks in Chromium and runs cells / clicks widget buttons like a user.
Chromium comes from the Debian package (/usr/bin/chromium); playwright's own browser download is
never used.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
_PANEL = ".jp-NotebookPanel:visible"
#: The JupyterLab extension as built from this checkout (labextension/ -> durable_nb/labextension).
LABEXTENSION = Path(__file__).resolve().parents[2] / "durable_nb" / "labextension"


def chromium_available() -> bool:
    """True when Debian chromium and the playwright package are both usable."""
    if not (CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK)):
        return False
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return False
    return True


def require_chromium() -> None:
    """Skip the calling test when Chromium is missing, except under CI=true, where it fails.

    CI must prove the browser tests ran; a silent skip there would hide a broken setup.
    """
    if chromium_available():
        return
    why = f"{CHROMIUM} or the playwright package is missing (apt-get install chromium)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but {why}; .ci/run installs it")
    pytest.skip(why)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _write_jupyter_dirs(base: Path, python: str | None = None,
                        checkout: bool = True, toasts: bool = False) -> dict[str, str]:
    """Private Jupyter dirs: no user settings, no old workspaces, kernel = this interpreter,
    durable_nb's extensions as this checkout has them (``checkout``).

    With ``python`` (another environment's interpreter, e.g. a venv a test installed
    durable-nb into): nothing of this checkout is added; the kernel is that environment's own
    python3 kernel and durable_nb is what that environment installed, or nothing."""
    dirs = {
        "JUPYTER_CONFIG_DIR": base / "config",
        "JUPYTER_DATA_DIR": base / "data",
        "JUPYTER_RUNTIME_DIR": base / "runtime",
        "JUPYTERLAB_WORKSPACES_DIR": base / "workspaces",
    }
    for path in dirs.values():
        path.mkdir(parents=True)
    # No news/update fetches (no network) and no toasts covering the notebook (``toasts``:
    # JupyterLab's "do not disturb" off, for the tests of durable_nb's own toasts).
    notify = dirs["JUPYTER_CONFIG_DIR"] / "lab/user-settings/@jupyterlab/apputils-extension"
    notify.mkdir(parents=True)
    settings = {"fetchNews": "false", "checkForUpdates": False, "doNotDisturbMode": not toasts}
    (notify / "notification.jupyterlab-settings").write_text(json.dumps(settings))
    if python is not None:
        return {key: str(path) for key, path in dirs.items()}
    kernel_dir = dirs["JUPYTER_DATA_DIR"] / "kernels" / "python3"
    kernel_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
    }
    (kernel_dir / "kernel.json").write_text(json.dumps(spec))
    if checkout:
        _install_durable_nb(dirs["JUPYTER_CONFIG_DIR"], dirs["JUPYTER_DATA_DIR"])
    return {key: str(path) for key, path in dirs.items()}


def _install_durable_nb(config_dir: Path, data_dir: Path) -> None:
    """What installing the wheel does, for this checkout: the server extension enabled and the
    built JupyterLab extension linked where Lab looks first (an editable install installs
    neither; a wheel in the venv is shadowed, so the tests see this checkout's build)."""
    server_d = config_dir / "jupyter_server_config.d"
    server_d.mkdir(parents=True)
    enabled = {"ServerApp": {"jpserver_extensions": {"durable_nb.server": True}}}
    (server_d / "durable_nb.json").write_text(json.dumps(enabled))
    if (LABEXTENSION / "package.json").is_file():
        (data_dir / "labextensions").mkdir()
        (data_dir / "labextensions" / "durable-nb").symlink_to(LABEXTENSION)


#: The first cell of a parking notebook (:meth:`LabPage.park`): the magics loaded, said so.
SETUP_CELL = "%load_ext durable_nb\nprint('setup ok')"


def write_notebook(path: str | os.PathLike[str], sources: list[str]) -> Path:
    """Write a notebook of code cells bound to the python3 kernel (so Lab asks no kernel dialog)."""
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(src) for src in sources])
    nb.metadata["kernelspec"] = {
        "name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"
    }  # fmt: skip
    nbformat.write(nb, str(path))
    return Path(path)


def notebook7_available() -> bool:
    """True when Jupyter Notebook 7 (the `notebook` package) is installed."""
    try:
        from importlib.metadata import version

        return int(version("notebook").split(".")[0]) >= 7
    except Exception:  # noqa: BLE001 - not installed, or an unreadable version
        return False


class JupyterLab:
    """A `jupyter lab` server serving `root_dir`, ready (GET /api/status == 200) inside `with`.

    `env` is added to the server's environment, which kernels it starts inherit (e.g.
    DURABLE_NB_DIR). On exit all kernel sessions are deleted and the server is terminated.
    `timeout` (s) bounds the wait for the server to answer, which ends as soon as it does: a
    loaded machine (two test processes, other work) can take a minute to start JupyterLab.
    `app="notebook"` runs Jupyter Notebook 7 instead (the same front-end components).
    `python` runs the server (and its python3 kernel) with another environment's interpreter,
    with that environment's bin first on PATH, no PYTHONPATH and nothing of this checkout.
    `checkout=False`: this interpreter without durable_nb's extensions (an editable install's
    server, which has neither unless its environment was set up for them). `toasts=True`:
    notifications show as toasts (JupyterLab's "do not disturb" mode, on by default here, off).
    `log_level="DEBUG"`: the server logs every request (its log is `log_path`).
    """

    def __init__(
        self, root_dir: str | os.PathLike[str], env: dict[str, str] | None = None, timeout: float = 180,
        app: str = "lab", python: str | os.PathLike[str] | None = None, checkout: bool = True,
        toasts: bool = False, log_level: str | None = None,
    ) -> None:
        self.toasts = toasts
        self.log_level = log_level
        self.app = app
        self.checkout = checkout
        self.python = None if python is None else str(python)
        self.root_dir = Path(root_dir)
        self.env = env or {}
        self.timeout = timeout
        self.token = secrets.token_hex(16)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._base = Path(tempfile.mkdtemp(prefix="durable-nb-lab-"))
        self.log_path = self._base / "server.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        """The server's process id (``python -m jupyter`` execs ``jupyter-lab`` in place)."""
        assert self._proc is not None
        return self._proc.pid

    @property
    def runtime_dir(self) -> Path:
        """The server's Jupyter runtime directory (its ``jpserver-PID.json``)."""
        return self._base / "runtime"

    def __enter__(self) -> JupyterLab:
        env = {**os.environ, **_write_jupyter_dirs(self._base, self.python, self.checkout,
                                                       self.toasts)}
        if self.python is not None:
            env.pop("PYTHONPATH", None)
            env["PATH"] = os.pathsep.join([str(Path(self.python).parent), env.get("PATH", "")])
        env.update(self.env)
        cmd = [
            self.python or sys.executable, "-m", "jupyter", self.app, "--no-browser",
            "--allow-root", f"--port={self.port}", "--port-retries=0", "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.token={self.token}", f"--ServerApp.root_dir={self.root_dir}",
        ]  # fmt: skip
        if self.log_level is not None:
            cmd.append(f"--ServerApp.log_level={self.log_level}")
        with self.log_path.open("wb") as log:
            self._proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            self._wait_ready()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                code = self._proc.returncode
                raise RuntimeError(f"jupyter lab exited with {code}:\n{self.log_tail()}")
            try:
                self.api("GET", "/api/status")
                return
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.2)
        raise TimeoutError(f"jupyter lab not ready within {self.timeout}s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the server log, for failure messages."""
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def api(self, method: str, path: str) -> Any:
        """Call the server REST API with the token; returns decoded JSON (None for empty bodies)."""
        req = urllib.request.Request(
            self.url + path, method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def notebook_url(self, name: str) -> str:
        """The URL opening notebook `name` (relative to root_dir) in a fresh layout."""
        if self.app == "notebook":
            return f"{self.url}/notebooks/{name}?token={self.token}"
        # ?reset stops JupyterLab restoring earlier tabs whose hidden cells would match selectors.
        return f"{self.url}/lab/tree/{name}?reset&token={self.token}"

    def delete_sessions(self) -> None:
        """Shut down every kernel session the server runs (one that is restarting may refuse:
        the server's exit ends its kernel anyway)."""
        for session in self.api("GET", "/api/sessions"):
            try:
                self.api("DELETE", f"/api/sessions/{session['id']}")
            except urllib.error.HTTPError:
                pass

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._proc is not None and self._proc.poll() is None:
            try:
                self.delete_sessions()
            except (urllib.error.URLError, ConnectionError):
                pass  # the server is going away anyway; terminate() below ends its kernels
            self._proc.terminate()
            try:
                self._proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        shutil.rmtree(self._base, ignore_errors=True)


def element_shot(locator: Any, path: str | os.PathLike[str]) -> None:
    """Save a PNG of the element ``locator`` finds. A run's panel is drawn again when the run
    ends (its display is sent again, replacing its views): a screenshot begun on the node
    just replaced is taken again of the node that replaced it."""
    from playwright.sync_api import Error

    for _ in range(3):
        try:
            locator.screenshot(path=str(path))
            return
        except Error as exc:
            if "not attached to the DOM" not in str(exc):
                raise
    locator.screenshot(path=str(path))


class LabPage:
    """A headless Chromium tab on a running `JupyterLab`; closes the browser on exit.

    All selectors are scoped to the visible notebook panel; `timeout` (s) is the default wait.
    `timezone_id` (e.g. "Asia/Kathmandu"): the page's time zone, else the machine's.
    """

    def __init__(self, lab: JupyterLab, timeout: float = 30,
                 timezone_id: str | None = None) -> None:
        self.lab = lab
        self.timeout_ms = timeout * 1000
        self.timezone_id = timezone_id
        self._pw: Any = None
        self._browser: Any = None
        self.page: Any = None

    def __enter__(self) -> LabPage:
        from playwright.sync_api import sync_playwright

        self._pw = sync_playwright().start()
        try:
            self._browser = self._pw.chromium.launch(
                executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
            )
            self.page = self._browser.new_page(viewport={"width": 1400, "height": 1000},
                                               timezone_id=self.timezone_id)
            self.page.set_default_timeout(self.timeout_ms)
        except BaseException:
            self._pw.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self._browser.close()
        finally:
            self._pw.stop()
            self.lab.delete_sessions()

    @property
    def panel(self) -> Any:
        """Locator of the visible notebook panel."""
        return self.page.locator(_PANEL)

    def cell(self, index: int) -> Any:
        """Locator of cell `index` (0-based) in the visible notebook."""
        return self.panel.locator(".jp-Cell").nth(index)

    def open_notebook(self, name: str) -> None:
        """Open notebook `name` and wait until its first cell is shown."""
        self.page.goto(self.lab.notebook_url(name))
        self.cell(0).wait_for(state="visible")

    def wait_kernel_idle(self, timeout: float = 60) -> None:
        """Wait until the status bar shows the kernel Idle (kernel started and connected).

        Only meaningful before running cells: subshell status messages can show Idle while a
        cell is still blocked, so judge running cells by their output.
        """
        if self.lab.app == "notebook":  # Notebook 7 has no status bar: its toolbar indicator
            status = self.page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")
            status.first.wait_for(state="attached", timeout=timeout * 1000)
            return
        status = self.page.locator("#jp-main-statusbar").filter(has_text="Idle")
        status.wait_for(state="visible", timeout=timeout * 1000)

    def _click_unless_a_dialog(self, target: Any) -> None:
        """Click ``target``; where a dialog of the front end covers it, fail with what the
        dialog says (a click's own timeout names only the dialog's element)."""
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        try:
            target.click()
        except PlaywrightTimeout:
            dialog = self.page.locator(".jp-Dialog")
            if dialog.count():
                raise AssertionError(f"a dialog covers the page: "
                                     f"{' '.join(dialog.first.inner_text().split())!r}") from None
            raise

    def run_cell(self, index: int, attempts: int = 3) -> None:
        """Run cell `index` as a user would: click into its editor, press Shift+Enter.

        Right after a notebook opens, a front end may drop the keystroke while its kernel
        connection settles (seen in Notebook 7): the cell then keeps its empty prompt
        "[ ]:", and the keystroke is sent again (a cell that ran shows "[*]:" or "[N]:")."""
        prompt = self.cell(index).locator(".jp-InputPrompt").first
        for attempt in range(attempts):
            editor = self.cell(index).locator(".jp-InputArea-editor .cm-content")
            self._click_unless_a_dialog(editor)
            self.page.keyboard.press("Shift+Enter")
            try:
                self.page.wait_for_function(
                    "e => !/^\\[ \\]:?$/.test(e.textContent.trim())", arg=prompt.element_handle(),
                    timeout=10_000)
                return
            except Exception:  # noqa: BLE001 - playwright's TimeoutError
                if attempt == attempts - 1:
                    raise

    def cell_output_text(self, index: int) -> str:
        """The visible text of cell `index`'s output area ("" when it has none)."""
        # .jp-Cell-outputArea is the cell's own area; an Output widget nests another .jp-OutputArea.
        outputs = self.cell(index).locator(".jp-Cell-outputArea")
        return str(outputs.inner_text()) if outputs.count() else ""

    def _outputs(self, cell_index: int | None) -> Any:
        scope = self.panel if cell_index is None else self.cell(cell_index)
        return scope.locator(".jp-OutputArea-output")

    def click_button(self, text: str, cell_index: int | None = None) -> None:
        """Click the first widget button whose label contains `text` (in one cell's outputs
        when `cell_index` is given, else anywhere in the notebook's outputs)."""
        button = self._outputs(cell_index).locator("button.jupyter-button", has_text=text).first
        button.click()

    def wait_for_text(self, text: str, timeout: float = 30, cell_index: int | None = None) -> None:
        """Wait until `text` appears in cell outputs (never matches cell source code)."""
        found = self._outputs(cell_index).filter(has_text=text).first
        found.wait_for(state="visible", timeout=timeout * 1000)

    def park(self, name: str) -> None:
        """Open notebook ``name`` (:data:`SETUP_CELL`, then a ``%%durable_agent`` cell
        that asks for approval) and run both cells, as a person does, until the run's panel
        says it waits: "Approval needed"."""
        self.open_notebook(name)
        self.wait_kernel_idle()
        self.run_cell(0)
        self.wait_for_text("setup ok", cell_index=0)
        self.run_cell(1)
        self.wait_for_text("Approval needed", cell_index=1)

    def shut_down_kernel(self) -> None:
        """Shut the notebook's kernel down as a person does: Kernel menu, Shut Down Kernel."""
        self.page.locator("#jp-MainMenu").get_by_text("Kernel", exact=True).first.click()
        self.page.locator(".lm-Menu-content").get_by_text("Shut Down Kernel", exact=True).click()
        confirm = self.page.locator(".jp-Dialog button.jp-mod-accept")
        if confirm.count():
            confirm.click()

    def restart_kernel(self) -> None:
        """Restart the kernel as a person does: Kernel menu, Restart Kernel..., confirm."""
        self.page.locator("#jp-MainMenu, #jp-menu-panel").get_by_text(
            "Kernel", exact=True).first.click()
        self.page.locator(".lm-Menu-content").get_by_text("Restart Kernel…").first.click()
        self.page.locator(".jp-Dialog button.jp-mod-accept").click()

    def screenshot(self, path: str | os.PathLike[str]) -> None:
        """Save a full-page PNG (for debugging failures)."""
        self.page.screenshot(path=str(path), full_page=True)
