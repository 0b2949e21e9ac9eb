"""The write guard as inline SQL (issue 14, sql.checkpoints._GUARD): the same order rule
as durable_put_guard, and the same lock protocol against a takeover, in both orders of
the race (the guarded write first: the takeover waits; the takeover first: the write
waits, then fails and writes nothing)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from conftest import drop_database, make_database
from psycopg.types.json import Jsonb

from langgraph_durable import DurablePostgresSaver
from langgraph_durable.sql.checkpoints import (
    GUARDED_UPSERT_CHECKPOINT_SQL,
    GUARDED_UPSERT_WRITE_SQL,
    ORDER_SKEW_STATE,
    GuardMode,
    guard_params,
)
from langgraph_durable.sql.threads import FENCE_BUSY_STATE, FENCE_LOST_STATE, LEASE_ACQUIRE_SQL


def _put(
    conn: psycopg.Connection[Any], thread: str, cid: str, *, ns: str = "",
    token: int | None = None, owner: str | None = None, foreign: bool = False,
) -> None:
    row = (thread, ns, cid, None, Jsonb({"id": cid}), Jsonb({}))
    mode: GuardMode = "lease" if owner is not None else "foreign" if foreign else "none"
    params = guard_params(mode, thread, token, owner, ns, cid)
    conn.execute(GUARDED_UPSERT_CHECKPOINT_SQL[mode], (*row, *params))


def _write(conn: psycopg.Connection[Any], thread: str, cid: str, *, token: int, owner: str) -> None:
    row = (thread, "", cid, "task", "", 0, "ch", "msgpack", b"\x01")
    conn.execute(GUARDED_UPSERT_WRITE_SQL["lease"], (*row, *guard_params("lease", thread, token, owner, None, None)))


def _lease(conn: psycopg.Connection[Any], thread: str, owner: str, *, ttl: float = 60.0) -> int:
    row = conn.execute(
        LEASE_ACQUIRE_SQL,
        {"thread_id": thread, "owner": owner, "version": None, "ttl": ttl, "checkpoint_id": None,
         "dead_owner": None, "claim_owner": None, "claim_token": None},
    ).fetchone()
    assert row is not None
    return int(row[0])


def _sqlstate(fn: Any) -> str | None:
    try:
        fn()
    except psycopg.Error as exc:
        return exc.sqlstate
    return None


def test_inline_order_rule_is_durable_put_guards(dsn: str) -> None:
    """Every case of the order rule gives the same answer inline and in plpgsql."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for cid in ("b", "d"):
            _put(conn, "g-order", cid)
        _put(conn, "g-order", "a", ns="child")  # another namespace has its own head
        cases = [("e", ""), ("d", ""), ("b", ""), ("c", ""), ("a", ""), ("b", "child"), ("a", "x")]
        for cid, ns in cases:
            old = _sqlstate(lambda cid=cid, ns=ns: conn.execute(
                "SELECT durable_put_guard('g-order', NULL, NULL, false, %s, %s)", (ns, cid)))
            with conn.transaction(force_rollback=True):
                new = _sqlstate(lambda cid=cid, ns=ns: _put(conn, "g-order", cid, ns=ns))
            assert new == old, (cid, ns)
        assert _sqlstate(lambda: _put(conn, "g-order", "c")) == ORDER_SKEW_STATE
        with pytest.raises(psycopg.Error) as info:
            _put(conn, "g-order", "c")
        assert info.value.diag.message_detail == '{"head" : "d"}'


