"""The savers' own pools reconnect on a capped schedule (langgraph_durable/_pool.py).

psycopg_pool retries a lost connection after 1, 2, 4, 8... s, so after a failover the
workers waited for the next attempt, up to as long again as the outage itself
(tests/test_failover.py measures it end to end). No timing here: the schedule itself.
"""

from __future__ import annotations

from typing import Any

import pytest

from langgraph_durable import DurablePostgresSaver, _pool
from langgraph_durable._pool import (
    RECONNECT_MAX_DELAY,
    AsyncDurableConnectionPool,
    CappedBackoff,
    DurableConnectionPool,
)


def test_reconnect_delays_are_capped() -> None:
    attempt = CappedBackoff(timeout=300.0)
    delays = []
    for _ in range(12):
        attempt.update_delay(0.0)
        delays.append(attempt.delay)
    assert delays[0] <= 0.11
    assert max(delays) <= RECONNECT_MAX_DELAY
    assert delays == sorted(delays)  # still backs off, up to the cap


def test_reconnect_gives_up_after_reconnect_timeout() -> None:
    attempt = CappedBackoff(timeout=2.0)
    attempt.update_delay(0.0)
    assert not attempt.time_to_give_up(1.9)
    assert attempt.time_to_give_up(2.0)


@pytest.fixture
def backoffs(monkeypatch: pytest.MonkeyPatch) -> list[CappedBackoff]:
    """Every CappedBackoff made from now on (the pool makes one per connection it adds
    when the hook is active; psycopg_pool's own schedule otherwise)."""
    made: list[CappedBackoff] = []
    original = CappedBackoff.__init__

    def spy(self: CappedBackoff, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(CappedBackoff, "__init__", spy)
    return made


def test_from_conn_string_uses_the_capped_pool(dsn: str, backoffs: list[CappedBackoff]) -> None:
    """Behaviourally: the saver's pool adds its connections through the hook (a private
    psycopg_pool API that a new release could rename, silently restoring 1-2-4-8 s)."""
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        assert isinstance(saver.conn, DurableConnectionPool)
        saver.conn.wait(timeout=30)  # its connections were added
        assert _pool._HOOKABLE, "psycopg_pool no longer offers the reconnect hook"
        assert backoffs, "the pool added its connections without the capped backoff"
        assert all(b.timeout == saver.conn.reconnect_timeout for b in backoffs)


async def test_async_from_conn_string_uses_the_capped_pool(dsn: str, backoffs: list[CappedBackoff]) -> None:
    from langgraph_durable import AsyncDurablePostgresSaver

    async with AsyncDurablePostgresSaver.from_conn_string(dsn) as saver:
        assert isinstance(saver.conn, AsyncDurableConnectionPool)
        await saver.conn.wait(timeout=30)
        assert backoffs, "the async pool added its connections without the capped backoff"
