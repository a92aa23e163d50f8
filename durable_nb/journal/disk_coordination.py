"""What processes tell each other about a run through the disk journal: who executes it
(leases), requests for its executor (decisions and cancels) and the run's keyed records
(notification deliveries, history events), each a write of one SQLite transaction."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable

from ..errors import CorruptEntry, RunLeased
from .base import delivery_text, read_only_error
from .disk_layout import DELIVERY_SEP, delivery_key, prefix_end, request_key


class DiskRunCoordination:
    """Leases, requests and a run's keyed records of
    :class:`~durable_nb.journal.local.DiskJournal`."""

    # -- leases ---------------------------------------------------------------------------

    def acquire_lease(self, run_id: str, holder: dict,
                      holder_alive: Callable[[dict], bool]) -> None:
        key = f"lease:{run_id}"
        with self._cache.transact(retry=True):
            current = self._read_json(key)
            if isinstance(current, dict) and holder_alive(current):
                raise RunLeased(run_id, current)
            self._set_json(key, holder)

    def renew_lease(self, run_id: str, token: str, heartbeat: float) -> bool:
        key = f"lease:{run_id}"
        with self._cache.transact(retry=True):
            holder = self._read_json(key)
            if not isinstance(holder, dict) or holder.get("token") != token:
                return False
            holder["heartbeat"] = heartbeat
            self._set_json(key, holder)
        return True

    def release_lease(self, run_id: str, token: str) -> None:
        key = f"lease:{run_id}"
        with self._cache.transact(retry=True):
            holder = self._read_json(key)
            if isinstance(holder, dict) and holder.get("token") == token:
                self._cache.delete(key, retry=True)

    def lease(self, run_id: str) -> dict | None:
        holder = self._read_json(f"lease:{run_id}")
        return holder if isinstance(holder, dict) else None

    def leases_of(self, run_ids: Iterable[str]) -> dict[str, dict]:
        """Read 256 a query (see :meth:`Journal.leases_of`)."""
        keys = {f"lease:{run_id}": run_id for run_id in run_ids}
        return {keys[key]: holder for key, holder in self._json_values(list(keys))}

    # -- requests -------------------------------------------------------------------------

    def put_request(self, kind: str, run_id: str, value: dict) -> None:
        self._set_json(request_key(kind, run_id), value)

    def add_request(self, kind: str, run_id: str, value: dict) -> dict | None:
        if self.read_only:
            raise read_only_error(self.location, "be written")
        key = request_key(kind, run_id)
        while True:
            # Cache.add is one SQLite transaction: of writers racing, exactly one adds.
            if self._cache.add(key, json.dumps(value, separators=(",", ":")), retry=True):
                return None
            there = self.get_request(kind, run_id)
            if there is not None:
                return None if there == value else there
            # deleted between the add and the read (its run reset): add again

    def swap_request(self, kind: str, run_id: str, old: dict, new: dict) -> bool:
        if self.read_only:
            raise read_only_error(self.location, "be written")
        key = request_key(kind, run_id)
        with self._cache.transact(retry=True):
            there = self._read_json(key)
            if there == new:
                return True
            if there != old:
                return False
            self._set_json(key, new)
        return True

    def get_request(self, kind: str, run_id: str) -> dict | None:
        value = self._read_json(request_key(kind, run_id))
        return value if isinstance(value, dict) else None

    def requests_of(self, wanted: Iterable[tuple[str, str]]) -> dict[tuple[str, str], dict]:
        """Read 256 a query (see :meth:`Journal.requests_of`)."""
        keys = {request_key(kind, run_id): (kind, run_id) for kind, run_id in wanted}
        return {keys[key]: value for key, value in self._json_values(list(keys))}

    def _json_values(self, keys: list[str]) -> list[tuple[str, dict]]:
        """(key, value) of those of ``keys`` held whose value is a JSON object."""
        found = []
        for key, text in self._values(keys):
            try:
                value = json.loads(text)
            except (ValueError, RecursionError) as exc:
                raise CorruptEntry(key, f"not JSON ({exc})") from None
            if isinstance(value, dict):
                found.append((key, value))
        return found

    def delete_request(self, kind: str, run_id: str) -> None:
        self._cache.delete(request_key(kind, run_id), retry=True)

    # -- deliveries -----------------------------------------------------------------------

    def add_delivery(self, run_id: str, key: str, value: dict) -> bool:
        if self.read_only:
            raise read_only_error(self.location, "be written")
        return bool(self._cache.add(delivery_key(run_id, key), delivery_text(value),
                                    retry=True))

    def swap_delivery(self, run_id: str, key: str, expected: dict, value: dict) -> bool:
        if self.read_only:
            raise read_only_error(self.location, "be written")
        with self._cache.transact(retry=True):
            if self._get(delivery_key(run_id, key)) != delivery_text(expected):
                return False
            self._cache.set(delivery_key(run_id, key), delivery_text(value), retry=True)
        return True

    def _run_records(self, run_id: str) -> dict[str, dict]:
        prefix = delivery_key(run_id, "")
        found = {}
        for key, text in self._range(prefix):
            if DELIVERY_SEP in key[len(prefix):]:
                continue  # a run whose id starts with this one's and the separator
            try:
                found[key[len(prefix):]] = json.loads(text)
            except (ValueError, RecursionError) as exc:
                raise CorruptEntry(key, f"not JSON ({exc})", run_id=run_id) from None
        return found

    def _delivery_keys(self, sql: Callable, run_id: str) -> list[str]:
        prefix = delivery_key(run_id, "")
        rows = sql("SELECT key FROM Cache WHERE key >= ? AND key < ? AND raw = 1",
                   (prefix, prefix_end(prefix))).fetchall()
        return [key for key, in rows if DELIVERY_SEP not in key[len(prefix):]]
