"""recovery.status_counts from the trigger-kept per-status counts (issue 14, problem 4)
equals the full-scan classification it replaced, through inserts, status changes,
deletes, a TRUNCATE, live and expired leases, and after its counts are folded."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from _hypothesis_profiles import examples  # (and registers the settings profiles)
from hypothesis import given, settings
from hypothesis import strategies as st

from langgraph_durable import DurablePostgresSaver, status_counts
from langgraph_durable.ops import inspection as lgi
from langgraph_durable.recovery import STATUS_FOLD_ROWS, STATUS_KINDS
from langgraph_durable.sql.recovery import STATUS_COUNTS_SQL
from langgraph_durable.sql.threads import LEASE_RELEASE_SQL

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


# --------------------------------------------------------------------------------------
# has_root (issue 14): the orphan count probes checkpoints only for rows whose flag is
# not TRUE. The count is exact iff TRUE never outlives the thread's root checkpoints;
# every test below checks that invariant beside the count itself.

NAIVE_ORPHANS_SQL = """
SELECT count(*) FROM durable_threads t
WHERE t.status IN ('running', 'stopped', 'queued') AND t.has_root IS NOT TRUE
  AND NOT (t.lease_owner IS NOT NULL AND t.lease_expires_at > now())
"""  # a flag trusted both ways (FALSE/NULL = no checkpoint): what the probe is there for

STALE_TRUE_SQL = """
SELECT array_agg(thread_id ORDER BY thread_id) FROM durable_threads t
WHERE t.has_root AND NOT EXISTS (SELECT 1 FROM checkpoints c
                                 WHERE c.thread_id = t.thread_id AND c.checkpoint_ns = '')
