"""What a run costs on the wire (issue 14, problems 1 and 2), counted, not timed.

libpq's protocol trace of the saver's one connection counts round trips (ReadyForQuery
messages: one per pipeline sync or simple query) and statements (Execute + Query) of a
10-step invoke, for the stock saver and the package on the same database. Deterministic:
a regression (a fence statement back, BEGIN/COMMIT around the acquisition) shows here.
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypedDict

import psycopg
import pytest
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph
from psycopg.rows import dict_row

from langgraph_durable import DurablePostgresSaver

STEPS = 10


class S(TypedDict):
    n: int


def _graph(saver: Any) -> Any:
    b = StateGraph(S)
    for i in range(STEPS):
        b.add_node(f"s{i}", lambda s: {"n": s["n"] + 1})
        b.add_edge(START if i == 0 else f"s{i - 1}", f"s{i}")
    b.add_edge(f"s{STEPS - 1}", END)
    return b.compile(checkpointer=saver)


@contextmanager
def _wire(conn: psycopg.Connection[Any]) -> Iterator[dict[str, int]]:
    out = {"round_trips": 0, "statements": 0}
    with tempfile.TemporaryFile("w+") as f:
        conn.pgconn.trace(f.fileno())
        conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE)
        try:
            yield out
        finally:
            conn.pgconn.untrace()
            f.seek(0)
            for line in f:
                parts = line.split("\t")
                words = parts[2].split() if len(parts) > 2 else []
                if parts[0] == "B" and words[:1] == ["ReadyForQuery"]:
                    out["round_trips"] += 1
                elif parts[0] == "F" and words[:1] in (["Execute"], ["Query"]):
                    out["statements"] += 1


def _connect(dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row)


def _invoke_wire(dsn: str, make: Any) -> dict[str, int]:
    with _connect(dsn) as conn:
        saver = make(conn)
        graph = _graph(saver)
        # Warm up: the topology record (once per graph version per process) and psycopg's
        # type caches are not per-invoke costs.
        graph.invoke({"n": 0}, {"configurable": {"thread_id": f"warm-{uuid.uuid4().hex}"}})
        # put_writes calls of several writes (the state write and the edge's): the stock
        # saver sends a statement per write.
        multi = [0]
        put_writes = saver.put_writes

        def counting(config: Any, writes: Any, *a: Any, **k: Any) -> Any:
            multi[0] += len(writes) > 1
            return put_writes(config, writes, *a, **k)

        saver.put_writes = counting
        with _wire(conn) as counted:
            out = graph.invoke({"n": 0}, {"configurable": {"thread_id": f"t-{uuid.uuid4().hex}"}})
        assert out == {"n": STEPS}
    counted["multi_write_calls"] = multi[0]
    return counted


@pytest.fixture(scope="module")
def stock(dsn: str) -> dict[str, int]:
    with _connect(dsn) as conn:
        PostgresSaver(conn).setup()
    return _invoke_wire(dsn, PostgresSaver)


def test_leased_invoke_costs_stock_plus_acquire_and_release(dsn: str, stock: dict[str, int]) -> None:
    durable = _invoke_wire(dsn, DurablePostgresSaver)
    # Run start: stock's one round trip. The lease acquisition (one statement that also
    # finds the latest checkpoint) and the run's first load go in one pipeline, before
    # one Sync: one statement more than stock, no round trip more. Run end: the
    # release, one statement, one round trip. Every put and put_writes: the stock
    # saver's statements (the fence and the order check ride in the write's own
    # statement). Before issue 14: 33 round trips vs 24; with the acquisition a round
    # trip of its own: 26. A put_writes of several writes (issue 26): one statement with
    # the guard once, where stock sends one per write (here 2 writes: one fewer each).
    assert durable["round_trips"] == stock["round_trips"] + 1, (durable, stock)
    assert durable["multi_write_calls"] == stock["multi_write_calls"] > 0, (durable, stock)
    assert durable["statements"] == stock["statements"] + 2 - durable["multi_write_calls"], (durable, stock)


def test_leases_off_invoke_costs_exactly_stock(dsn: str, stock: dict[str, int]) -> None:
    off = _invoke_wire(dsn, lambda c: DurablePostgresSaver(c, leases=False))
    # No fence, no foreign-lease probe, no separate version-inheritance or order
    # statement (the order check is folded into the checkpoint upsert). Before: 80
    # statements vs stock's 46. A put_writes of several writes: one statement (issue 26).
    assert off["round_trips"] == stock["round_trips"], (off, stock)
    assert off["multi_write_calls"] == stock["multi_write_calls"] > 0, (off, stock)
    assert off["statements"] == stock["statements"] - off["multi_write_calls"], (off, stock)


def test_update_state_costs_exactly_stock(dsn: str) -> None:
    """A write outside a run (foreign-lease check, version inheritance) costs stock's wire."""
    with _connect(dsn) as conn:
        saver = DurablePostgresSaver(conn)
        graph = _graph(saver)
        tid = f"p-{uuid.uuid4().hex}"
        graph.invoke({"n": 0}, {"configurable": {"thread_id": tid}})
        with _connect(dsn) as other:
            stock_graph = _graph(PostgresSaver(other))
            stid = f"ps-{uuid.uuid4().hex}"
            stock_graph.invoke({"n": 0}, {"configurable": {"thread_id": stid}})
            # Once first: statements are prepared the first time they run (a round trip).
            stock_graph.update_state({"configurable": {"thread_id": stid}}, {"n": 1})
            with _wire(other) as stock_put:
                stock_graph.update_state({"configurable": {"thread_id": stid}}, {"n": 2})
        graph.update_state({"configurable": {"thread_id": tid}}, {"n": 1})
        with _wire(conn) as ours:
            graph.update_state({"configurable": {"thread_id": tid}}, {"n": 2})
    # update_state outside a run: the foreign-lease check and the version inheritance
    # ride in the put's statements too.
    assert ours == stock_put, (ours, stock_put)


