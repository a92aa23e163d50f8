"""The Jupyter Server extension: runs and approvals without a kernel.

A REST API under ``{base_url}durable-nb/api/`` (:mod:`.handlers`, each checking requests
against its declared endpoint in :mod:`.api`, the versioned contract the REST reference is
rendered from) over the journals this user's server knows (:mod:`.journals`): list runs and
batches, one run with its steps, approve / reject a pending approval (bound to the digest of
what was shown), cancel; and the page a notification's decision link opens (:mod:`.decide`).
It reads and writes through the same journal interface as the kernel and never imports or
executes journal content. Enabled by
``etc/jupyter/jupyter_server_config.d/durable_nb.json``, which the package installs;
``jupyter server extension list`` shows it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["_jupyter_server_extension_points", "_load_jupyter_server_extension"]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "durable_nb.server"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    """Add the API's routes to the server's web application."""
    from ..approvals.authority import service_url
    from .decide import decide_handlers
    from .handlers import handlers

    from .notify import start_sweeper

    web_app = serverapp.web_app
    base_url = web_app.settings["base_url"]
    web_app.add_handlers(".*$", handlers(base_url) + decide_handlers(base_url))
    serverapp.log.info("durable_nb: REST API at %sdurable-nb/api/", base_url)
    # Parked runs' deadlines and the requests no kernel notified, with decision links to
    # this server when no base URL is configured; until the server's event loop is closed.
    # On a JupyterHub with the durable-nb service, it alone sweeps the team's journals (once
    # for everyone, links to the hub's public URL); a user's server would only be refused.
    hub_service = service_url()
    if hub_service:
        serverapp.log.info("durable_nb: the hub's durable-nb service at %s sweeps the "
                           "journals; this server does not", hub_service)
        return
    loop = getattr(serverapp.io_loop, "asyncio_loop", None)
    start_sweeper(server_url=serverapp.connection_url,
                  running=lambda: loop is None or not loop.is_closed())