"""


def _honest(dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        assert conn.execute(STALE_TRUE_SQL).fetchone() == (None,), "has_root TRUE without a root checkpoint"


def _exact(store: DurablePostgresSaver, dsn: str) -> dict[str, int]:
    _honest(dsn)
    counts = status_counts(store)
    assert counts == _full_scan(dsn)
    return counts


def _full_scan_kind(dsn: str, tid: str) -> str:
    one = FULL_SCAN_SQL.replace("FROM durable_threads t\n", "FROM durable_threads t WHERE t.thread_id = %s\n")
    assert one != FULL_SCAN_SQL
    with psycopg.connect(dsn) as conn:
        row = conn.execute(one, (tid,)).fetchone()
    assert row is not None
    return str(row[0])


def _flag(dsn: str, tid: str) -> bool | None:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT has_root FROM durable_threads WHERE thread_id = %s", (tid,)).fetchone()
    assert row is not None, tid
    return row[0]  # type: ignore[no-any-return]


_CP_SEQ = iter(range(10**9))


def _put_cp(conn: psycopg.Connection[Any], tid: str, ns: str = "") -> str:
    cid = f"c{next(_CP_SEQ):09d}"
    conn.execute(
        "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, checkpoint, metadata) "
        "VALUES (%s, %s, %s, '{}', '{}')",
        (tid, ns, cid),
    )
    return cid


def _lease(conn: psycopg.Connection[Any], tid: str, status: str = "running") -> dict[str, Any]:
    """Take a lease on ``tid`` as a run would (a row made if none), for _release."""
    row = conn.execute(
        """INSERT INTO durable_threads AS t (thread_id, status, lease_owner, lease_token, lease_expires_at)
           VALUES (%(t)s, %(s)s, 'test-run', 1, now() + interval '1 min')
           ON CONFLICT (thread_id) DO UPDATE SET status = %(s)s, lease_owner = 'test-run',
               lease_token = t.lease_token + 1, lease_expires_at = now() + interval '1 min'
           RETURNING lease_token""",
        {"t": tid, "s": status},
    ).fetchone()
    assert row is not None
    return {"thread_id": tid, "token": row[0], "owner": "test-run"}


def _release_params(lease: dict[str, Any], status: str) -> dict[str, Any]:
    return {**lease, "status": status, "reset": False, "undo": False, "error": None, "checkpoint_id": None,
            "async_commit": status == "done"}


def _release(conn: psycopg.Connection[Any], tid: str, status: str, sql: str = LEASE_RELEASE_SQL) -> None:
    lease = _lease(conn, tid)
    conn.execute(sql, _release_params(lease, status))


def test_release_sets_the_flag_and_deletes_clear_it(store: DurablePostgresSaver, dsn: str) -> None:
    p = f"hr-{uuid.uuid4().hex[:6]}-"
    with psycopg.connect(dsn, autocommit=True) as conn:
        _put_cp(conn, p + "a")
        _put_cp(conn, p + "a")
        _release(conn, p + "a", "stopped")
        _release(conn, p + "none", "stopped")  # its run wrote nothing: orphaned
        _put_cp(conn, p + "sub", ns="child")  # only a subgraph checkpoint: no root
        _release(conn, p + "sub", "stopped")
    assert (_flag(dsn, p + "a"), _flag(dsn, p + "none"), _flag(dsn, p + "sub")) == (True, False, False)
    first = _exact(store, dsn)
    # One of two roots deleted: the flag stays (the thread is not probed from now on).
    _exec(dsn, "DELETE FROM checkpoints WHERE thread_id = %s AND checkpoint_id = "
               "(SELECT min(checkpoint_id) FROM checkpoints WHERE thread_id = %s)", (p + "a", p + "a"))
    assert _flag(dsn, p + "a") is True
    assert _exact(store, dsn) == first
    # The last root deleted by a plain DELETE (the stock saver's delete_thread keeps our
    # row): the thread is orphaned now, and counted so.
    _exec(dsn, "DELETE FROM checkpoints WHERE thread_id = %s", (p + "a",))
    assert _flag(dsn, p + "a") is False
    after = _exact(store, dsn)
    assert after["orphaned"] == first["orphaned"] + 1


def test_without_the_delete_trigger_the_count_would_be_wrong(store: DurablePostgresSaver, dsn: str) -> None:
    """The direction that matters: TRUE left behind by a delete hides an orphan. With
    the trigger disabled (in a rolled-back transaction) the count goes wrong, which is
    what the trigger is for; with it, the count equals the full scan."""
    p = f"trg-{uuid.uuid4().hex[:6]}-"
    with psycopg.connect(dsn, autocommit=True) as conn:
        _put_cp(conn, p + "x")
        _release(conn, p + "x", "stopped")
    expected = _full_scan(dsn)
    with psycopg.connect(dsn) as conn:
        conn.execute("ALTER TABLE checkpoints DISABLE TRIGGER durable_root_del")
        conn.execute("DELETE FROM checkpoints WHERE thread_id = %s", (p + "x",))
        orphans = conn.execute(STATUS_COUNTS_SQL).fetchall()[0][3]
        truth = conn.execute(
            "SELECT count(*) FROM durable_threads t WHERE t.status IN ('running', 'stopped', 'queued') "
            "AND NOT (t.lease_owner IS NOT NULL AND t.lease_expires_at > now()) AND NOT EXISTS "
            "(SELECT 1 FROM checkpoints c WHERE c.thread_id = t.thread_id AND c.checkpoint_ns = '')"
        ).fetchone()[0]  # type: ignore[index]
        assert orphans == truth - 1  # the stale TRUE hides the orphan
        conn.rollback()
    assert _exact(store, dsn) == expected
    _exec(dsn, "DELETE FROM checkpoints WHERE thread_id = %s", (p + "x",))
    assert _exact(store, dsn)["orphaned"] == expected["orphaned"] + 1


# A child that runs a graph on a new thread and hangs in its first node, after LangGraph
# wrote the input checkpoint; the test SIGKILLs it there (no release ever runs).
_KILLED_CHILD = """
import sys, time
from langgraph.graph import END, START, StateGraph
from typing import TypedDict
from langgraph_durable import DurablePostgresSaver

class S(TypedDict, total=False):
    x: int

def hang(state):
    print("IN_NODE", flush=True)
    time.sleep(120)
    return {"x": 1}

g = StateGraph(S)
g.add_node("hang", hang)
g.add_edge(START, "hang")
g.add_edge("hang", END)
with DurablePostgresSaver.from_conn_string(sys.argv[1], lease_ttl=1.0) as saver:
    g.compile(checkpointer=saver).invoke({"x": 0}, {"configurable": {"thread_id": sys.argv[2]}})
