"""The ``@idempotent`` results this process recorded, kept so that a record the database
lost is written again instead of the call's outcome becoming unknown.

With asynchronous replication a failover loses the primary's last commits, acknowledged
ones included (docs/production.md, "What asynchronous replication can lose"). A plain
call's claim (``started``) and its record (``completed``) are two commits a few
milliseconds apart: when the claim reached the standby and the record did not, the
promoted server holds this process's own claim with no result. The call ran once and
its result is known, here; the server cannot know it, so without this the resume
raised ``OutcomeUnknownError`` and waited for an operator (tests/test_failover_async.py
met it in about one run in three).

What is kept: for each call whose record the server acknowledged (``LEDGER_COMPLETE_SQL``
returned its row), the claim's owner (unique per call), its fingerprint and the result
exactly as stored (sealed, with an encrypting serializer). Written again only over that
same claim (``WHERE key AND owner AND status = 'started'``): a row an operator forgot,
a key= key whose TTL ran out and was claimed anew, a row retention deleted, all carry
another owner or none, and are never touched; a call whose claim was lost too runs
again, as before (nothing on the server says it ran). Transactional calls are not kept:
their effect is in the database and was lost with their record, so running them again is
right. Bounded: ``MAX_ENTRIES`` calls, ``MAX_BYTES`` of results (oldest dropped first),
results over ``MAX_ONE`` bytes not kept.

Used twice: the claim of a call that finds this process's own claim without its result
completes it from here and replays (``idempotency.protocol``), and a run that found
acknowledged work lost writes its thread's records again in its release, before the
thread is handed back to any worker (``lifecycle``: ``restore_stmts``)."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from langgraph_durable._io import Stmt
from langgraph_durable._sealing import keyring_of
from langgraph_durable.sql.ledger import LEDGER_COMPLETE_SQL

MAX_ENTRIES = 4096
MAX_BYTES = 32 * 1024 * 1024
MAX_ONE = 1024 * 1024


@dataclass(frozen=True)
class Acked:
    thread_id: str | None
    owner: str
    fingerprint: str
    result_type: str
    result: bytes


class AckedResults:
    """Acknowledged records by key (thread-safe; a process-wide instance: ``ACKED``)."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        self._by_key: OrderedDict[str, Acked] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.max_entries, self.max_bytes = max_entries, max_bytes

    def remember(self, key: str, acked: Acked) -> None:
        if len(acked.result) > MAX_ONE:
            return
        with self._lock:
            old = self._by_key.pop(key, None)
            if old is not None:
                self._bytes -= len(old.result)
            self._by_key[key] = acked
            self._bytes += len(acked.result)
            while self._by_key and (len(self._by_key) > self.max_entries or self._bytes > self.max_bytes):
                _, dropped = self._by_key.popitem(last=False)
                self._bytes -= len(dropped.result)

    def get(self, key: str) -> Acked | None:
        with self._lock:
            return self._by_key.get(key)

    def of_thread(self, thread_id: str) -> list[tuple[str, Acked]]:
        with self._lock:
            return [(k, a) for k, a in self._by_key.items() if a.thread_id == thread_id]

    def clear(self) -> None:
        with self._lock:
            self._by_key.clear()
            self._bytes = 0

    def _after_fork_in_child(self) -> None:
        # A child forked while another thread held the lock inherits it held, by a
        # thread that does not exist in the child: its first record would block for
        # ever (review32). The child's calls have owners of their own (its pid), so the
        # parent's records are of no use to it: start empty, with a new lock.
        self._lock = threading.Lock()
        self.clear()


ACKED = AckedResults()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=ACKED._after_fork_in_child)


def current_result(key: str, acked: Acked, serde: Any) -> bytes | None:
    """The kept result as ``serde`` stores it now, or None when it must not be written
    back. A result sealed under a key the keyring still lists but that is no longer the
    current one is re-sealed with the current key (a rekey may have finished since it
    was recorded: the old key may leave the configuration next); one that no configured
    key opens (the old key already gone), or that ``serde`` cannot decode at all, is not
    restored: a completed row nobody can read would leave the operator nothing but
    ``forget``, a second effect, where an unknown outcome can still be resolved
    (review32)."""
    data = acked.result
    if "+" in acked.result_type:  # sealed by an encrypting serializer
        ring = keyring_of(serde)
        if ring is None:
            return None
        try:
            data = ring.recrypt_serde(
                data, thread_id=acked.thread_id, where=f"the kept result of idempotency key {key!r}"
            ) or data
        except Exception:  # DecryptionError: no configured key opens it
            return None
    try:
        serde.loads_typed((acked.result_type, data))
    except Exception:
        return None
    return data


def restore_stmts(thread_id: str, serde: Any) -> list[Stmt]:
    """The thread's acknowledged records, written again (a run's release after it found
    acknowledged work lost), each only over its own claim, still ``started``: nothing
    unless that claim lost its result. Results are as ``current_result`` gives them;
    those it refuses are left out (their claims stay unknown outcomes)."""
    out = []
    for key, a in ACKED.of_thread(thread_id):
        data = current_result(key, a, serde)
        if data is not None:
            out.append(Stmt(LEDGER_COMPLETE_SQL, (a.result_type, data, key, a.owner)))
    return out
