"""Claim renewal: keeps this process's in-flight plain calls' claims alive."""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from typing import Any

import psycopg

from langgraph_durable.core.base import _DurableBase
from langgraph_durable.idempotency.call import _Call
from langgraph_durable.leases.renewer import side_connection
from langgraph_durable.sql.ledger import (
    LEDGER_RENEW_SQL,
)

logger = logging.getLogger("langgraph_durable.idempotency")


class _ClaimRenewer:
    """Keeps this process's in-flight claims alive: every claim_ttl/3, one UPDATE per
    ledger on a dedicated connection (so a busy pool or a blocked event loop cannot
    starve it, like the saver's lease renewer). A claim that stops being renewed --
    the process died -- expires, and the next caller sees an unknown outcome."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: dict[int, _Call] = {}
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None
        self.interval = 1.0
        self.conns: dict[int, tuple[weakref.ref[Any], psycopg.Connection[Any]]] = {}

    def add(self, call: _Call) -> None:
        with self.lock:
            self.calls[id(call)] = call
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(
                    target=self._loop, name="langgraph-durable-claim-renewer", daemon=True
                )
                self.thread.start()
            # Wake the loop only when this claim needs renewing sooner than planned.
            sooner = (call.claim_ttl or 30.0) / 3 < self.interval
        if sooner:
            self.wake.set()

    def remove(self, call: _Call) -> None:
        with self.lock:
            self.calls.pop(id(call), None)

    def _loop(self) -> None:
        idle = 0.0
        while True:
            with self.lock:
                calls = list(self.calls.values())
                interval = min((c.claim_ttl or 30.0) for c in calls) / 3 if calls else 1.0
                self.interval = interval
                self.wake.clear()
            self.wake.wait(interval)
            with self.lock:
                calls = list(self.calls.values())
                if not calls:
                    idle += interval
                    if idle > 30:
                        self.thread = None
                        self._close_all()
                        return
                    continue
            idle = 0.0
            by_ledger: dict[int, list[_Call]] = {}
            for c in calls:
                by_ledger.setdefault(id(c.ledger), []).append(c)
            for group in by_ledger.values():
                try:
                    self._renew(group)
                except Exception as exc:
                    logger.warning("claim renewal failed: %s", exc)
                    self._close(id(group[0].ledger))

    def _connection(self, ledger: _DurableBase) -> psycopg.Connection[Any]:
        entry = self.conns.get(id(ledger))
        if entry is not None and entry[0]() is ledger and not entry[1].closed:
            return entry[1]
        conn = side_connection(ledger)
        self.conns[id(ledger)] = (weakref.ref(ledger), conn)
        return conn

    def _renew(self, group: list[_Call]) -> None:
        conn = self._connection(group[0].ledger)
        rows = conn.execute(
            LEDGER_RENEW_SQL,
            ([c.key for c in group], [c.owner for c in group], [c.claim_ttl or 30.0 for c in group]),
        ).fetchall()
        renewed = {r[0] if isinstance(r, tuple) else r["key"] for r in rows}
        for c in group:
            if c.key not in renewed and not c.lost:
                with self.lock:
                    still = id(c) in self.calls
                if still:
                    c.lost = True
                    logger.error("claim on idempotency key %r was lost (taken over)", c.key)

    def _close(self, ledger_id: int) -> None:
        entry = self.conns.pop(ledger_id, None)
        if entry is not None:
            with contextlib.suppress(Exception):
                entry[1].close()

    def _close_all(self) -> None:
        for ledger_id in list(self.conns):
            self._close(ledger_id)


_RENEWER = _ClaimRenewer()