"""


def test_sigkilled_run_after_its_first_checkpoint_is_recoverable(store: DurablePostgresSaver, dsn: str) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    tid = f"kill-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED_CHILD, dsn, tid], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "IN_NODE"
        deadline = time.monotonic() + 30
        while _count(dsn, f"SELECT count(*) FROM checkpoints WHERE thread_id = '{tid}'") == 0:
            assert time.monotonic() < deadline, "no checkpoint written"
            time.sleep(0.05)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
    assert _flag(dsn, tid) is None  # acquired on a new thread, never released
    deadline = time.monotonic() + 30
    while _count(dsn, f"SELECT count(*) FROM durable_threads WHERE thread_id = '{tid}' "
                      "AND lease_expires_at > now()") != 0:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    counts = _exact(store, dsn)
    assert counts["recoverable"] >= 1
    # A flag trusted both ways would call it orphaned: the probe is what counts it right.
    with psycopg.connect(dsn) as conn:
        naive = conn.execute(NAIVE_ORPHANS_SQL + " AND t.thread_id = %s", (tid,)).fetchone()
    assert naive == (1,)
    assert _full_scan_kind(dsn, tid) == "recoverable"


def _wait_blocked(dsn: str, pid: int) -> None:
    import time

    deadline = time.monotonic() + 10
    while _count(dsn, f"SELECT count(*) FROM pg_stat_activity WHERE pid = {pid} AND wait_event_type = 'Lock'") == 0:
        assert time.monotonic() < deadline, "never blocked"
        time.sleep(0.02)


def _release_racing_delete(dsn: str, tid: str, release_sql: str) -> bool | None:
    """A release whose snapshot still sees the root checkpoint that a concurrent
    (stock) delete removes and commits while the release waits for the thread row."""
    import threading

    with psycopg.connect(dsn, autocommit=True) as conn:
        _put_cp(conn, tid)
        lease = _lease(conn, tid)
    with psycopg.connect(dsn) as deleter, psycopg.connect(dsn, autocommit=True) as releaser:
        deleter.execute("DELETE FROM checkpoints WHERE thread_id = %s", (tid,))  # trigger: row locked
        pid = releaser.info.backend_pid
        t = threading.Thread(target=lambda: releaser.execute(release_sql, _release_params(lease, "stopped")))
        t.start()
        _wait_blocked(dsn, pid)
        deleter.commit()
        t.join(10)
        assert not t.is_alive()
    return _flag(dsn, tid)


def test_release_racing_a_delete_never_sets_a_stale_true(store: DurablePostgresSaver, dsn: str) -> None:
    p = f"race-{uuid.uuid4().hex[:6]}-"
    # The release as a naive flag would write it (EXISTS at its snapshot): stale TRUE.
    naive_sql, n = re.subn(r"has_root = CASE WHEN .*? END,", "has_root = EXISTS (SELECT 1 FROM checkpoints c "
                           "WHERE c.thread_id = %(thread_id)s AND c.checkpoint_ns = ''),",
                           LEASE_RELEASE_SQL, flags=re.DOTALL)
    assert n == 1
    assert _release_racing_delete(dsn, p + "naive", naive_sql) is True
    with pytest.raises(AssertionError):
        _honest(dsn)
    _exec(dsn, "DELETE FROM durable_threads WHERE thread_id = %s", (p + "naive",))
    # The real statement sees the row changed under it and writes unknown.
    assert _release_racing_delete(dsn, p + "real", LEASE_RELEASE_SQL) is None
    assert _exact(store, dsn)["orphaned"] >= 1


def test_a_run_starting_during_a_delete_releases_after_it(store: DurablePostgresSaver, dsn: str) -> None:
    """A delete leaves a row with no lease and no TRUE flag unwritten (only locked): a
    run starting meanwhile waits for that lock, so its release reads after the delete."""
    import threading

    tid = f"acq-{uuid.uuid4().hex[:6]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        _put_cp(conn, tid)
        conn.execute("INSERT INTO durable_threads (thread_id, status) VALUES (%s, 'stopped')", (tid,))
    lease: dict[str, Any] = {}
    with psycopg.connect(dsn) as deleter, psycopg.connect(dsn, autocommit=True) as run:
        deleter.execute("DELETE FROM checkpoints WHERE thread_id = %s", (tid,))
        t = threading.Thread(target=lambda: lease.update(_lease(run, tid)))
        t.start()
        _wait_blocked(dsn, run.info.backend_pid)
        deleter.commit()
        t.join(10)
        assert not t.is_alive()
        run.execute(LEASE_RELEASE_SQL, _release_params(lease, "stopped"))
    assert _flag(dsn, tid) is False
    assert _full_scan_kind(dsn, tid) == "orphaned"
    _exact(store, dsn)


def test_concurrent_deletes_of_disjoint_roots_clear_the_flag(store: DurablePostgresSaver, dsn: str) -> None:
    """Each delete alone leaves the other's root: the second one's check must see the
    first one committed (it waits for the row lock the first took)."""
    import threading

    tid = f"dis-{uuid.uuid4().hex[:6]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        c1, c2 = _put_cp(conn, tid), _put_cp(conn, tid)
        _release(conn, tid, "stopped")
    assert _flag(dsn, tid) is True
    with psycopg.connect(dsn) as d1, psycopg.connect(dsn) as d2:
        d1.execute("DELETE FROM checkpoints WHERE thread_id = %s AND checkpoint_id = %s", (tid, c1))

        def second() -> None:
            d2.execute("DELETE FROM checkpoints WHERE thread_id = %s AND checkpoint_id = %s", (tid, c2))
            d2.commit()

        t = threading.Thread(target=second)
        t.start()
        _wait_blocked(dsn, d2.info.backend_pid)
        d1.commit()
        t.join(10)
        assert not t.is_alive()
    assert _flag(dsn, tid) is False
    _exact(store, dsn)


def test_repeatable_read_delete_proves_the_remaining_root(store: DurablePostgresSaver, dsn: str) -> None:
    """The stock prune runs in REPEATABLE READ: its trigger locks a remaining root
    instead of re-reading, and writes the thread row only when none is left, so a prune
    next to a live run that keeps updating that row does not fail (a serialization
    failure with an unconditional write: found by test_retention's concurrent GC test)."""
    tid = f"rr-{uuid.uuid4().hex[:6]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        c1 = _put_cp(conn, tid)
        c2 = _put_cp(conn, tid)
        _release(conn, tid, "stopped")
    with psycopg.connect(dsn) as conn, psycopg.connect(dsn, autocommit=True) as run:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT 1")  # the snapshot is taken
        run.execute("UPDATE durable_threads SET lease_expires_at = now() WHERE thread_id = %s", (tid,))
        conn.execute("DELETE FROM checkpoints WHERE thread_id = %s AND checkpoint_id = %s", (tid, c1))
        conn.commit()
    assert _flag(dsn, tid) is True
    _exact(store, dsn)
    with psycopg.connect(dsn) as conn:  # the last root: cleared
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        conn.execute("DELETE FROM checkpoints WHERE thread_id = %s AND checkpoint_id = %s", (tid, c2))
        conn.commit()
    assert _flag(dsn, tid) is False
    _exact(store, dsn)


def _graph(saver: Any) -> Any:
    from langgraph.graph import END, START, StateGraph
    from typing_extensions import TypedDict

    class S(TypedDict, total=False):
        n: int

    g = StateGraph(S)
    g.add_node("a", lambda s: {"n": s.get("n", 0) + 1})
    g.add_edge(START, "a")
    g.add_edge("a", END)
    return g.compile(checkpointer=saver)


def _cfg(tid: str, run: str | None = None) -> Any:
    cfg: dict[str, Any] = {"configurable": {"thread_id": tid}}
    if run:
        cfg["run_id"] = run
    return cfg


def test_counts_exact_through_the_saver_s_own_paths(store: DurablePostgresSaver, dsn: str) -> None:
    from langgraph.checkpoint.postgres import PostgresSaver

    from langgraph_durable.sql.recovery import RECOVERY_QUEUE_SQL

    p = f"ops-{uuid.uuid4().hex[:6]}-"
    g = _graph(store)
    for name in ("stock", "del", "prune", "runs", "copy", "move", "rewrite"):
        for _ in range(2):
            g.invoke({"n": 0}, _cfg(p + name, run=str(uuid.uuid4()) if name == "runs" else None))
    assert all(_flag(dsn, p + n) for n in ("stock", "del", "prune", "runs", "copy", "move", "rewrite"))
    # Handed back / crashed-looking: what status_counts classifies one by one.
    _exec(dsn, "UPDATE durable_threads SET status = 'stopped' WHERE thread_id LIKE %s", (p + "%",))
    _exact(store, dsn)

    # The stock saver's delete_thread: checkpoints gone, our row kept -> orphaned.
    with PostgresSaver.from_conn_string(dsn) as stock:
        stock.delete_thread(p + "stock")
    assert _flag(dsn, p + "stock") is False
    _exact(store, dsn)
    # The durable delete_thread: the row goes too.
    store.delete_thread(p + "del")
    _exact(store, dsn)
    # prune keep_latest: the root stays, so does the flag (not probed).
    store.prune([p + "prune"], strategy="keep_latest")
    assert _flag(dsn, p + "prune") is True
    _exact(store, dsn)
    # delete_for_runs of every run of a thread: deleted whole.
    with psycopg.connect(dsn) as conn:
        runs = [r[0] for r in conn.execute(
            "SELECT DISTINCT metadata ->> 'run_id' FROM checkpoints WHERE thread_id = %s", (p + "runs",))]
    store.delete_for_runs(runs[:1])
    _exact(store, dsn)
    store.delete_for_runs(runs)
    _exact(store, dsn)
    # copy_thread: the target has no row (untracked) until queued: unknown, probed.
    store.copy_thread(p + "copy", p + "copy2")
    _exec(dsn, RECOVERY_QUEUE_SQL, {"thread_id": p + "copy2", "version": None})
    assert _flag(dsn, p + "copy2") is None
    counts = _exact(store, dsn)
    # Queued work on a thread with no checkpoint at all: orphaned.
    _exec(dsn, RECOVERY_QUEUE_SQL, {"thread_id": p + "fresh", "version": None})
    assert _exact(store, dsn)["orphaned"] == counts["orphaned"] + 1
    # A root checkpoint moved to another thread (an UPDATE of its key).
    _exec(dsn, "UPDATE checkpoints SET thread_id = %s WHERE thread_id = %s", (p + "moved", p + "move"))
    assert _flag(dsn, p + "move") is False
    _exact(store, dsn)
    # A migration's in-place rewrite (same ids) keeps the flag; one written as delete +
    # insert clears it (unknown: probed, still recoverable).
    _exec(dsn, "UPDATE checkpoints SET metadata = metadata || '{\"m\": 1}' WHERE thread_id = %s", (p + "rewrite",))
    assert _flag(dsn, p + "rewrite") is True
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TEMP TABLE keep AS SELECT * FROM checkpoints WHERE thread_id = %s", (p + "rewrite",))
        conn.execute("DELETE FROM checkpoints WHERE thread_id = %s", (p + "rewrite",))
        conn.execute("INSERT INTO checkpoints SELECT * FROM keep")
        conn.commit()
    assert _flag(dsn, p + "rewrite") is False
    _exact(store, dsn)
    # A run on a thread whose flag is unknown sets it at its release.
    g.invoke({"n": 0}, _cfg(p + "copy2"))
    assert _flag(dsn, p + "copy2") is True
    _exact(store, dsn)


def test_backfill_flags_the_backlog_only(store: DurablePostgresSaver, dsn: str) -> None:
    from langgraph_durable.sql.schema import MIGRATIONS

    backfill = next(m for m in MIGRATIONS if m.lstrip().startswith("UPDATE durable_threads t\n    SET has_root"))
    p = f"bf-{uuid.uuid4().hex[:6]}-"
    _seed(dsn, p, 70)
    _exec(dsn, "UPDATE durable_threads SET has_root = NULL WHERE thread_id LIKE %s", (p + "%",))
    _exec(dsn, backfill)
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT status, has_root, EXISTS (SELECT 1 FROM checkpoints c WHERE c.thread_id = t.thread_id "
            "AND c.checkpoint_ns = '') FROM durable_threads t WHERE thread_id LIKE %s", (p + "%",)).fetchall()
    for status, flag, has in rows:
        assert flag == (has if status in ("running", "stopped", "queued") else None), (status, flag, has)
    _exact(store, dsn)


def test_archive_restore_keeps_the_flag_only_with_its_root(store: DurablePostgresSaver, dsn: str) -> None:
    from langgraph_durable.sql.archive import RESTORED_ROOT_CHECK_SQL

    tid = f"ar-{uuid.uuid4().hex[:6]}"
    with psycopg.connect(dsn) as conn:  # as a restore of an edited file would leave it
        conn.execute("INSERT INTO durable_threads (thread_id, status, has_root) VALUES (%s, 'stopped', true)", (tid,))
        conn.execute(RESTORED_ROOT_CHECK_SQL, (tid,))
        conn.commit()
    assert _flag(dsn, tid) is None
    _exact(store, dsn)


# Random histories: the saver's statements and foreign ones in any order, the new query
# against the full scan after each history (and the flag never stale TRUE).
_TIDS = [f"h{i}" for i in range(5)]
_op = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(_TIDS), st.sampled_from(["", "", "sub"])),
    st.tuples(st.just("del_oldest"), st.sampled_from(_TIDS), st.sampled_from(["", "sub"])),
    st.tuples(st.just("del_all"), st.sampled_from(_TIDS), st.just("")),
    st.tuples(st.just("release"), st.sampled_from(_TIDS),
              st.sampled_from(["stopped", "done", "error", "waiting", "running"])),
    st.tuples(st.just("crash"), st.sampled_from(_TIDS), st.sampled_from(["live", "expired"])),
    st.tuples(st.just("queue"), st.sampled_from(_TIDS), st.just("")),
    st.tuples(st.just("drop_row"), st.sampled_from(_TIDS), st.just("")),
    st.tuples(st.just("move"), st.sampled_from(_TIDS), st.sampled_from(_TIDS)),
    st.tuples(st.just("backfill"), st.just(""), st.just("")),
    st.tuples(st.just("truncate"), st.just(""), st.just("")),
    st.tuples(st.just("null_all"), st.just(""), st.just("")),
)


