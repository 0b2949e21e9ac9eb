"""The real drivers on a real PostgreSQL: an op's pure work before its first statement
(a put's encoding and compression) runs before a pool connection is checked out."""

from __future__ import annotations

from typing import Any

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_durable._io import AsyncDriver, Batch, Stmt, SyncDriver


def _op(pool: Any, seen: list[int]) -> Any:
    seen.append(pool.get_stats()["pool_available"])  # before the first yield
    rows = yield Batch([Stmt("SELECT 1 AS n", fetch=True, name="one")])
    seen.append(pool.get_stats()["pool_available"])  # holding the connection now
    return rows["one"][0]["n"]


def test_sync_driver_starts_the_op_before_checking_out(dsn: str) -> None:
    with ConnectionPool(dsn, min_size=1, max_size=1, kwargs={"autocommit": True, "row_factory": dict_row}) as pool:
        pool.wait()
        seen: list[int] = []
        assert SyncDriver(pool, None).run_op(lambda: _op(pool, seen)) == 1
        assert seen == [1, 0]


async def test_async_driver_starts_the_op_before_checking_out(dsn: str) -> None:
    async with AsyncConnectionPool(
        dsn, min_size=1, max_size=1, kwargs={"autocommit": True, "row_factory": dict_row}
    ) as pool:
        await pool.wait()
        seen: list[int] = []
        assert await AsyncDriver(pool, None).run_op(lambda: _op(pool, seen)) == 1
        assert seen == [1, 0]