def test_run_start_load_reads_the_head_after_the_lease_lock(dsn: str) -> None:
    """The run start's load rides in the acquisition's pipeline; it must still read the
    thread as of the lease: after the acquisition's row lock, so a write of the old
    lease holder in flight (its guard holds the thread row FOR SHARE) is either seen or
    refused, never lost. Here the old holder's lease has expired; its write commits
    while the acquisition waits on the lock: the run must start from that write."""
    import threading

    from langgraph.checkpoint.base.id import uuid6

    with _connect(dsn) as conn:
        graph = _graph(DurablePostgresSaver(conn))
        tid = f"lock-{uuid.uuid4().hex}"
        cfg = {"configurable": {"thread_id": tid}}
        assert graph.invoke({"n": 0}, cfg) == {"n": STEPS}
        conn.execute(
            "UPDATE durable_threads SET status = 'running', lease_owner = 'other-host:1:x',"
            " lease_token = lease_token + 1, lease_expires_at = now() - interval '1 second'"
            " WHERE thread_id = %s",
            (tid,),
        )
        with psycopg.connect(dsn) as writer:  # not autocommit: one open transaction
            writer.execute("SELECT 1 FROM durable_threads WHERE thread_id = %s FOR SHARE", (tid,))
            # The old holder's checkpoint: the head's, a later id, with n = 99 (inline).
            new_id = str(uuid6(clock_seq=-2))
            writer.execute(
                "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id,"
                " parent_checkpoint_id, type, checkpoint, metadata)"
                " SELECT thread_id, checkpoint_ns, %s, checkpoint_id, type,"
                " jsonb_set(checkpoint || jsonb_build_object('id', %s::text),"
                " '{channel_values,n}', '99'), metadata"
                " FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = ''"
                " ORDER BY checkpoint_id DESC LIMIT 1",
                (new_id, new_id, tid),
            )
            got: dict[str, Any] = {}
            runner = threading.Thread(target=lambda: got.update(out=graph.invoke(None, cfg)))
            runner.start()
            runner.join(1.0)
            assert runner.is_alive(), "the acquisition did not wait for the row lock"
            writer.commit()
            runner.join(30)
        assert got["out"] == {"n": 99}, got
