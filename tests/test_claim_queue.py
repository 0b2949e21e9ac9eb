"""The workers' claim on the ready queue (issue 14, problem 4): oldest claimable thread
first, never one another open claim holds (FOR UPDATE SKIP LOCKED), never one with a
live lease, a terminal status or no checkpoint, and a version filter that looks past
threads of other versions. Run as the saver sends it, on real Postgres."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any, cast

import psycopg
import pytest
from _hypothesis_profiles import examples  # (and registers the settings profiles)
from hypothesis import given, settings
from hypothesis import strategies as st
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


_SAME: Any = object()


def _thread(conn: psycopg.Connection[Any], tid: str, status: str, age: int, *, version: str | None = "v1",
            live: bool = False, checkpoint: bool = True, hint: str | None = _SAME) -> None:
    # The row names the version its checkpoint carries, as the saver writes them (the
    # run's acquisition and submit write the row's graph_version; issue 26: the claim of
    # a worker of some versions finds threads by it). hint: a row naming another one.
    conn.execute(
        "INSERT INTO durable_threads (thread_id, status, graph_version, lease_owner, lease_expires_at, updated_at) "
        "VALUES (%s, %s, %s, %s, %s, now() - make_interval(secs => %s))",
        (tid, status, version if hint is _SAME else hint, "w" if live else None, None if not live else "infinity", age),
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


def _claim_row(conn: psycopg.Connection[Any], **over: Any) -> dict[str, Any] | None:
    """One claim statement as _op_claim sends it (a worker of some versions: keyed by them)."""
    conn.execute(recovery.CLAIM_PLAN_SQL)
    p = _params(**over)
    count = None if p["any_version"] else len(p["versions"])
    if count is not None:
        p.update(recovery_sql.claim_version_params(p["versions"]))
    sql = recovery_sql.claim_sql(p["statuses"], p["retry_errors"], versions=count)
    rows = conn.execute(sql, p, prepare=False).fetchall()
    return rows[0] if rows else None


def _claim(conn: psycopg.Connection[Any], **over: Any) -> str | None:
    row = _claim_row(conn, **over)
    assert row is None or row["claimed"], row  # a correction is only ever a row naming the wrong version
    return row["thread_id"] if row else None


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


# --- claim26 ---------------------------------------------------------------- issue 26


def _versions_batch(versions: list[str], **over: Any) -> list[Any]:
    """The statements the poll of a worker of ``versions`` only sends (refuse policy)."""
    target = recovery._Target(graph=None, saver=None, version=versions[0],  # type: ignore[arg-type]
                              versions=frozenset(versions), any_version=False, adopt=True)
    kw: dict[str, Any] = {"retry_errors": True, "backoff": 1.0, "max_backoff": 60.0,
                          "statuses": list(recovery.RECOVERABLE), "skip": ()}
    kw.update(over)
    op = recovery._op_claim([target], "test:v2", 30.0, **kw)
    return list(next(op).stmts)


def _backlog(conn: psycopg.Connection[Any], n: int, version: str) -> None:
    """n threads of ``version`` a worker would take (stopped, queued, error past its
    backoff, running with an expired lease: the rolling deploy's backlog), each with a
    checkpoint stamped so, built in SQL; then churned (every row rewritten, as claims,
    renewals and releases do) and analyzed, as the churn test does."""
    conn.execute(
        """INSERT INTO durable_threads (thread_id, status, graph_version, lease_owner, lease_token,
                                        lease_expires_at, updated_at)
           SELECT %(v)s || '-' || lpad(g::text, 7, '0'),
                  (ARRAY['stopped', 'queued', 'error', 'running'])[g %% 4 + 1], %(v)s,
                  CASE WHEN g %% 4 = 3 THEN 'gone' END, 1,
                  CASE WHEN g %% 4 = 3 THEN now() - interval '1 hour' END,
                  now() - interval '1 day' - make_interval(secs => g)
           FROM generate_series(1, %(n)s) g""",
        {"v": version, "n": n},
    )
    conn.execute(
        """INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, checkpoint, metadata)
           SELECT thread_id, '', 'c1', '{}', jsonb_build_object('graph_version', graph_version)
           FROM durable_threads WHERE graph_version = %s""",
        (version,),
    )
    conn.execute("UPDATE durable_threads SET updated_at = updated_at WHERE graph_version = %s", (version,))
    conn.execute("VACUUM ANALYZE durable_threads")
    conn.execute("VACUUM ANALYZE checkpoints")


def _explain(conn: psycopg.Connection[Any], batch: list[Any]) -> dict[str, Any]:
    *settings, claim = batch
    for stmt in settings:
        conn.execute(stmt.sql, stmt.params)
    row = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + claim.sql, claim.params, prepare=False).fetchone()
    conn.rollback()
    assert row is not None
    return cast("dict[str, Any]", row["QUERY PLAN"][0]["Plan"])


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


def _reads(plan: dict[str, Any]) -> tuple[int, int, list[str]]:
    """(rows read from durable_threads by every scan of it, buffers of the whole
    statement, the node types): rows = actual rows x loops + rows removed by filter."""
    rows = 0
    for node in _nodes(plan):
        if node.get("Relation Name") == "durable_threads":
            loops = int(node.get("Actual Loops", 1))
            rows += int(node["Actual Rows"]) * loops + int(node.get("Rows Removed by Filter", 0))
            rows += int(node.get("Rows Removed by Index Recheck", 0))
    buffers = int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))
    return rows, buffers, [n["Node Type"] for n in _nodes(plan)]


def test_a_worker_of_another_version_never_walks_the_backlog(db: str) -> None:
    """Issue 26, the rolling-deploy poll: 20,000 threads of v1 wait for v1 workers (every
    ready status and expired leases); the poll of a v2 worker reads none of them, whether
    it finds nothing or one v2 thread behind them all. Bounded in rows and buffers, not
    in time: a walk of the backlog reads ~20,000 rows and hundreds of buffers. On main the
    idle poll's plan reads every one of them (the rows bound below fails)."""
    with psycopg.connect(db, autocommit=True) as setup:
        _backlog(setup, 20_000, "v1")
    with psycopg.connect(db, row_factory=dict_row) as conn:
        rows, buffers, kinds = _reads(_explain(conn, _versions_batch(["v2"])))
        assert rows == 0, (rows, buffers)  # nothing of v2: not one row of v1 read
        assert buffers <= 40, buffers  # index root pages, one per branch
        assert "Sort" not in kinds and "Seq Scan" not in kinds and "Bitmap Heap Scan" not in kinds, kinds
        with psycopg.connect(db, autocommit=True) as setup:  # one v2 thread, the newest of all
            _thread(setup, "mine", "stopped", 0, version="v2")
            setup.execute("ANALYZE durable_threads")
        plan = _explain(conn, _versions_batch(["v2"]))
        rows, buffers, kinds = _reads(plan)
        assert plan["Actual Rows"] == 1  # the claim took it ...
        assert rows <= 4, (rows, buffers)  # ... reading its row only (walk, lock, probe, update)
        assert buffers <= 60, buffers
        assert "Sort" not in kinds and "Seq Scan" not in kinds, kinds
        # The same worker, with its every ready status and none: still none of v1.
        rows, _, _ = _reads(_explain(conn, _versions_batch(["v2"], statuses=["queued"], retry_errors=False)))
        assert rows == 0, rows  # (its one thread is stopped)