def test_inline_lease_and_busy_checks(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        token = _lease(conn, "g-lease", "me")
        _put(conn, "g-lease", "a", token=token, owner="me")
        _write(conn, "g-lease", "a", token=token, owner="me")
        assert _sqlstate(lambda: _put(conn, "g-lease", "b", token=token + 1, owner="me")) == FENCE_LOST_STATE
        assert _sqlstate(lambda: _write(conn, "g-lease", "a", token=token, owner="you")) == FENCE_LOST_STATE
        with pytest.raises(psycopg.Error) as info:
            _put(conn, "g-lease", "b", foreign=True)  # outside the run, the lease is live
        assert info.value.sqlstate == FENCE_BUSY_STATE
        assert '"owner" : "me"' in (info.value.diag.message_detail or "")
        ids = [r[0] for r in conn.execute(
            "SELECT checkpoint_id FROM checkpoints WHERE thread_id = 'g-lease' ORDER BY 1")]
        assert ids == ["a"]


def test_takeover_waits_for_an_in_flight_guarded_write(dsn: str) -> None:
    """The zombie's write passed its guard and is still open: the takeover blocks until
    it commits (the write lands before the new lease), and the zombie's next write fails."""
    with psycopg.connect(dsn, autocommit=True) as setup:
        token = _lease(setup, "g-race1", "zombie", ttl=0.01)
    time.sleep(0.05)  # the zombie's lease expired: anyone may take over
    with psycopg.connect(dsn) as zombie, psycopg.connect(dsn, autocommit=True) as taker:
        _put(zombie, "g-race1", "a", token=token, owner="zombie")  # open transaction
        done: list[int] = []
        t = threading.Thread(target=lambda: done.append(_lease(taker, "g-race1", "new")))
        t.start()
        t.join(0.5)
        assert t.is_alive() and not done, "the takeover did not wait for the in-flight write"
        zombie.commit()
        t.join(10)
        assert done == [token + 1]
        assert _sqlstate(lambda: _put(zombie, "g-race1", "b", token=token, owner="zombie")) == FENCE_LOST_STATE
        zombie.rollback()
        rows = [r[0] for r in taker.execute("SELECT checkpoint_id FROM checkpoints WHERE thread_id = 'g-race1'")]
        assert rows == ["a"]


@pytest.mark.parametrize("kind", ["put", "put_writes"])
def test_write_behind_an_open_takeover_fails_and_writes_nothing(dsn: str, kind: str) -> None:
    """The takeover is in flight (row updated, not committed) when the zombie writes:
    the write waits for it, re-reads the row once it commits (the statement's snapshot
    is older) and fails: no checkpoint or write of the zombie commits after the acquire."""
    thread = f"g-race2-{kind}"
    with psycopg.connect(dsn, autocommit=True) as setup:
        token = _lease(setup, thread, "zombie", ttl=0.01)
    time.sleep(0.05)
    with psycopg.connect(dsn) as taker, psycopg.connect(dsn, autocommit=True) as zombie:
        assert _lease(taker, thread, "new") == token + 1  # open transaction
        if kind == "put":
            def fn() -> None:
                _put(zombie, thread, "z", token=token, owner="zombie")
        else:
            def fn() -> None:
                _write(zombie, thread, "z", token=token, owner="zombie")
        got: list[str | None] = []
        t = threading.Thread(target=lambda: got.append(_sqlstate(fn)))
        t.start()
        t.join(0.5)
        assert t.is_alive(), "the write did not wait for the takeover"
        taker.commit()
        t.join(10)
        assert got == [FENCE_LOST_STATE]
        n = zombie.execute(
            "SELECT (SELECT count(*) FROM checkpoints WHERE thread_id = %(t)s)"
            " + (SELECT count(*) FROM checkpoint_writes WHERE thread_id = %(t)s)", {"t": thread}).fetchone()
        assert n == (0,)


def _numbered(query: str) -> str:
    """psycopg's %s placeholders as PREPARE's $1, $2, ..."""
    n = iter(range(1, 1000))
    return re.sub("%s", lambda _: f"${next(n)}", query)


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


@pytest.mark.parametrize("plan_cache_mode", ["force_generic_plan", "force_custom_plan"])
def test_order_check_probes_the_index_on_a_long_thread(admin_dsn: str, plan_cache_mode: str) -> None:
    """One thread with a long history (every row of the table is its): the put's order
    check is a probe of the primary key, never a scan of the table, in the generic plan
    (what a prepared put runs after five executions) and in custom plans (a transaction
    pooler: never prepared). The generic plan of the EXISTS form was a sequential scan
    here: a full scan per put (1.1 ms at 20k checkpoints, growing with the table)."""
    url = make_database(admin_dsn, "guard_plan")
    try:
        with DurablePostgresSaver.from_conn_string(url) as saver:
            saver.setup()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, checkpoint, metadata)"
                " SELECT 'long', '', lpad(i::text, 8, '0'), '{}', '{}' FROM generate_series(1, 5000) i")
            conn.execute("INSERT INTO durable_threads (thread_id, lease_owner, lease_token) VALUES ('long', 'me', 1)")
            conn.execute("ANALYZE checkpoints")
            conn.execute("ANALYZE durable_threads")
            conn.execute(psycopg.sql.SQL("SET plan_cache_mode = {}").format(psycopg.sql.Literal(plan_cache_mode)))
            for mode in ("lease", "foreign", "none"):
                conn.execute(f"PREPARE put_{mode} AS {_numbered(GUARDED_UPSERT_CHECKPOINT_SQL[mode])}")
                cid = "99999999"
                params = ("long", "", cid, None, Jsonb({}), Jsonb({}), *guard_params(mode, "long", 1, "me", "", cid))
                holes = ", ".join(["%s"] * len(params))
                row = psycopg.ClientCursor(conn).execute(
                    f"EXPLAIN (FORMAT JSON) EXECUTE put_{mode}({holes})", params).fetchone()
                assert row is not None
                scans = [n["Node Type"] for n in _nodes(row[0][0]["Plan"]) if n.get("Relation Name") == "checkpoints"]
                assert "Index Only Scan" in scans and "Seq Scan" not in scans, (mode, scans)
    finally:
        drop_database(admin_dsn, url)