@given(ops=st.lists(_op, max_size=25))
@settings(max_examples=examples(ci=60, long=1000))
def test_new_count_equals_the_full_scan_on_random_histories(
    store: DurablePostgresSaver, dsn: str, ops: list[tuple[str, str, str]]
) -> None:
    from langgraph_durable.sql.recovery import RECOVERY_QUEUE_SQL
    from langgraph_durable.sql.schema import MIGRATIONS

    backfill = next(m for m in MIGRATIONS if m.lstrip().startswith("UPDATE durable_threads t\n    SET has_root"))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE durable_threads, checkpoints")
        for op, a, b in ops:
            if op == "put":
                _put_cp(conn, a, b)
            elif op == "del_oldest":
                conn.execute("DELETE FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id ="
                             " (SELECT min(checkpoint_id) FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = %s)",
                             (a, b, a, b))
            elif op == "del_all":
                conn.execute("DELETE FROM checkpoints WHERE thread_id = %s", (a,))
            elif op == "release":
                _release(conn, a, b)
            elif op == "crash":  # acquired, then the process died (or still runs)
                _lease(conn, a)
                if b == "expired":
                    conn.execute("UPDATE durable_threads SET lease_expires_at = now() - interval '1 s' "
                                 "WHERE thread_id = %s", (a,))
            elif op == "queue":
                conn.execute(RECOVERY_QUEUE_SQL, {"thread_id": a, "version": None})
            elif op == "drop_row":
                conn.execute("DELETE FROM durable_threads WHERE thread_id = %s", (a,))
            elif op == "move" and a != b:
                conn.execute("UPDATE checkpoints SET thread_id = %s WHERE thread_id = %s", (b, a))
            elif op == "backfill":
                conn.execute(backfill)
            elif op == "truncate":
                conn.execute("TRUNCATE checkpoints")
            elif op == "null_all":  # rows from before the migration
                conn.execute("UPDATE durable_threads SET has_root = NULL")
    _exact(store, dsn)