def test_a_worker_of_some_versions_takes_the_oldest_of_them_first(db: str) -> None:
    """Fairness as before: the oldest claimable thread of the worker's versions (a
    migration path makes it run several), whatever its status, before newer ones; rows
    naming no version are walked too (an unstamped thread, adopted); a locked one is
    skipped, not waited for."""
    with psycopg.connect(db, autocommit=True) as setup:
        _thread(setup, "other-old", "stopped", 900, version="v9")
        _thread(setup, "v3-err", "error", 800, version="v3")
        _thread(setup, "v1-queued", "queued", 700, version="v1")
        _thread(setup, "unstamped", "stopped", 600, version=None)
        _thread(setup, "v3-stopped", "stopped", 500, version="v3")
    with psycopg.connect(db, row_factory=dict_row) as one, psycopg.connect(db, row_factory=dict_row) as two:
        mine = {"any_version": False, "versions": ["v1", "v3"], "retry_errors": True}
        assert _claim(one, **mine) == "v3-err"
        assert _claim(two, **mine) == "v1-queued"  # skipped the row one holds
        two.rollback()
        assert _claim(two, **mine, adopt=False) == "v1-queued"
        assert _claim(two, **mine, adopt=False) == "v3-stopped"  # "unstamped" is not for it
        two.commit()  # (a claim holds the rows it walked until it ends, as always)
        with psycopg.connect(db, row_factory=dict_row) as three:
            assert _claim(three, **mine, adopt=True) == "unstamped"


