"""MkDocs hook: the docstrings' Sphinx roles shown as code, not as text.

The package's docstrings name other objects Sphinx's way (``:class:`~durable_nb.errors.X```),
which mkdocstrings renders as the text ":class:" before the code. This drops the role and, as
Sphinx does for ``~``, keeps only the last part of the dotted name.
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:class|func|meth|mod|attr|exc|data|obj):<code>(~?)([^<]*)</code>")


def _shown(match: re.Match[str]) -> str:
    name = match.group(2).rsplit(".", 1)[-1] if match.group(1) else match.group(2)
    return f"<code>{name}</code>"


def on_page_content(html: str, page: Any, **kwargs: Any) -> str:
    """Rewrite the roles in a built page."""
    return _ROLE.sub(_shown, html)
