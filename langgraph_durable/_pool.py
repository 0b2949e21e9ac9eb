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
