"""How a step entry refers to the blobs its inputs are stored in.

A step's inputs are kept in its entry's ``request``; large parts are blobs of the run, stored
once by digest (:mod:`durable_nb.execution.inputs` makes them). A field of the request is then
one of:

- ``{"$blob": DIGEST}``: the field's value is that blob;
- ``{"$blobs": [DIGEST, ...]}``: a list (a chat's messages), one blob per item;
- ``{"$list": NODE}``: the same list, kept as a chain of *list nodes*, so that a request which
  repeats the conversation so far plus a few new messages costs the journal the new ones only.
  A node is a blob ``{"prev": NODE or null, "add": [DIGEST, ...]}``: the list of ``prev``
  followed by ``add``. Without the chain, each chat entry of an n-round conversation would
  hold n digests, and the journal would grow with the square of the rounds.

Nodes are blobs like any other (JSON text, content-addressed), so copying, deleting and
reading a run need nothing new but :func:`referenced_blobs` and :func:`expand_list`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence, Set
from typing import Any

__all__ = ["blob_digest", "expand_list", "list_node", "referenced_blobs"]

GetBlob = Callable[[str], "str | None"]


def blob_digest(text: str) -> str:
    """The digest a blob of ``text`` is stored under."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


def list_node(prev: str | None, add: Sequence[str]) -> tuple[str, str]:
    """(digest, text) of the list node: the list of node ``prev`` (None: empty) then ``add``."""
    text = _COMPACT.encode({"prev": prev, "add": list(add)})
    return blob_digest(text), text


# Made once: json.dumps() with options builds an encoder per call (encode() is stateless).
_COMPACT = json.JSONEncoder(separators=(",", ":"))


def _node(digest: str, get_blob: GetBlob) -> tuple[str | None, list[str]] | None:
    text = get_blob(digest)
    if text is None:
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("add"), list):
        return None
    prev = data.get("prev")
    return (prev if isinstance(prev, str) else None), [str(d) for d in data["add"]]


def _chain(node: str, get_blob: GetBlob, stop: Set[str] = frozenset()
           ) -> tuple[list[str], list[list[str]]] | None:
    """The node digests from ``node`` back to the first (or to the first one in ``stop``,
    left out), and their ``add`` lists; None if a node is missing or damaged (or the chain
    loops)."""
    nodes: list[str] = []
    adds: list[list[str]] = []
    seen: set[str] = set()
    current: str | None = node
    while current is not None and current not in stop:
        if current in seen:
            return None
        seen.add(current)
        found = _node(current, get_blob)
        if found is None:
            return None
        nodes.append(current)
        current, add = found
        adds.append(add)
    return nodes, adds


def expand_list(node: str, get_blob: GetBlob) -> list[str] | None:
    """The item digests of the list that ends at ``node``, in order; None if a node is
    missing or damaged."""
    chain = _chain(node, get_blob)
    if chain is None:
        return None
    return [digest for add in reversed(chain[1]) for digest in add]


def referenced_blobs(request: Any, get_blob: GetBlob, taken: Set[str] = frozenset()
                     ) -> list[str]:
    """Every blob a stored request refers to: ``$blob``, ``$blobs`` items, and for a
    ``$list`` its nodes and their items (what a copy of the entry must take along). A chain
    is followed back only to a node in ``taken``: blobs already taken along with an earlier
    entry, that node's own list with them, so copying a conversation reads each node once."""
    if not isinstance(request, dict):
        return []
    digests: list[str] = []
    for value in request.values():
        if not isinstance(value, dict):
            continue
        if isinstance(value.get("$blobs"), list):
            digests.extend(str(d) for d in value["$blobs"])
        elif "$blob" in value:
            digests.append(str(value["$blob"]))
        elif isinstance(value.get("$list"), str):
            chain = _chain(value["$list"], get_blob, taken)
            if chain is not None:
                digests.extend(chain[0])
                digests.extend(d for add in chain[1] for d in add)
    return digests
