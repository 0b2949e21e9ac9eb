"""The workers' claim on the ready queue (issue 14, problem 4): oldest claimable thread
first, never one another open claim holds (FOR UPDATE SKIP LOCKED), never one with a
live lease, a terminal status or no checkpoint, and a version filter that looks past
threads of other versions. Run as the saver sends it, on real Postgres."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from langgraph_durable import DurablePostgresSaver, recovery


@pytest.fixture
def db(dsn: str) -> Iterator[str]:
    with DurablePostgresSaver.from_conn_string(dsn) as s:
        s.setup()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE durable_threads")
        conn.execute("DELETE FROM checkpoints")
    yield dsn


def _thread(conn: psycopg.Connection[Any], tid: str, status: str, age: int, *, version: str | None = "v1",
            live: bool = False, checkpoint: bool = True) -> None:
    conn.execute(
        "INSERT INTO durable_threads (thread_id, status, lease_owner, lease_expires_at, updated_at) "
        "VALUES (%s, %s, %s, %s, now() - make_interval(secs => %s))",
        (tid, status, "w" if live else None, None if not live else "infinity", age),
    )
    if checkpoint:
        md = psycopg.types.json.Jsonb({"graph_version": version} if version else {})
        conn.execute(
            "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, checkpoint, metadata) "
            "VALUES (%s, '', 'c1', '{}', %s)",
            (tid, md),
        )


def _params(**over: Any) -> dict[str, Any]:
    p = {
        "statuses": list(recovery.RECOVERABLE), "retry_errors": False, "backoff": 1.0, "max_backoff": 60.0,
        "any_version": True, "versions": [], "adopt": False, "skip": [], "limit": 1,
        "owner": f"test:{uuid.uuid4().hex[:6]}", "ttl": 30.0,
    }
    p.update(over)
    return p


def _claim(conn: psycopg.Connection[Any], **over: Any) -> str | None:
    conn.execute(recovery.JIT_OFF_SQL)
    rows = conn.execute(recovery.RECOVERY_CLAIM_SQL, _params(**over), prepare=False).fetchall()
    return rows[0]["thread_id"] if rows else None


def test_claims_oldest_first_and_skips_what_another_claim_holds(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as setup:
        _thread(setup, "done-old", "done", 500)
        _thread(setup, "live", "running", 400, live=True)
        _thread(setup, "orphan", "stopped", 300, checkpoint=False)
        _thread(setup, "a", "stopped", 200)
        _thread(setup, "b", "running", 100)
        _thread(setup, "c", "queued", 50)
    with psycopg.connect(db, row_factory=dict_row) as one, psycopg.connect(db, row_factory=dict_row) as two:
        assert _claim(one) == "a"  # transaction still open: row "a" locked
        assert _claim(two) == "b"  # skipped the locked row, did not wait
        two.rollback()
        assert _claim(two, statuses=["queued"]) == "c"
        assert _claim(two) == "b"  # still open: "c" and "b" are two's now
        with psycopg.connect(db, row_factory=dict_row) as three:
            assert _claim(three) is None  # nothing left that nobody holds
        one.commit()
    with psycopg.connect(db, row_factory=dict_row) as conn:
        row = conn.execute("SELECT lease_owner IS NOT NULL AS leased FROM durable_threads WHERE thread_id = 'a'").fetchone()
        assert row == {"leased": True}


def test_version_filter_looks_past_other_versions(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as setup:
        for i in range(30):  # the oldest claimable threads all belong to another version
            _thread(setup, f"other-{i:02d}", "stopped", 1000 - i, version="v-other")
        _thread(setup, "unstamped", "stopped", 900, version=None)
        _thread(setup, "mine", "stopped", 10, version="v1")
    with psycopg.connect(db, row_factory=dict_row) as conn:
        assert _claim(conn, any_version=False, versions=["v1"]) == "mine"
        conn.rollback()
        assert _claim(conn, any_version=False, versions=["v1"], adopt=True) == "unstamped"
