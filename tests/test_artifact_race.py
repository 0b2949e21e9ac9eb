"""A step's concurrent writes of one large value compress and send it once (issue 14,
problem 3).

LangGraph runs a step's ``put_writes`` and ``put`` concurrently and both carry the same
value. The second write must wait for the first (not seal and send the artifact again)
and, when the first rolls back, still store the artifact itself. The first write is
held in flight on the real server by an operator-style exclusive lock on the thread's
artifact lock (every write takes it shared first); its cancellation is a real
``pg_cancel_backend``.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.base import empty_checkpoint

from langgraph_durable import DurableError, DurablePostgresSaver
from langgraph_durable.sql import artifacts as _sql

BIG = 300_000  # well past the threshold: one artifact


def _value(seed: str) -> bytes:
    return random.Random(seed).randbytes(BIG)


@pytest.fixture
def store(dsn: str) -> Iterator[DurablePostgresSaver]:
    with DurablePostgresSaver.from_conn_string(dsn, artifact_threshold=256) as s:
        s.setup()
        yield s


def _count(dsn: str, sql: str, *args: Any) -> int:
    with psycopg.connect(dsn) as conn:
        return int(conn.execute(sql, args).fetchone()[0])  # type: ignore[index]


def _checkpoint(saver: DurablePostgresSaver, thread: str) -> Any:
    cp = empty_checkpoint()
    cp["channel_values"] = {"n": 1}
    cp["channel_versions"] = {"n": saver.get_next_version(None, None)}
    return saver.put(
        {"configurable": {"thread_id": thread, "checkpoint_ns": ""}},
        cp,
        {"source": "update", "step": 0, "parents": {}},
        cp["channel_versions"],
    )


class _Seals:
    """Counts the artifacts the codec compresses (the real codec does the work)."""

    def __init__(self, saver: DurablePostgresSaver) -> None:
        self.n = 0
        self._seal = saver.codec.seal
        self._lock = threading.Lock()

        def seal(content: bytes, serde: Any) -> bytes:
            with self._lock:
                self.n += 1
            return self._seal(content, serde)

        saver.codec.seal = seal  # type: ignore[method-assign]


def _waiting_on_advisory(conn: psycopg.Connection[Any]) -> list[int]:
    rows = conn.execute(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database = "
        "(SELECT oid FROM pg_database WHERE datname = current_database())"
    ).fetchall()
    return [r[0] for r in rows]


def _until(predicate: Any, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def _race(store: DurablePostgresSaver, dsn: str, thread: str, cancel_first: bool) -> tuple[_Seals, list[BaseException]]:
    """Write ``value`` from two threads while the first write is held in flight."""
    cfg = _checkpoint(store, thread)
    value = _value(thread)
    seals = _Seals(store)
    errors: list[BaseException] = []

    def write(task: str) -> None:
        try:
            store.put_writes(cfg, [("big", value)], task)
        except BaseException as exc:  # collected for the assertions
            errors.append(exc)

    with psycopg.connect(dsn, autocommit=True) as holder:
        holder.execute("BEGIN")
        holder.execute(_sql.ARTIFACT_LOCK_SQL, (_sql.ARTIFACT_LOCK_CLASS, thread))
        first = threading.Thread(target=write, args=("task-1",))
        first.start()
        assert _until(lambda: len(_waiting_on_advisory(holder)) == 1), "first write never reached the server"
        (first_pid,) = _waiting_on_advisory(holder)
        second = threading.Thread(target=write, args=("task-2",))
        second.start()
        # Give the second write time to run into the first. The old code then sealed the
        # artifact again and queued its own INSERT behind the lock (a second waiter).
        _until(lambda: len(_waiting_on_advisory(holder)) >= 2, seconds=2.0)
        if cancel_first:
            holder.execute("SELECT pg_cancel_backend(%s)", (first_pid,))
            first.join(30)
        holder.execute("COMMIT")
    first.join(30)
    second.join(30)
    assert not first.is_alive() and not second.is_alive()
    return seals, errors


def test_concurrent_writes_of_one_value_seal_and_send_it_once(store: DurablePostgresSaver, dsn: str) -> None:
    thread = f"race-{uuid.uuid4().hex[:6]}"
    seals, errors = _race(store, dsn, thread, cancel_first=False)
    assert errors == []
    assert seals.n == 1
    assert _count(dsn, "SELECT count(*) FROM checkpoint_writes WHERE thread_id = %s", thread) == 2
    assert _count(dsn, "SELECT count(*) FROM durable_artifact_refs WHERE thread_id = %s", thread) == 1
    # One INSERT reached the table: no dead copy left behind by a losing insert.

    assert _count(dsn, "SELECT count(*) FROM durable_artifacts d JOIN durable_artifact_refs r USING (digest) "
                       "WHERE r.thread_id = %s", thread) == 1

    got = store.get_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": ""}})
    assert got is not None and [w[2] for w in got.pending_writes] == [_value(thread)] * 2


def test_second_write_stores_the_artifact_when_the_first_rolls_back(store: DurablePostgresSaver, dsn: str) -> None:
    thread = f"rollback-{uuid.uuid4().hex[:6]}"
    seals, errors = _race(store, dsn, thread, cancel_first=True)
    # The first write was cancelled (a typed error or the driver's own); the second one,
    # which waited for it, sealed and stored the artifact itself.
    assert len(errors) == 1 and isinstance(errors[0], DurableError | psycopg.Error)
    assert seals.n == 2
    assert _count(dsn, "SELECT count(*) FROM checkpoint_writes WHERE thread_id = %s", thread) == 1
    assert _count(dsn, "SELECT count(*) FROM durable_artifact_refs r JOIN durable_artifacts d USING (digest) "
                       "WHERE r.thread_id = %s", thread) == 1
    got = store.get_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": ""}})
    assert got is not None and [w[2] for w in got.pending_writes] == [_value(thread)]
    assert store._known_refs._inflight == {}


def test_artifact_column_is_not_compressed_again(store: DurablePostgresSaver, dsn: str) -> None:
    storage = "SELECT attstorage FROM pg_attribute WHERE attrelid = 'durable_artifacts'::regclass AND attname = 'data'"
    with psycopg.connect(dsn) as conn:
        assert conn.execute(storage).fetchone() == ("e",)
