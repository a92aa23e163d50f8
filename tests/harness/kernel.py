"""Drive a real IPython kernel through jupyter_client, without a browser.

`KernelSession` runs cells, collects everything the kernel publishes, SIGKILLs and restarts the
kernel, and simulates widget button clicks the way JupyterLab sends them (a comm message, over a
kernel subshell when the kernel has them).
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager

KERNEL_NAME = "durable-nb-test-python"
_WIDGET_TARGET = "jupyter.widget"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class HarnessError(AssertionError):
    """The kernel did not do what a harness call expected (timeout, death, missing widget)."""


@dataclass
class ExecResult:
    """Everything one execute request produced, in arrival order per kind.

    `status` is the execute_reply status ("ok", "error", "aborted"); `comm_msgs` holds comm_open /
    comm_msg / comm_close contents the cell published (widget state updates among them).
    """

    status: str
    stdout: str = ""
    stderr: str = ""
    displays: list[dict[str, Any]] = field(default_factory=list)
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    comm_msgs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def traceback(self) -> str:
        """The error traceback as plain text (ANSI colours stripped), empty when the cell succeeded."""
        return _ANSI.sub("", "\n".join(self.error["traceback"])) if self.error else ""

    @property
    def text(self) -> str:
        """The text/plain of the execute_result; empty when the cell had none."""
        return (self.result or {}).get("text/plain", "")

    def raise_for_error(self) -> ExecResult:
        """Return self when the cell succeeded; raise HarnessError with the traceback otherwise."""
        if self.status != "ok":
            raise HarnessError(f"cell ended with status {self.status!r}:\n{self.traceback}")
        return self


@dataclass
class WidgetModel:
    """The latest state of one widget model seen on IOPub (comm_open plus later updates)."""

    model_id: str
    state: dict[str, Any]

    @property
    def model_name(self) -> str:
        return str(self.state.get("_model_name", ""))


def wait_until(predicate: Callable[[], bool], timeout: float = 30, what: str = "condition") -> None:
    """Poll `predicate` every 50 ms; raise HarnessError naming `what` if it stays false."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise HarnessError(f"{what} not true within {timeout}s")
        time.sleep(0.05)


def _write_kernelspec(spec_dir: Path, argv_prefix: list[str] | None = None) -> None:
    # A private spec pins the kernel to this interpreter; a system-wide "python3" spec might not.
    kdir = spec_dir / KERNEL_NAME
    kdir.mkdir(parents=True, exist_ok=True)
    spec = {
        "argv": [*(argv_prefix or []), sys.executable, "-m", "ipykernel_launcher", "-f",
                 "{connection_file}"],
        "display_name": "durable-nb test kernel",
        "language": "python",
    }
    (kdir / "kernel.json").write_text(json.dumps(spec))


