"""The workers' claim on the ready queue (issue 14, problem 4): oldest claimable thread
first, never one another open claim holds (FOR UPDATE SKIP LOCKED), never one with a
live lease, a terminal status or no checkpoint, and a version filter that looks past
threads of other versions. Run as the saver sends it, on real Postgres."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from langgraph_durable import DurablePostgresSaver, recovery
from langgraph_durable.sql import recovery as recovery_sql


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
    conn.execute(recovery.CLAIM_PLAN_SQL)
    p = _params(**over)
    sql = recovery_sql.claim_sql(p["statuses"], p["retry_errors"])
    rows = conn.execute(sql, p, prepare=False).fetchall()
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


def _claim_batch(**over: Any) -> list[Any]:
    """The statements a worker's claim poll sends, in order, as _op_claim yields them."""
    target = recovery._Target(graph=None, saver=None, version="v1", versions=frozenset(["v1"]),  # type: ignore[arg-type]
                              any_version=True, adopt=True)
    kw: dict[str, Any] = {"retry_errors": True, "backoff": 1.0, "max_backoff": 60.0,
                          "statuses": list(recovery.RECOVERABLE), "skip": ()}
    kw.update(over)
    op = recovery._op_claim([target], "test:plan", 30.0, **kw)
    return list(next(op).stmts)


def test_claim_walks_the_ready_index_on_a_churned_table(db: str) -> None:
    """Issue 14: once the backlog rows have moved in the heap (every claim, renewal and
    release rewrites them in a live install) the correlation of updated_at drops, and
    a claim planned on statistics alone turned into Bitmap Heap Scan + Sort of the whole
    backlog (0.15 ms -> 34 ms at 100k threads, 153 ms at 1M). The claim must keep the
    ordered ready-index walk, which stops at the first taker, whatever the statistics."""
    with psycopg.connect(db, autocommit=True) as setup:
        setup.execute(
            """INSERT INTO durable_threads (thread_id, status, updated_at)
               SELECT 't' || lpad(g::text, 6, '0'),
                      CASE WHEN g % 10 < 8 THEN 'done' WHEN g % 10 = 8 THEN 'stopped' ELSE 'error' END,
                      now() - make_interval(secs => g)
               FROM generate_series(1, 30000) g"""
        )
        setup.execute(
            """INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, checkpoint, metadata)
               SELECT thread_id, '', 'c1', '{}', '{}' FROM durable_threads"""
        )
        # The churn: every backlog row rewritten once (a new heap position, non-HOT
        # as updated_at is indexed), then the statistics a live install would have.
        setup.execute(
            "UPDATE durable_threads SET updated_at = updated_at "
            "WHERE status IN ('running', 'stopped', 'queued', 'error')"
        )
        setup.execute("VACUUM ANALYZE durable_threads")
        setup.execute("VACUUM ANALYZE checkpoints")
    with psycopg.connect(db, row_factory=dict_row) as conn:
        *settings, claim = _claim_batch()
        for stmt in settings:
            conn.execute(stmt.sql, stmt.params)
        plan = "\n".join(
            r["QUERY PLAN"] for r in conn.execute("EXPLAIN " + claim.sql, claim.params, prepare=False).fetchall()
        )
        conn.rollback()
        assert "durable_threads_claim_idx" in plan, plan
        assert not re.search(r"Sort  \(", plan), plan  # no Sort node (Merge Append's "Sort Key" is fine)
        assert "Bitmap Heap Scan on durable_threads r " not in plan, plan  # the queue itself
        # ... and it still claims the oldest claimable thread.
        for stmt in settings:
            conn.execute(stmt.sql, stmt.params)
        rows = conn.execute(claim.sql, claim.params, prepare=False).fetchall()
        assert rows and rows[0]["thread_id"] == "t029999"  # the oldest: an error past its backoff


def test_claim_reads_only_the_statuses_it_takes(db: str) -> None:
    """A worker taking only 'queued' threads walks only those: the running, stopped and
    error threads ahead of them in the queue are not read (one walk per status)."""
    with psycopg.connect(db, autocommit=True) as setup:
        for i in range(50):
            _thread(setup, f"s-{i:02d}", "stopped", 1000 - i)
        _thread(setup, "q", "queued", 10)
        setup.execute("ANALYZE durable_threads")
    with psycopg.connect(db, row_factory=dict_row) as conn:
        *settings, claim = _claim_batch(statuses=["queued"], retry_errors=False)
        for stmt in settings:
            conn.execute(stmt.sql, stmt.params)
        plan = "\n".join(
            r["QUERY PLAN"]
            for r in conn.execute("EXPLAIN (ANALYZE, COSTS OFF) " + claim.sql, claim.params, prepare=False).fetchall()
        )
        conn.rollback()
        assert plan.count("durable_threads_claim_idx") == 1, plan
        assert "Rows Removed by Filter" not in plan.split("durable_threads_claim_idx")[1].split("->")[0], plan


def test_claims_an_expired_lease_and_its_own_again(db: str) -> None:
    """Leased threads are found by lease, not in the queue walk: an expired lease (its
    worker died) is claimable; a live one is not, unless it is this claim's own (the
    driver retried a claim whose COMMIT reply was lost: it takes it again, same token)."""
    with psycopg.connect(db, autocommit=True) as setup:
        _thread(setup, "live", "running", 500, live=True)
        _thread(setup, "dead", "running", 10)
        setup.execute("UPDATE durable_threads SET lease_owner = 'gone', lease_token = 7, "
                      "lease_expires_at = now() - interval '1 minute' WHERE thread_id = 'dead'")
    with psycopg.connect(db, row_factory=dict_row, autocommit=True) as conn:
        assert _claim(conn, owner="me") == "dead"
        token = conn.execute("SELECT lease_token FROM durable_threads WHERE thread_id = 'dead'").fetchone()
        assert token == {"lease_token": 8}
        assert _claim(conn, owner="other") is None  # "dead" is live now, "live" too
        assert _claim(conn, owner="me") == "dead"  # the retry: its own, same token
        token = conn.execute("SELECT lease_token FROM durable_threads WHERE thread_id = 'dead'").fetchone()
        assert token == {"lease_token": 8}
