"""A handler named in text, ``module:function`` or ``path/to/file.py:function``, as the
command line and the pytest plugin take it (as uvicorn and gunicorn name an app)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["load_object"]


def load_object(spec: str, what: str = "handler") -> Any:
    """The object ``spec`` names: ``module:name`` (the current directory importable during
    the import, as for ``python -m``; ``sys.path`` is left as it was) or ``file.py:name``;
    ``name`` may be dotted (``agents:Support.handler``).
    ValueError saying what to write when it cannot be found."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        raise ValueError(f"{what} {spec!r}: name it as module:function (e.g. "
                         f"my_agent:handler) or path/to/file.py:function")
    module = _module(target, spec, what)
    value: Any = module
    for part in name.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise ValueError(f"{what} {spec!r}: {target} has no {name!r}") from None
    return value


def _module(target: str, spec: str, what: str) -> Any:
    if target.endswith(".py") or os.sep in target:
        path = Path(target).resolve()
        if not path.is_file():
            raise ValueError(f"{what} {spec!r}: there is no file {path}")
        # Loaded anew at every call: the file as it is now, edited since or not.
        module_name = f"durable_nb_checked_{path.stem}"
        loader = importlib.util.spec_from_file_location(module_name, path)
        if loader is None or loader.loader is None:
            raise ValueError(f"{what} {spec!r}: {path} is not a Python file")
        module = importlib.util.module_from_spec(loader)
        sys.modules[module_name] = module
        loader.loader.exec_module(module)
        return module
    # The current folder importable for this import only: the process (a user's pytest
    # session) keeps its own sys.path.
    here = os.getcwd()
    added = "" not in sys.path and here not in sys.path
    if added:
        sys.path.insert(0, here)
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        if exc.name and target.startswith(exc.name):
            raise ValueError(f"{what} {spec!r}: no module {target!r} here (run from the "
                             f"folder that holds it, or set PYTHONPATH)") from None
        raise
    finally:
        if added and here in sys.path:
            sys.path.remove(here)