class KernelSession:
    """One IPython kernel of the current interpreter plus a client connected to it.

    Guarantees: `execute` returns only after the kernel replied and went idle for that request
    (or raises HarnessError after `timeout`); every IOPub message is kept in `iopub_log` and widget
    states in `widgets`, whatever request they belong to.
    """

    def __init__(self, cwd: str | os.PathLike[str], env: Mapping[str, str] | None = None,
                 argv_prefix: list[str] | None = None) -> None:
        self.cwd = Path(cwd)
        self._spec_dir = Path(tempfile.mkdtemp(prefix="durable-nb-kspec-"))
        _write_kernelspec(self._spec_dir, argv_prefix)
        self.km = KernelManager(
            kernel_name=KERNEL_NAME,
            kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(self._spec_dir)]),
        )
        self._env = {**os.environ, **(env or {})}
        self.kc: Any = None
        self.iopub_log: list[dict[str, Any]] = []
        self.widgets: dict[str, WidgetModel] = {}
        self._subshell_id: str | None = None
        self._supports_subshells = False

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, timeout: float = 60) -> None:
        """Start the kernel in `cwd` with `env` and wait until it answers kernel_info."""
        self.km.start_kernel(cwd=str(self.cwd), env=self._env)
        self._connect(timeout)

    def _connect(self, timeout: float) -> None:
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=timeout)
        self.widgets.clear()
        self._subshell_id = None
        msg_id = self.kc.kernel_info()
        reply = self._shell_reply(msg_id, timeout)
        self._supports_subshells = "kernel subshells" in reply["content"].get(
            "supported_features", []
        )
        self.drain(0.2)

    @property
    def pid(self) -> int:
        """The kernel process id (the provisioner's child)."""
        return int(self.km.provisioner.pid)  # type: ignore[union-attr]

    @property
    def is_alive(self) -> bool:
        """Whether the kernel process is running."""
        return bool(self.km.is_alive())

    @property
    def supports_subshells(self) -> bool:
        """Whether the kernel advertised "kernel subshells" (ipykernel >= 7)."""
        return self._supports_subshells

    def kill(self, timeout: float = 10) -> None:
        """SIGKILL the kernel process, as a crash would, and assert it is dead."""
        pid = self.pid
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not self.is_alive, timeout, f"death of kernel pid {pid} after SIGKILL")

    def restart(self, timeout: float = 60, now: bool = True) -> None:
        """Start a fresh kernel process (same cwd/env) and connect a fresh client to it.

        Works after `kill()` too. All in-kernel state and widget bookkeeping are gone afterwards.
        `now=False` restarts as Kernel > Restart does: interrupt, ask the kernel to shut down,
        kill it only if it does not.
        """
        if self.kc is not None:
            self.kc.stop_channels()
        self.km.restart_kernel(now=now)
        self._connect(timeout)

    def shutdown(self) -> None:
        """Stop the client and the kernel; safe to call twice or after `kill()`."""
        if self.kc is not None:
            self.kc.stop_channels()
            self.kc = None
        if self.km.has_kernel:
            self.km.shutdown_kernel(now=True)
        shutil.rmtree(self._spec_dir, ignore_errors=True)

    # -- running code --------------------------------------------------------------------------

    def execute_async(self, code: str) -> str:
        """Send an execute request and return its msg_id at once (for a cell that will be killed)."""
        return str(self.kc.execute(code, store_history=True, allow_stdin=False))

    def execute(self, code: str, timeout: float = 60) -> ExecResult:
        """Run `code` and collect its output; raise HarnessError if it does not finish in time."""
        msg_id = self.execute_async(code)
        return self.wait_for(msg_id, timeout)

    def wait_for(self, msg_id: str, timeout: float = 60) -> ExecResult:
        """Collect the outputs of an execute request sent earlier with `execute_async`."""
        reply = self._shell_reply(msg_id, timeout)
        msgs = self._iopub_until_idle(msg_id, timeout)
        result = ExecResult(status=reply["content"]["status"])
        for msg in msgs:
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                name = content["name"]
                setattr(result, name, getattr(result, name) + content["text"])
            elif kind == "display_data":
                result.displays.append(content["data"])
            elif kind == "execute_result":
                result.result = content["data"]
            elif kind == "error":
                result.error = content
            elif kind.startswith("comm_"):
                result.comm_msgs.append({"msg_type": kind, **content})
        return result

    def _shell_reply(self, msg_id: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise HarnessError(f"no shell reply to {msg_id} within {timeout}s")
            try:
                reply = self.kc.get_shell_msg(timeout=min(remaining, 0.5))
            except queue.Empty:
                if not self.km.is_alive():
                    raise HarnessError(f"kernel died before replying to {msg_id}") from None
                continue
            if reply["parent_header"].get("msg_id") == msg_id:
                return dict(reply)

    def _iopub_until_idle(self, msg_id: str, timeout: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        mine: list[dict[str, Any]] = []
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise HarnessError(f"kernel not idle after {msg_id} within {timeout}s")
            msg = self._next_iopub(min(remaining, 0.5))
            if msg is None or msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return mine
            mine.append(msg)

    def _next_iopub(self, timeout: float) -> dict[str, Any] | None:
        try:
            msg = dict(self.kc.get_iopub_msg(timeout=timeout))
        except queue.Empty:
            return None
        self.iopub_log.append(msg)
        self._track_widget(msg)
        return msg

    def drain(self, timeout: float = 0.2) -> list[dict[str, Any]]:
        """Read IOPub until it is quiet for `timeout` s (output of callbacks and worker threads)."""
        got = []
        while (msg := self._next_iopub(timeout)) is not None:
            got.append(msg)
        return got

    def _track_widget(self, msg: dict[str, Any]) -> None:
        content = msg["content"]
        if msg["msg_type"] == "comm_open" and content.get("target_name") == _WIDGET_TARGET:
            state = dict(content["data"].get("state", {}))
            self.widgets[content["comm_id"]] = WidgetModel(content["comm_id"], state)
        elif msg["msg_type"] == "comm_msg" and content["comm_id"] in self.widgets:
            data = content["data"]
            if data.get("method") == "update":
                self.widgets[content["comm_id"]].state.update(data.get("state", {}))
        elif msg["msg_type"] == "comm_close":
            self.widgets.pop(content["comm_id"], None)

    # -- widgets -------------------------------------------------------------------------------

    def find_button(self, description: str) -> str:
        """The model_id of the newest Button whose description is `description`."""
        matches = [
            w.model_id
            for w in self.widgets.values()
            if w.model_name == "ButtonModel" and w.state.get("description") == description
        ]
        if not matches:
            seen = [w.state.get("description") for w in self.widgets.values()]
            raise HarnessError(f"no Button with description {description!r}; buttons seen: {seen}")
        return matches[-1]

    def widget_state(self, model_id: str) -> dict[str, Any]:
        """The latest state of a widget model as seen on IOPub (call `drain()` first for news)."""
        return self.widgets[model_id].state

    def _click_subshell(self, timeout: float) -> str | None:
        if not self._supports_subshells:
            return None
        if self._subshell_id is None:
            msg = self.kc.session.msg("create_subshell_request", {})
            self.kc.control_channel.send(msg)
            deadline = time.monotonic() + timeout
            while True:
                try:
                    reply = self.kc.get_control_msg(timeout=max(deadline - time.monotonic(), 0.01))
                except queue.Empty:
                    raise HarnessError(f"no create_subshell_reply within {timeout}s") from None
                if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                    self._subshell_id = reply["content"]["subshell_id"]
                    break
        return self._subshell_id

    def click_widget_button(self, model_id: str, timeout: float = 10) -> str:
        """Send a button click the way JupyterLab >= 4.4 does and return the comm_msg's msg_id.

        On kernels with subshells the message goes to a subshell created over the control channel
        (the kernel may re-route it to another shell); on ipykernel 6 it goes to the plain shell and
        waits behind a running cell. Returns without waiting for the callback: poll for its effect.
        """
        if model_id not in self.widgets:
            raise HarnessError(f"unknown widget model {model_id!r}; known: {list(self.widgets)}")
        content = {"comm_id": model_id, "data": {"method": "custom", "content": {"event": "click"}}}
        msg = self.kc.session.msg("comm_msg", content)
        subshell_id = self._click_subshell(timeout)
        if subshell_id is not None:
            msg["header"]["subshell_id"] = subshell_id
        self.kc.shell_channel.send(msg)
        return str(msg["header"]["msg_id"])


@contextmanager
def start_kernel(
    tmp_path: str | os.PathLike[str], env: Mapping[str, str] | None = None,
    argv_prefix: list[str] | None = None,
) -> Iterator[KernelSession]:
    """A started KernelSession with cwd `tmp_path` and extra `env`; shut down on exit.
    `argv_prefix` goes before the kernel's command (e.g. a mount namespace wrapper)."""
    session = KernelSession(tmp_path, env, argv_prefix)
    session.start()
    try:
        yield session
    finally:
        session.shutdown()
