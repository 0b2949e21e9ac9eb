"""The one order rule (issue 13): durable_checkpoint_order, kept for installs and grants
that name it, is durable_put_guard's order check: same result and SQLSTATE as before."""

from __future__ import annotations

import psycopg
import pytest

from langgraph_durable.sql.checkpoints import ORDER_SKEW_STATE


def _put_row(conn: psycopg.Connection, thread_id: str, checkpoint_id: str) -> None:
    conn.execute(
        "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, checkpoint, metadata) "
        "VALUES (%s, '', %s, '{}'::jsonb, '{}'::jsonb)",
        (thread_id, checkpoint_id),
    )


def test_checkpoint_order_refuses_an_id_before_the_head(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        _put_row(conn, "order-1", "b")
        ok = conn.execute("SELECT durable_checkpoint_order('order-1', '', 'c')").fetchone()
        assert ok == (1,)  # after the head
        again = conn.execute("SELECT durable_checkpoint_order('order-1', '', 'b')").fetchone()
        assert again == (1,)  # a re-put of the stored head
        fresh = conn.execute("SELECT durable_checkpoint_order('order-new', '', 'a')").fetchone()
        assert fresh == (1,)  # a thread without checkpoints
        with pytest.raises(psycopg.Error) as info:
            conn.execute("SELECT durable_checkpoint_order('order-1', '', 'a')")
        assert info.value.sqlstate == ORDER_SKEW_STATE
        assert info.value.diag.message_detail == '{"head" : "b"}'
        guard = conn.execute(
            "SELECT durable_put_guard('order-1', NULL, NULL, false, '', 'c')"
        ).fetchone()
        assert guard == (True,)
