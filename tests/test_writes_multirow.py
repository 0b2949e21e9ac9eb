"""A put_writes of several writes is one statement with the guard once (issue 26,
sql.checkpoints.GUARDED_UPSERT_WRITES_SQL): it must leave exactly the rows the stock
saver's one-statement-per-write leaves (a special channel twice in one call: the stock
upsert keeps the last, its insert the first), and the guard must still refuse the whole
call (lease lost, thread busy) with nothing stored."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.checkpoint.base import WRITES_IDX_MAP, empty_checkpoint
from langgraph.checkpoint.postgres import PostgresSaver

from langgraph_durable import DurablePostgresSaver
from langgraph_durable.errors import LeaseLostError, ThreadBusyError
from langgraph_durable.leases.model import _RUN_LEASE, Lease
from langgraph_durable.sql.checkpoints import GUARDED_WRITES_MAX

# LangGraph's special channels (__error__, __interrupt__, ...): fixed idx, upserted.
SPECIAL = sorted(WRITES_IDX_MAP)
ERROR = "__error__"
_CHANNELS = st.sampled_from(["a", "b", "messages", *SPECIAL])
_VALUES = st.one_of(st.integers(-5, 5), st.text(max_size=5), st.lists(st.integers(0, 3), max_size=3))
_WRITES = st.lists(st.tuples(_CHANNELS, _VALUES), min_size=1, max_size=GUARDED_WRITES_MAX + 2)
# A call of only special writes takes the stock upsert, any other the stock insert.
_SPECIAL = st.lists(st.tuples(st.sampled_from(SPECIAL), _VALUES), min_size=2, max_size=6)


def _rows(conn: psycopg.Connection[Any], thread: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT task_id, task_path, idx, channel, type, blob FROM checkpoint_writes"
        " WHERE thread_id = %s ORDER BY task_id, idx",
        (thread,),
    ).fetchall()


def _seed(saver: Any, thread: str) -> dict[str, Any]:
    cp = empty_checkpoint()
    return saver.put({"configurable": {"thread_id": thread, "checkpoint_ns": ""}}, cp, {"source": "input"}, {})


@pytest.fixture(scope="module")
def savers(dsn: str) -> Any:
    with psycopg.connect(dsn, autocommit=True) as stock_conn, psycopg.connect(dsn, autocommit=True) as conn:
        PostgresSaver(stock_conn).setup()
        yield PostgresSaver(stock_conn), DurablePostgresSaver(conn), conn, DurablePostgresSaver(conn, leases=False)


def _same_as_stock(savers: Any, calls: list[list[tuple[str, Any]]], lease: bool, off: bool = False) -> None:
    stock, durable, conn, unleased = savers
    if off:
        durable = unleased
    tag = uuid.uuid4().hex[:10]
    s_thread, d_thread = f"ms-{tag}", f"md-{tag}"
    s_cfg, d_cfg = _seed(stock, s_thread), _seed(durable, d_thread)
    token = None
    if lease:
        got = durable.run_op(lambda: durable._op_acquire(d_thread, f"owner-{tag}", "v1", None))
        token = _RUN_LEASE.set(Lease(d_thread, owner=f"owner-{tag}", token=int(got["lease_token"]),
                                     attempts=1, checkpoint_id=None, version="v1"))
    try:
        for i, writes in enumerate(calls):
            stock.put_writes(s_cfg, writes, f"task-{i}", "path")
            durable.put_writes(d_cfg, writes, f"task-{i}", "path")
    finally:
        if token is not None:
            _RUN_LEASE.reset(token)
    assert _rows(conn, d_thread) == _rows(conn, s_thread)
    # What a load hands LangGraph: the same pending writes.
    d_tuple, s_tuple = durable.get_tuple(d_cfg), stock.get_tuple(s_cfg)
    assert d_tuple is not None and s_tuple is not None
    assert sorted(map(repr, d_tuple.pending_writes)) == sorted(map(repr, s_tuple.pending_writes))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(calls=st.lists(_WRITES, min_size=1, max_size=3), mode=st.sampled_from(["lease", "foreign", "off"]))
def test_put_writes_leaves_what_stock_leaves(savers: Any, calls: list[list[tuple[str, Any]]], mode: str) -> None:
    """Under a lease, outside a run (the foreign-lease guard) and with leases=False, any
    writes: the rows and the pending writes a load returns are the stock saver's."""
    _same_as_stock(savers, calls, lease=mode == "lease", off=mode == "off")


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(writes=_SPECIAL)
def test_special_writes_repeated_in_one_call_keep_stocks_last(savers: Any, writes: list[tuple[str, Any]]) -> None:
    """Only special writes: the stock upsert, one statement per write, keeps the last
    value of a repeated channel; one statement cannot upsert a row twice, so the saver
    sends the last of each (the call itself, twice: re-sent values overwrite)."""
    _same_as_stock(savers, [writes, writes], lease=False)


def test_lost_lease_refuses_the_whole_call(savers: Any) -> None:
    _, durable, conn, _ = savers
    tid = f"lost-{uuid.uuid4().hex[:10]}"
    cfg = _seed(durable, tid)
    got = durable.run_op(lambda: durable._op_acquire(tid, "owner-a", "v1", None))
    lease = Lease(tid, owner="owner-a", token=int(got["lease_token"]), attempts=1, checkpoint_id=None, version="v1")
    # Taken over (the lease expired): the token moves on, owner-a is fenced out.
    conn.execute("UPDATE durable_threads SET lease_token = lease_token + 1, lease_owner = 'owner-b'"
                 " WHERE thread_id = %s", (tid,))
    token = _RUN_LEASE.set(lease)
    try:
        with pytest.raises(LeaseLostError):
            durable.put_writes(cfg, [("a", 1), ("b", 2), ("c", 3)], "task", "")
    finally:
        _RUN_LEASE.reset(token)
    assert _rows(conn, tid) == []


def test_busy_thread_refuses_the_whole_call(savers: Any) -> None:
    _, durable, conn, _ = savers
    tid = f"busy-{uuid.uuid4().hex[:10]}"
    cfg = _seed(durable, tid)
    durable.run_op(lambda: durable._op_acquire(tid, "owner-live", "v1", None))
    with pytest.raises(ThreadBusyError):
        durable.put_writes(cfg, [("a", 1), ("b", 2)], "task", "")
    with pytest.raises(ThreadBusyError):
        durable.put_writes(cfg, [(ERROR, "x"), (ERROR, "y")], "task", "")
    assert _rows(conn, tid) == []
