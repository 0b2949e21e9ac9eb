"""recovery.status_counts from the trigger-kept per-status counts (issue 14, problem 4)
equals the full-scan classification it replaced, through inserts, status changes,
deletes, a TRUNCATE, live and expired leases, and after its counts are folded."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from langgraph_durable import DurablePostgresSaver, status_counts
from langgraph_durable.ops import inspection as lgi
from langgraph_durable.recovery import STATUS_FOLD_ROWS, STATUS_KINDS

# The query status_counts ran before issue 14: it scans every thread.
FULL_SCAN_SQL = """
SELECT CASE
         WHEN t.status IN ('done', 'waiting', 'quarantined') THEN t.status
         WHEN t.lease_owner IS NOT NULL AND t.lease_expires_at > now() THEN 'running'
         WHEN t.status = 'error' THEN 'error'
         WHEN EXISTS (SELECT 1 FROM checkpoints c
                      WHERE c.thread_id = t.thread_id AND c.checkpoint_ns = '') THEN 'recoverable'
         ELSE 'orphaned'
       END AS kind,
       count(*) AS n
FROM durable_threads t
GROUP BY 1
"""


# What inspect.thread_status_counts scanned before issue 14 (every thread id), with the
# one taxonomy of issue 13 (states.py: a queued thread is recoverable, as for recovery).
OLD_INSPECT_SQL = """
SELECT CASE
    WHEN t.thread_id IS NULL THEN 'untracked'
    WHEN t.status = 'quarantined' THEN 'quarantined'
    WHEN t.lease_owner IS NOT NULL AND t.lease_expires_at > now() THEN 'running'
    WHEN t.status IN ('running', 'stopped', 'queued', 'error') THEN 'recoverable'
    ELSE t.status
END AS state, t.status, count(*)::int AS n
FROM (SELECT DISTINCT thread_id FROM checkpoints UNION SELECT thread_id FROM durable_threads) ids
LEFT JOIN durable_threads t ON t.thread_id = ids.thread_id
GROUP BY 1, 2
"""


def _old_inspect(dsn: str) -> dict[str, int]:
    counts = dict.fromkeys(lgi.STATES, 0)
    counts["error"] = 0
    total = 0
    with psycopg.connect(dsn) as conn:
        for state, status, n in conn.execute(OLD_INSPECT_SQL).fetchall():
            counts[state] = counts.get(state, 0) + n
            if status == "error":
                counts["error"] += n
            total += n
    counts["total"] = total
    return counts


@pytest.fixture
def store(dsn: str) -> Iterator[DurablePostgresSaver]:
    with DurablePostgresSaver.from_conn_string(dsn) as s:
        s.setup()
        yield s


def _full_scan(dsn: str) -> dict[str, int]:
    counts = dict.fromkeys(STATUS_KINDS, 0)
    with psycopg.connect(dsn) as conn:
        for kind, n in conn.execute(FULL_SCAN_SQL).fetchall():
            counts[kind] = int(n)
    return counts


def _exec(dsn: str, sql: str, params: Any = None) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql, params)


def _seed(dsn: str, prefix: str, n: int) -> None:
    statuses = ["done", "waiting", "quarantined", "running", "stopped", "queued", "error"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO durable_threads (thread_id, status, lease_owner, lease_expires_at)
               SELECT %(p)s || g, (%(s)s::text[])[1 + g %% 7],
                      CASE WHEN g %% 5 = 0 THEN 'w' END,
                      CASE WHEN g %% 5 = 0 THEN now() + CASE WHEN g %% 10 = 0 THEN interval '1 h'
                                                             ELSE interval '-1 h' END END
               FROM generate_series(1, %(n)s) g""",
            {"p": prefix, "s": statuses, "n": n},
        )
        # Some of the threads have a checkpoint (recoverable), the rest not (orphaned).
        conn.execute(
            """INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, checkpoint, metadata)
               SELECT thread_id, '', 'c1', '{}'::jsonb, '{}'::jsonb FROM durable_threads
               WHERE thread_id LIKE %s || '%%' AND length(thread_id) %% 2 = 0""",
            (prefix,),
        )


def test_counts_follow_every_change(store: DurablePostgresSaver, dsn: str) -> None:
    _exec(dsn, "TRUNCATE durable_threads")
    assert status_counts(store) == _full_scan(dsn) == dict.fromkeys(STATUS_KINDS, 0)
    p = f"sc-{uuid.uuid4().hex[:6]}-"
    _seed(dsn, p, 140)
    assert status_counts(store) == _full_scan(dsn)
    _exec(dsn, "UPDATE durable_threads SET status = 'done' WHERE thread_id LIKE %s AND status = 'stopped'", (p + "1%",))
    _exec(dsn, "UPDATE durable_threads SET status = status WHERE thread_id LIKE %s", (p + "%",))  # no change
    _exec(dsn, "DELETE FROM durable_threads WHERE thread_id LIKE %s", (p + "2%",))
    _exec(dsn, "UPDATE durable_threads SET lease_expires_at = now() - interval '1 s' WHERE lease_owner = 'w'")
    counts = status_counts(store)
    assert counts == _full_scan(dsn)
    assert sum(counts.values()) == _count(dsn, "SELECT count(*) FROM durable_threads")
    _exec(dsn, "TRUNCATE durable_threads")
    assert status_counts(store) == dict.fromkeys(STATUS_KINDS, 0)


def test_counts_survive_their_fold(store: DurablePostgresSaver, dsn: str) -> None:
    p = f"fold-{uuid.uuid4().hex[:6]}-"
    _seed(dsn, p, 70)
    for _ in range(STATUS_FOLD_ROWS // 20 + 1):  # many +1/-1 rows (20 done/waiting threads)
        _exec(dsn, "UPDATE durable_threads SET status = CASE status WHEN 'done' THEN 'waiting' "
                   "WHEN 'waiting' THEN 'done' ELSE status END WHERE thread_id LIKE %s", (p + "%",))
    assert _count(dsn, "SELECT count(*) FROM durable_thread_counts") > STATUS_FOLD_ROWS
    first = status_counts(store)  # reads, then folds
    assert _count(dsn, "SELECT count(*) FROM durable_thread_counts") <= len(STATUS_KINDS)
    assert status_counts(store) == first == _full_scan(dsn)


def _count(dsn: str, sql: str) -> int:
    with psycopg.connect(dsn) as conn:
        return int(conn.execute(sql).fetchone()[0])  # type: ignore[index]


def test_inspect_counts_match_the_full_scan(store: DurablePostgresSaver, dsn: str) -> None:
    p = f"ic-{uuid.uuid4().hex[:6]}-"
    _seed(dsn, p, 90)
    # Untracked: checkpoints with no durable_threads row (a stock-saver thread).
    _exec(dsn, "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, checkpoint, metadata) "
               "VALUES (%s, '', 'c1', '{}', '{}'), (%s, '', 'c2', '{}', '{}')", (p + "stock", p + "stock"))
    _exec(dsn, "UPDATE durable_threads SET status = 'quarantined', lease_owner = 'w', "
               "lease_expires_at = now() + interval '1 h' WHERE thread_id = %s", (p + "3",))
    assert lgi.thread_status_counts(store) == _old_inspect(dsn)
    fast = lgi.thread_status_counts(store, untracked=False)
    assert fast["untracked"] == 0 and fast["running"] == _old_inspect(dsn)["running"]