def test_lease_checks_read_the_thread_row_by_primary_key(admin_dsn: str) -> None:
    """The lease check of a run's write and the foreign-lease check of a write outside a
    run read the thread's own row, found by primary key, in every plan. As WHERE clauses
    the planner preferred the owner index (lease check) or the live-lease index (foreign
    check) when few leases were live, and walked every lease of the owner, or every live
    lease, a heap row each, per write."""
    url = make_database(admin_dsn, "guard_plan_lease")
    try:
        with DurablePostgresSaver.from_conn_string(url) as saver:
            saver.setup()
        with psycopg.connect(url, autocommit=True) as conn:
            # 200 live leases of 50k threads, each run by its own worker.
            conn.execute(
                "INSERT INTO durable_threads (thread_id, status, lease_owner, lease_token, lease_expires_at)"
                " SELECT 't' || i, 'done', CASE WHEN i <= 200 THEN 'w' || i END, 1,"
                "        now() + CASE WHEN i <= 200 THEN interval '1 hour' ELSE interval '-1 day' END"
                " FROM generate_series(1, 50000) i")
            conn.execute("ANALYZE durable_threads")
            cases: list[tuple[str, str, tuple[Any, ...]]] = []
            for mode, thread, owner in (("lease", "t7", "w7"), ("foreign", "t999", None)):
                token = 1 if owner else None
                cases.append((f"put {mode}", GUARDED_UPSERT_CHECKPOINT_SQL[mode], (
                    thread, "", "a", None, Jsonb({}), Jsonb({}), *guard_params(mode, thread, token, owner, "", "a"))))
                cases.append((f"put_writes {mode}", GUARDED_UPSERT_WRITE_SQL[mode], (
                    thread, "", "a", "task", "", 0, "ch", "msgpack", b"\x01",
                    *guard_params(mode, thread, token, owner, None, None))))
            for plan_cache_mode in ("force_generic_plan", "force_custom_plan"):
                conn.execute(psycopg.sql.SQL("SET plan_cache_mode = {}").format(psycopg.sql.Literal(plan_cache_mode)))
                for kind, text, row in cases:
                    conn.execute(f"PREPARE w AS {_numbered(text)}")
                    holes = ", ".join(["%s"] * len(row))
                    plan = psycopg.ClientCursor(conn).execute(f"EXPLAIN (FORMAT JSON) EXECUTE w({holes})", row).fetchone()
                    conn.execute("DEALLOCATE w")
                    assert plan is not None
                    used = [n.get("Index Name") for n in _nodes(plan[0][0]["Plan"])
                            if n.get("Relation Name") == "durable_threads"]
                    # One probe by primary key, a run's put included: its lease test and
                    # its cancel flag are read together (issue 26, _LEASE_PUT_PROBE).
                    assert used == ["durable_threads_pkey"], (plan_cache_mode, kind, used)
    finally:
        drop_database(admin_dsn, url)