def test_a_row_naming_the_wrong_version_is_corrected_then_claimed(db: str) -> None:
    """A thread whose row names v1 while its latest checkpoint says v2 (rewritten outside a
    run by a v2 graph, say) is not in the v2 workers' walk. The first claim that walks it
    (a v1 worker's) corrects the row, takes nothing, and the v2 worker then claims it;
    through the op, the v1 worker's poll goes on to its own threads."""
    with psycopg.connect(db, autocommit=True) as setup:
        _thread(setup, "moved", "stopped", 900, version="v2", hint="v1")
        _thread(setup, "v1-own", "stopped", 100, version="v1")
    with psycopg.connect(db, row_factory=dict_row, autocommit=True) as conn:
        assert _claim(conn, any_version=False, versions=["v2"]) is None  # not in its walk (yet)
        row = _claim_row(conn, any_version=False, versions=["v1"], owner="v1-worker")
        assert row is not None and row["thread_id"] == "moved" and row["claimed"] is False
        back = conn.execute("SELECT graph_version, lease_owner FROM durable_threads WHERE thread_id = 'moved'").fetchone()
        assert back == {"graph_version": "v2", "lease_owner": None}
        assert _claim(conn, any_version=False, versions=["v1"]) == "v1-own"
        assert _claim(conn, any_version=False, versions=["v2"]) == "moved"


def test_update_state_by_another_version_moves_the_row_so_its_workers_find_it(db: str) -> None:
    """A thread a v1 run left stopped, then edited outside a run by the v2 graph
    (update_state): the row follows the new head's version, so a v2 worker claims it
    with no v1 worker left to correct the row (the end of a rolling deploy). Before
    SYNC_THREAD_VERSION_SQL the row kept naming v1 and no v2 poll ever found it."""
    from typing import TypedDict

    from langgraph.graph import START, StateGraph

    class S(TypedDict):
        n: int

    builder = StateGraph(S)
    builder.add_node("a", lambda s: {"n": s["n"] + 1})
    builder.add_edge(START, "a")
    cfg: Any = {"configurable": {"thread_id": "edited"}}
    with DurablePostgresSaver.from_conn_string(db, graph_version="v1") as v1:
        builder.compile(checkpointer=v1).invoke({"n": 0}, cfg)
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("UPDATE durable_threads SET status = 'stopped' WHERE thread_id = 'edited'")
    with DurablePostgresSaver.from_conn_string(db, graph_version="v2") as v2:
        builder.compile(checkpointer=v2).update_state(cfg, {"n": 41})
    with psycopg.connect(db, row_factory=dict_row, autocommit=True) as conn:
        row = conn.execute("SELECT graph_version FROM durable_threads WHERE thread_id = 'edited'").fetchone()
        assert row == {"graph_version": "v2"}
        assert _claim(conn, any_version=False, versions=["v2"]) == "edited"


