"""Small SQL helpers shared by the lease and recovery tests (read the tables directly)."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row


def q(dsn: str, sql: str, params: Any = None) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


def thread_row(dsn: str, thread_id: str) -> dict[str, Any]:
    """The thread's durable_threads row, with the lease's seconds left as expires_in."""
    rows = q(
        dsn,
        "SELECT *, EXTRACT(EPOCH FROM (lease_expires_at - clock_timestamp()))::float8 AS expires_in "
        "FROM durable_threads WHERE thread_id = %s",
        (thread_id,),
    )
    assert rows, thread_id
    return rows[0]


def done_nodes(values: dict[str, Any]) -> list[str]:
    return [d.split(":")[0] for d in values["done"]]
