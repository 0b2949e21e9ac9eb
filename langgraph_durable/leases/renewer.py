"""The one lease renewer thread of a saver (and its clones)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, Protocol

from psycopg import Connection

from langgraph_durable import telemetry as _telemetry
from langgraph_durable._pool import OUTAGE
from langgraph_durable.leases.model import Lease, _LeaseRegistry
from langgraph_durable.pooler import session_schema
from langgraph_durable.sql.schema import set_search_path
from langgraph_durable.sql.threads import LEASE_RENEW_SQL

logger = logging.getLogger("langgraph_durable")


class RenewerHost(Protocol):
    """What the renewer needs of its saver (a typed view, not the saver class)."""

    lease_ttl: float
    _leases: _LeaseRegistry
    schema: str | None
    pooler: Any

    @property
    def _renewer_lock(self) -> threading.Lock: ...

    def _renew_connect(self) -> Connection[Any]: ...


def side_connection(saver: Any) -> Connection[Any]:
    """A renewer's own autocommit connection (never the pool's: a busy pool or a blocked
    event loop must not starve renewal), with the saver's search_path."""
    conn: Connection[Any] = saver._renew_connect()
    conn.autocommit = True
    if schema := session_schema(saver):
        conn.execute(set_search_path(schema))
    return conn


class _Renewer(threading.Thread):
    """Renews this process's leases every ttl/3 on a dedicated connection, so a busy
    pool or a blocked event loop cannot starve renewal. A lease the database no longer
    confirms is marked lost: the run's next write fails fast with LeaseLostError."""

    def __init__(self, saver: RenewerHost) -> None:
        super().__init__(name="langgraph-durable-lease-renewer", daemon=True)
        self.saver = saver
        self.registry = saver._leases
        self._stop_event = threading.Event()
        self._conn: Connection[Any] | None = None
        # One statement at a time on the renewer's connection: renew_now() is also called
        # from run threads (see _DurableBase._confirm_lease).
        self._conn_lock = threading.Lock()
        self.exiting = False

    def stop(self) -> None:
        self._stop_event.set()

    def is_alive(self) -> bool:
        # A renewer that decided to exit no longer counts: _ensure_renewer starts another.
        return not self.exiting and super().is_alive()

    def renew_now(self, leases: list[Lease]) -> None:
        with self._conn_lock:
            try:
                self._renew(leases)
            except Exception:
                self._close()
                raise

    def run(self) -> None:
        interval = self.saver.lease_ttl / 3
        idle = 0.0
        while not self._stop_event.wait(interval):
            leases = self.registry.snapshot()
            if not leases:
                idle += interval
                if idle > 60:
                    # Decide under the lock _ensure_renewer holds: a lease added after
                    # this check finds exiting=True and gets a new renewer.
                    with self.saver._renewer_lock:
                        if not self.registry.snapshot():
                            self.exiting = True
                            break
                continue
            idle = 0.0
            try:
                self.renew_now(leases)
            except Exception as exc:
                logger.warning("lease renewal failed: %s", exc)
        with self._conn_lock:
            self._close()

    @_telemetry.instrument("lease_renew")
    def _renew(self, leases: list[Lease]) -> None:
        started = time.monotonic()
        if self._conn is None or self._conn.closed:
            self._conn = side_connection(self.saver)
        rows = self._conn.execute(
            LEASE_RENEW_SQL,
            (
                self.saver.lease_ttl,
                [lease.thread_id for lease in leases],
                [lease.token for lease in leases],
                [lease.owner for lease in leases],
            ),
        ).fetchall()
        OUTAGE.writable()  # the renewal is an UPDATE: the server takes writes
        renewed = {r[0] for r in rows}
        cancelled = {r[0] for r in rows if r[1]}
        for lease in leases:
            if lease.thread_id in renewed:
                lease.renewed_at = max(lease.renewed_at, started)
                if lease.thread_id in cancelled:
                    lease.cancel = True  # an operator's cancel (issue 25)
            elif not lease.released:
                lease.lost = True
                logger.error(
                    "lease on thread %s (token %d) was lost (taken over after expiry)",
                    lease.thread_id, lease.token,
                )

    def _close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
