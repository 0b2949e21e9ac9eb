"""The connection pools the savers open themselves (``from_conn_string``).

psycopg_pool replaces a lost connection in the background, retrying a failed connect
after 1, 2, 4, 8, 16... s (``AttemptWithBackoff``). Across a failover that schedule, not
the promotion, decides when work resumes: with the primary SIGKILLed and the standby
promoted 8 s later, the workers' first write landed 14 s after the kill (the attempt
after the one at ~7 s), 6 s of avoidable downtime (tests/test_failover.py). Our pools
retry a failed connect after 0.1 s, growing 1.5x to at most ``RECONNECT_MAX_DELAY``
(1 s), still giving up after the pool's ``reconnect_timeout``. One connect attempt a
second per missing connection is no load on a server that is coming back.

Only the schedule changes: the pool still decides when to reconnect and which
connections to replace, ops still wait for a connection up to the pool's ``timeout``.
The hook is psycopg_pool's private ``_add_connection(attempt, growing)`` (psycopg-pool
3.3, the pinned range); if a release drops it, the pools fall back to the stock
schedule rather than fail.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from typing import Any

from psycopg_pool import AsyncConnectionPool, ConnectionPool

try:
    from psycopg_pool.base import AttemptWithBackoff
except ImportError:  # pragma: no cover - a psycopg_pool outside the pinned range
    AttemptWithBackoff = None  # type: ignore[assignment,misc]

logger = logging.getLogger("langgraph_durable")

RECONNECT_INITIAL_DELAY = 0.1
RECONNECT_BACKOFF = 1.5
RECONNECT_MAX_DELAY = 1.0


def _hookable(cls: type) -> bool:
    fn = getattr(cls, "_add_connection", None)
    if AttemptWithBackoff is None or fn is None:
        return False
    return list(inspect.signature(fn).parameters)[:3] == ["self", "attempt", "growing"]


_HOOKABLE = _hookable(ConnectionPool) and _hookable(AsyncConnectionPool)
if not _HOOKABLE:  # pragma: no cover - a psycopg_pool outside the pinned range
    logger.debug("psycopg_pool has no _add_connection(attempt, growing): stock reconnect backoff")


if AttemptWithBackoff is not None:

    class CappedBackoff(AttemptWithBackoff):
        """Exponential backoff from 0.1 s, capped at ``RECONNECT_MAX_DELAY``."""

        INITIAL_DELAY = RECONNECT_INITIAL_DELAY
        DELAY_BACKOFF = RECONNECT_BACKOFF

        def update_delay(self, now: float) -> None:
            super().update_delay(now)
            self.delay = min(self.delay, RECONNECT_MAX_DELAY)


class DurableConnectionPool(ConnectionPool[Any]):
    """A ``ConnectionPool`` that reconnects within a second of the server coming back."""

    def _add_connection(self, attempt: Any, growing: bool = False) -> None:
        if attempt is None and _HOOKABLE:
            attempt = CappedBackoff(timeout=self.reconnect_timeout)
        super()._add_connection(attempt, growing=growing)


class AsyncDurableConnectionPool(AsyncConnectionPool[Any]):
    """The async twin of ``DurableConnectionPool``."""

    async def _add_connection(self, attempt: Any, growing: bool = False) -> None:
        if attempt is None and _HOOKABLE:
            attempt = CappedBackoff(timeout=self.reconnect_timeout)
        await super()._add_connection(attempt, growing=growing)


# --- failover branch ---
# Issue 23, defect 7: across a failover the pools, the drivers and the lease renewer each
# logged every failed attempt ("error connecting ...: session is read-only", "discarding
# broken connection", "connection lost ...; retrying", "lease renewal failed"): hundreds
# of WARNING lines and none saying what happened. Now, once this process has written:
# * one line when a new connection (or a lease renewal) fails: the server is lost
#   (read-only: a standby, i.e. a failover; or unreachable), and one when a write
#   succeeds again, with the time in between;
# * each of those repeated messages at most once per OUTAGE_LOG_INTERVAL, the next one
#   saying how many like it were not logged.
# A logging filter on the loggers that emit them, nothing else: every other record, and
# every record before this process's first write (a configuration problem), passes.

OUTAGE_LOG_INTERVAL = 10.0
# A failed connection within this long after the server was writable again is the same
# incident (an attempt begun before the promotion, reported after it), not a new one.
OUTAGE_GRACE = 2.0
# (logger name, message template) of the repeated connection-error records.
_CONNECT_FAILED = ("psycopg.pool", "error connecting in %r: %s")
_RENEW_FAILED = ("langgraph_durable", "lease renewal failed: %s")
_REPEATED = frozenset({
    _CONNECT_FAILED,
    _RENEW_FAILED,
    ("psycopg.pool", "discarding broken connection: %s"),
    ("psycopg.pool", "discarding closed connection: %s"),
    ("psycopg", "error ignored terminating %r: %s"),
    ("langgraph_durable", "connection lost (%s); retrying on a fresh connection"),
})


class _Outage(logging.Filter):
    """This process's view of its database server: writable, or lost since when."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.ever_wrote = False
        self.since: float | None = None
        self.ended = -OUTAGE_GRACE
        self.suppressed = 0  # in this outage
        self.last: dict[tuple[str, Any], float] = {}
        self.pending: dict[tuple[str, Any], int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.msg)
        if key not in _REPEATED:
            return True
        now = time.monotonic()
        with self.lock:
            if not self.ever_wrote:
                return True
            start = (
                self.since is None
                and key in (_CONNECT_FAILED, _RENEW_FAILED)
                and now - self.ended >= OUTAGE_GRACE
            )
            if start:
                self.since, self.suppressed = now, 0
            show = now - self.last.get(key, -OUTAGE_LOG_INTERVAL) >= OUTAGE_LOG_INTERVAL
            if show:
                self.last[key] = now
                more = self.pending.pop(key, 0)
            else:
                self.pending[key] = self.pending.get(key, 0) + 1
                self.suppressed += 1
        if start:
            self._lost(record)
        if show and more:
            record.msg = f"{record.msg} [{more} more like this not logged]"
        return show

    @staticmethod
    def _lost(record: logging.LogRecord) -> None:
        text = " ".join(str(a) for a in (record.args if isinstance(record.args, tuple) else ()))
        what = (
            "the server is read-only (a standby: failover in progress?)"
            if "read-only" in text or "read only" in text
            else "the server is unreachable (connection refused or closed: lost, or failing over?)"
        )
        logger.warning(
            "DATABASE SERVER LOST: %s; waiting for a writable server (repeated connection "
            "errors are logged once per %.0f s meanwhile)",
            what, OUTAGE_LOG_INTERVAL,
        )

    def writable(self) -> None:
        """A write succeeded (a checkpoint put, a lease renewal): called on every one."""
        if self.since is None and self.ever_wrote:
            return  # the usual case: two attribute reads
        with self.lock:
            self.ever_wrote = True
            since, self.since = self.since, None
            suppressed = self.suppressed
            if since is not None:
                self.ended = time.monotonic()
        if since is not None:
            logger.warning(
                "DATABASE WRITABLE AGAIN after %.1f s without a writable server "
                "(%d repeated connection-error lines not logged)",
                time.monotonic() - since, suppressed,
            )


OUTAGE = _Outage()
for _name in sorted({name for name, _ in _REPEATED}):
    logging.getLogger(_name).addFilter(OUTAGE)
