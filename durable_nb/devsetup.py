"""``durable-nb dev-setup``: a checkout's two Jupyter extensions in this environment, as the
wheel installs them.

An editable install (``pip install -e``) places no data files, so JupyterLab finds no
"Durable runs" extension and Jupyter Server does not load ``durable_nb.server``. This links
the checkout's prebuilt Lab extension (``durable_nb/labextension``, built from
``labextension/``) where JupyterLab looks, as ``jupyter labextension develop --overwrite .``
does, and writes the server's config file, which ``jupyter server extension enable`` cannot
do (it refuses an extension that no config file names yet), both under ``sys.prefix``.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from .errors import DurableError

__all__ = ["checkout_root", "dev_setup"]

#: Where a wheel puts them, relative to the environment's prefix (pyproject's data-files).
LABEXTENSION = Path("share/jupyter/labextensions/durable-nb")
SERVER_CONFIG = Path("etc/jupyter/jupyter_server_config.d/durable_nb.json")


def checkout_root() -> Path | None:
    """The source checkout this durable_nb runs from (editable, or on sys.path), or None for
    an installed wheel."""
    root = Path(__file__).resolve().parents[1]
    if (root / "pyproject.toml").is_file() and (root / "labextension").is_dir():
        return root
    return None


def dev_setup(prefix: str | Path | None = None) -> str:
    """Link the Lab extension and write the server config under ``prefix`` (default: this
    environment's ``sys.prefix``); return what was done. Running it again is harmless."""
    root = checkout_root()
    if root is None:
        raise DurableError("durable_nb is installed from a wheel here, which placed both "
                           "extensions already: dev-setup is for a checkout installed with "
                           "pip install -e")
    built = root / "durable_nb" / "labextension"
    if not (built / "package.json").is_file():
        raise DurableError(f"{built} holds no built extension: cd labextension && jlpm install "
                           f"&& jlpm build, then run durable-nb dev-setup again")
    base = Path(prefix or sys.prefix)
    link = base / LABEXTENSION
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.is_file():
        link.unlink()
    elif link.is_dir():  # a wheel's copy installed before: replaced, as --overwrite does
        shutil.rmtree(link)
    link.symlink_to(built, target_is_directory=True)
    config = base / SERVER_CONFIG
    config.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(root / SERVER_CONFIG, config)
    return (f"linked {link} -> {built}\nwrote {config}\n"
            f"restart JupyterLab and reload the page")
