"""The savers' own pools reconnect on a capped schedule (langgraph_durable/_pool.py).

psycopg_pool retries a lost connection after 1, 2, 4, 8... s, so after a failover the
workers waited for the next attempt, up to as long again as the outage itself
(tests/test_failover.py measures it end to end). No timing here: the schedule itself.
"""

from __future__ import annotations

from langgraph_durable import DurablePostgresSaver
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


def test_from_conn_string_uses_the_capped_pool(dsn: str) -> None:
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        assert isinstance(saver.conn, DurableConnectionPool)


async def test_async_from_conn_string_uses_the_capped_pool(dsn: str) -> None:
    from langgraph_durable import AsyncDurablePostgresSaver

    async with AsyncDurablePostgresSaver.from_conn_string(dsn) as saver:
        assert isinstance(saver.conn, AsyncDurableConnectionPool)