def test_a_stock_only_thread_deleted_while_a_run_starts_never_keeps_a_stale_true(
    store: DurablePostgresSaver, dsn: str
) -> None:
    """A stock delete of a thread with no row of ours: its trigger runs before a run
    starting meanwhile makes the row, so nothing locks that run out. The run writes no
    checkpoint and releases while the delete is still open; its probe must not take the
    uncommitted deletions for live roots (it waits for the delete instead)."""
    import threading
    import time

    tid = f"stockonly-{uuid.uuid4().hex[:6]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        _put_cp(conn, tid)
        _put_cp(conn, tid)
    with psycopg.connect(dsn) as deleter, psycopg.connect(dsn, autocommit=True) as run:
        deleter.execute("DELETE FROM checkpoints WHERE thread_id = %s", (tid,))  # trigger: no row yet
        lease = _lease(run, tid)  # no row to wait for: the run starts at once
        t = threading.Thread(target=lambda: run.execute(LEASE_RELEASE_SQL, _release_params(lease, "stopped")))
        t.start()
        # Either the release finishes at once (it read the deleted roots as live) or
        # it waits for the delete's row lock; then the delete commits.
        deadline = time.monotonic() + 10
        while t.is_alive() and _count(
            dsn, f"SELECT count(*) FROM pg_stat_activity WHERE pid = {run.info.backend_pid} "
                 "AND wait_event_type = 'Lock'"
        ) == 0:
            assert time.monotonic() < deadline, "release neither finished nor blocked"
            time.sleep(0.02)
        deleter.commit()
        t.join(10)
        assert not t.is_alive()
    assert _flag(dsn, tid) is not True
    assert _full_scan_kind(dsn, tid) == "orphaned"
    _exact(store, dsn)