def test_the_op_corrects_and_goes_on_within_one_poll(db: str) -> None:
    """_op_claim: a poll that meets rows naming the wrong version corrects them and
    claims what is really its own in the same poll (the saver's driver, real Postgres)."""
    with psycopg.connect(db, autocommit=True) as setup:
        for i in range(3):
            _thread(setup, f"moved-{i}", "stopped", 900 - i, version="v2", hint="v1")
        _thread(setup, "v1-own", "stopped", 100, version="v1")
    with DurablePostgresSaver.from_conn_string(db) as saver:
        target = recovery._Target(graph=None, saver=saver, version="v1", versions=frozenset(["v1"]),
                                  any_version=False, adopt=True)
        claim = saver.run_op(lambda: recovery._op_claim(
            [target], "op:v1", 30.0, retry_errors=True, backoff=1.0, max_backoff=60.0,
            statuses=list(recovery.RECOVERABLE), skip=()))
        assert claim is not None and claim.thread_id == "v1-own"
    with psycopg.connect(db, row_factory=dict_row) as conn:
        rows = conn.execute("SELECT thread_id, graph_version FROM durable_threads WHERE thread_id LIKE 'moved-%' "
                            "ORDER BY thread_id").fetchall()
        assert [r["graph_version"] for r in rows] == ["v2", "v2", "v2"]


_VERSIONS = ("v1", "v2", "v3")
_row = st.tuples(
    st.sampled_from(["running", "stopped", "queued", "error", "done", "waiting"]),
    st.sampled_from([*_VERSIONS, None]),  # the latest checkpoint's stamp
    st.sampled_from(["same", "same", "same", "none", "other"]),  # what the row names
)


@settings(max_examples=examples(ci=20, long=500))
@given(rows=st.lists(_row, min_size=1, max_size=12), mine=st.sets(st.sampled_from(_VERSIONS), min_size=1),
       adopt=st.booleans(), statuses=st.sets(st.sampled_from(list(recovery.RECOVERABLE)), min_size=1))
def test_the_poll_of_some_versions_against_a_model(
    db: str, rows: list[tuple[str, str | None, str]], mine: set[str], adopt: bool, statuses: set[str]
) -> None:
    """The poll of a worker of ``mine`` (repeated as _op_claim repeats it after a
    correction) takes the oldest thread it may run among those whose row names one of its
    versions or none; every row it walked past that named the wrong version now names its
    checkpoint's. Thread i is i seconds older than thread i+1; errors are past backoff."""
    versions = sorted(mine)
    with psycopg.connect(db, autocommit=True) as setup:
        setup.execute("TRUNCATE durable_threads")
        setup.execute("DELETE FROM checkpoints")
        for i, (status, stamp, named) in enumerate(rows):
            hint = {"same": stamp, "none": None, "other": "v-old"}[named]
            _thread(setup, f"t{i:02d}", status, 1000 - i, version=stamp, hint=hint)

    def ok(stamp: str | None) -> bool:
        return stamp in mine or (stamp is None and adopt)

    def named(i: int) -> str | None:
        stamp, how = rows[i][1], rows[i][2]
        return {"same": stamp, "none": None, "other": "v-old"}[how]

    takes = statuses | ({"error"})
    walked = [i for i, (status, _, _) in enumerate(rows) if status in takes and (named(i) in mine or named(i) is None)]
    expected = next((i for i in walked if ok(rows[i][1])), None)
    with psycopg.connect(db, row_factory=dict_row, autocommit=True) as conn:
        got = None
        for _ in range(recovery.CLAIM_REPAIRS_PER_POLL + len(rows)):
            row = _claim_row(conn, any_version=False, versions=versions, adopt=adopt,
                             statuses=sorted(statuses), retry_errors=True)
            if row is None or row["claimed"]:
                got = row["thread_id"] if row else None
                break
        assert got == (None if expected is None else f"t{expected:02d}")
        now = {r["thread_id"]: r["graph_version"] for r in conn.execute("SELECT thread_id, graph_version FROM durable_threads")}
    for i in walked:
        if expected is not None and i > expected:
            break
        if not ok(rows[i][1]):  # walked past, not taken: it names its checkpoint's version now
            assert now[f"t{i:02d}"] == rows[i][1], (i, rows[i], now)
