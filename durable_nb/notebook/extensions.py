"""Whether the Jupyter server that started this kernel has durable_nb's two extensions.

The panel links to the "Durable runs" sidebar and, once its kernel is shut down, leaves its
Approve / Reject to the saved view that the Lab extension turns into buttons deciding through
the server extension (``durable_nb.server``). Without them the link does nothing and, after
Kernel > Shut Down, the panel's buttons stay and do nothing: nothing in the browser can say
so then, so the panel says it beforehand (:func:`missing_extensions`).

The kernel asks the server itself, once per process, in a background thread started when
the extension loads: the server is found by its pid (``JPY_PARENT_PID``, which jupyter_client
gives a kernel it launches) among the ``jpserver-PID.json`` files of Jupyter's runtime
directory; two unauthenticated GETs on 127.0.0.1 answer without the token:
``durable-nb/api/version`` is 404 when the server extension is not loaded (403 or 200 when
it is), and ``lab/extensions/durable-nb/package.json`` is 404 when JupyterLab does not find
the Lab extension (static files need no login). A Lab extension is called missing only when
the same server serves ipywidgets' own Lab extension, so a server without JupyterLab is not
told to install one. A kernel no Jupyter server started (nbclient, papermill, VS Code, a
remote gateway) learns nothing and is told nothing.

The same answer tells ``%durable inbox`` whether the page in front of this kernel can show
the sidebar (:func:`lab_extension_served`): the server that started it serves the Lab
extension. That is a fact about the server, not about the page: a VS Code window attached
to such a server's kernel is taken for JupyterLab.
"""

from __future__ import annotations

import html
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Callable

from ..devsetup import checkout_root
from ..approvals.links import kernel_server_url as _server_url

__all__ = ["Missing", "lab_extension_served", "missing_extensions", "start_check"]

#: Seconds one request to the server may take (it runs on this machine).
_TIMEOUT = 3.0
_WIDGETS = "lab/extensions/@jupyter-widgets/jupyterlab-manager/package.json"


@dataclass(frozen=True)
class Missing:
    """What the server that started this kernel lacks, and the one command that fixes it."""

    server: bool
    lab: bool
    editable: bool  # durable_nb runs from a checkout: the contributor's command

    def __bool__(self) -> bool:
        return self.server or self.lab

    @property
    def fix(self) -> str:
        """The one command that fixes what is missing."""
        return "durable-nb dev-setup" if self.editable else 'pip install "durable-nb[lab]"'

    def text(self) -> str:
        """One paragraph: what is missing, what it costs, the command, and what then."""
        return self._said(str, str)

    def html(self) -> str:
        """:meth:`text` as HTML, each command as code."""
        return self._said(html.escape, lambda command: f"<code>{html.escape(command)}</code>")

    def _said(self, text: Callable[[str], str], code: Callable[[str], str]) -> str:
        parts = [name for name, gone in (("JupyterLab extension", self.lab),
                                         ("server extension", self.server)) if gone]
        disabled = "" if not self.server or self.editable else (
            text("; if it is installed already: ")
            + code("jupyter server extension enable durable_nb.server"))
        return (text(f"This Jupyter server has no durable_nb {' and no '.join(parts)}: the "
                     f"\"Durable runs\" link does nothing, and once the kernel is shut down "
                     f"this panel's Approve and Reject do nothing. Fix: ")
                + code(self.fix) + text(" (in the environment that runs JupyterLab")
                + disabled
                + text("), then restart JupyterLab and reload the page."))


#: Straight to the server: a proxy from the environment never sees these requests.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _status(url: str) -> int | None:
    """The HTTP status of an unauthenticated GET, or None when the server did not answer."""
    try:
        with _OPENER.open(url, timeout=_TIMEOUT) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, ValueError):
        return None


def _ask_server() -> tuple[Missing | None, bool]:
    """What the server lacks, and whether it serves durable_nb's Lab extension."""
    url = _server_url()
    if url is None:
        return None, False
    api = _status(url + "durable-nb/api/version")
    if api is None:
        return None, False
    extension = _status(url + "lab/extensions/durable-nb/package.json")
    lab = extension == 404 and _status(url + _WIDGETS) == 200
    missing = Missing(server=api == 404, lab=lab, editable=checkout_root() is not None)
    return (missing if missing else None), extension == 200


_result: list[tuple[Missing | None, bool]] = []
_done = threading.Event()
_started = threading.Lock()


def _check() -> None:
    try:
        _result.append(_ask_server())
    except Exception:  # noqa: BLE001 - a check that fails tells nothing; never the cell's error
        _result.append((None, False))
    finally:
        _done.set()


def start_check() -> None:
    """Ask the server in a background thread (once per process; later calls do nothing)."""
    if _started.acquire(blocking=False):
        threading.Thread(target=_check, name="durable-nb-extension-check", daemon=True).start()


def missing_extensions(wait: float = _TIMEOUT * 2) -> Missing | None:
    """What the Jupyter server that started this kernel lacks (None: nothing, or it could not
    be asked), waiting up to ``wait`` seconds for the one check of this process."""
    start_check()
    _done.wait(wait)
    return _result[0][0] if _result else None


def lab_extension_served(wait: float = _TIMEOUT * 2) -> bool:
    """Whether the Jupyter server that started this kernel serves durable_nb's Lab
    extension (its JupyterLab and Notebook 7 pages have the sidebar); False when it does
    not or could not be asked (nbclient, VS Code, Colab), waiting as
    :func:`missing_extensions` does."""
    start_check()
    _done.wait(wait)
    return bool(_result and _result[0][1])
