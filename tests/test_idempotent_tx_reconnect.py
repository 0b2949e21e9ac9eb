"""A transactional ``@idempotent`` call whose connection dies mid-call is retried whole.

Found by tests/test_failover.py: during a failover, the connection an
``@idempotent(transactional=True)`` call holds breaks, and the call (so the node, so the
run) failed with ``OperationalError`` although the saver's own ops were retried. The call
is one transaction (claim, the function's writes, the record), so a retry on a fresh
connection is always safe: here the function's backend is terminated on its first
attempt (``pg_terminate_backend``, what a failover or an idle kill does), the retry runs
it again, and its write exists exactly once.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from langgraph_durable import AsyncDurablePostgresSaver, DurablePostgresSaver, idempotent


def _table(dsn: str) -> str:
    name = "tx_reconnect_" + uuid.uuid4().hex[:8]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name} (k text NOT NULL)")
    return name


def _kill(dsn: str, pid: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))


def _rows(dsn: str, table: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(f"SELECT k FROM {table}").fetchall()


def test_sync_transactional_call_survives_a_dropped_connection(dsn: str) -> None:
    table = _table(dsn)
    attempts: list[int] = []
    with DurablePostgresSaver.from_conn_string(dsn) as saver:

        @idempotent(transactional=True, ledger=saver, key=lambda k: f"reconnect:{k}")
        def book(conn: Any, k: str) -> str:
            attempts.append(conn.info.backend_pid)
            conn.execute(f"INSERT INTO {table} (k) VALUES (%s)", (k,))
            if len(attempts) == 1:
                _kill(dsn, conn.info.backend_pid)
                conn.execute("SELECT 1")  # the connection is gone
            return k

        key = uuid.uuid4().hex
        assert book(k=key) == key
        assert book(k=key) == key  # replayed from the ledger
    assert len(attempts) == 2 and attempts[0] != attempts[1]
    assert _rows(dsn, table) == [(key,)]


async def test_async_transactional_call_survives_a_dropped_connection(dsn: str) -> None:
    table = _table(dsn)
    attempts: list[int] = []
    async with AsyncDurablePostgresSaver.from_conn_string(dsn) as saver:

        @idempotent(transactional=True, ledger=saver, key=lambda k: f"areconnect:{k}")
        async def book(conn: Any, k: str) -> str:
            attempts.append(conn.info.backend_pid)
            await conn.execute(f"INSERT INTO {table} (k) VALUES (%s)", (k,))
            if len(attempts) == 1:
                _kill(dsn, conn.info.backend_pid)
                await conn.execute("SELECT 1")
            return k

        key = uuid.uuid4().hex
        assert await book(k=key) == key
        assert await book(k=key) == key
    assert len(attempts) == 2 and attempts[0] != attempts[1]
    assert _rows(dsn, table) == [(key,)]


def test_a_statement_error_is_not_retried(dsn: str) -> None:
    """Only a failed connection is retried: a query that fails on a live one is the
    function's own error, raised at once."""
    attempts: list[int] = []
    with DurablePostgresSaver.from_conn_string(dsn) as saver:

        @idempotent(transactional=True, ledger=saver, key=lambda: f"noretry:{uuid.uuid4().hex}")
        def bad(conn: Any) -> None:
            attempts.append(1)
            conn.execute("SELECT 1/0")

        with pytest.raises(psycopg.errors.DivisionByZero):
            bad()
    assert attempts == [1]
