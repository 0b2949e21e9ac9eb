"""Operator queries at scale (issue 14, problem 4): do they grow with what they return
or with all history?

For each size (10k / 100k / 1M threads) a database is built with SQL: a real 3-step
run of a small graph is recorded once, then its rows (checkpoints, blobs, writes,
durable_threads) are copied ``generate_series`` times with new thread ids, so every
row has the shape the saver writes. Threads are mostly done, some waiting, error,
stopped (claimable), running with a live lease, and quarantined.

Timed (median of ``--repeat``), with EXPLAIN (ANALYZE, BUFFERS) of each:

* ``claim (backlog)``: a worker's claim poll with claimable threads (rolled back);
* ``claim (idle)``: the same poll when nothing is claimable for it;
* ``claim (other version)``: the poll of a worker of another version (``versions=['v2']``,
  unstamped threads adopted) during a rolling deploy: every claimable thread is of the
  build's version, none of its own (issue 26: it walked the whole backlog);
* ``status counts``: recovery.status_counts (CLI ``status`` / ``worker``), after the
  plan settings it sends (``STATUS_PLAN_SQL``, where it exists);
* ``threads counts``: inspect.thread_status_counts (CLI ``threads status``);
* ``threads list``: one page of 50 (CLI ``threads list``), first page and a later one.

``--churn`` rewrites the backlog rows before measuring, as a live install's claims,
renewals and releases do (the rows leave their insertion order in the heap).

    PYTHONPATH=$PWD python bench/bench_scale.py [--sizes 10k,100k,1m] [--size 10k] [--no-explain] [--churn]
"""

from __future__ import annotations

import argparse
import operator
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, TypedDict

import psycopg
from langgraph.graph import END, START, StateGraph
from psycopg import conninfo as ci
from psycopg.rows import dict_row

from langgraph_durable import DurablePostgresSaver, recovery
from langgraph_durable.sql import inspection as qi
from langgraph_durable.sql import recovery as recovery_sql

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
SIZES = {"10k": 10_000, "100k": 100_000, "1m": 1_000_000}


class State(TypedDict, total=False):
    messages: Annotated[list[str], operator.add]
    step: int


def _graph(saver: Any) -> Any:
    g = StateGraph(State)
    g.add_node("a", lambda s: {"messages": ["a" * 120], "step": 1})
    g.add_node("b", lambda s: {"messages": ["b" * 120], "step": 2})
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", END)
    return g.compile(checkpointer=saver)


@contextmanager
def database(admin: str, name: str, keep: bool, reuse: bool = False) -> Iterator[tuple[str, bool]]:
    with psycopg.connect(admin, autocommit=True) as conn:
        exists = reuse and conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield ci.make_conninfo(admin, dbname=name), bool(exists)
    finally:
        if not keep:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# Thread i's status by i % 100: 90 done, 4 waiting, 2 error, 2 stopped (claimable),
# 1 running with a live lease, 1 quarantined.
_STATUS = """CASE
    WHEN g % 100 < 90 THEN 'done' WHEN g % 100 < 94 THEN 'waiting'
    WHEN g % 100 < 96 THEN 'error' WHEN g % 100 < 98 THEN 'stopped'
    WHEN g % 100 = 98 THEN 'running' ELSE 'quarantined' END"""


def build(dsn: str, n: int) -> float:
    start = time.perf_counter()
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        saver.setup()
        _graph(saver).invoke({"messages": ["hi"]}, {"configurable": {"thread_id": "template"}})
    tid = "'t' || lpad(g::text, 8, '0')"
    with psycopg.connect(dsn, autocommit=True) as conn:
        series = f"generate_series(1, {int(n)}) AS g"
        conn.execute(
            f"""INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id,
                                         type, checkpoint, metadata)
                SELECT {tid}, c.checkpoint_ns, c.checkpoint_id, c.parent_checkpoint_id, c.type,
                       c.checkpoint, c.metadata
                FROM checkpoints c, {series} WHERE c.thread_id = 'template'"""
        )
        conn.execute(
            f"""INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
                SELECT {tid}, b.checkpoint_ns, b.channel, b.version, b.type, b.blob
                FROM checkpoint_blobs b, {series} WHERE b.thread_id = 'template'"""
        )
        conn.execute(
            f"""INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path,
                                               idx, channel, type, blob)
                SELECT {tid}, w.checkpoint_ns, w.checkpoint_id, w.task_id, w.task_path, w.idx,
                       w.channel, w.type, w.blob
                FROM checkpoint_writes w, {series} WHERE w.thread_id = 'template'"""
        )
        # has_root (issue 14, status counts): as the template's run left it (its release
        # found its root checkpoint), as the saver's release leaves every copied thread.
        has_root = conn.execute(
            "SELECT 1 FROM pg_attribute WHERE attrelid = 'durable_threads'::regclass "
            "AND attname = 'has_root' AND NOT attisdropped"
        ).fetchone()
        root_col, root_val = (", has_root", ", t.has_root") if has_root else ("", "")
        conn.execute(
            f"""INSERT INTO durable_threads (thread_id, status, graph_version, lease_owner, lease_token,
                                             lease_expires_at, attempts, updated_at, created_at{root_col})
                SELECT {tid}, {_STATUS}, t.graph_version,
                       CASE WHEN g % 100 = 98 THEN 'bench-worker' END, 1,
                       CASE WHEN g % 100 = 98 THEN now() + interval '1 hour' END,
                       1, now() - make_interval(secs => g), now() - make_interval(secs => g){root_val}
                FROM durable_threads t, {series} WHERE t.thread_id = 'template'"""
        )
        fold = getattr(recovery_sql, "STATUS_FOLD_SQL", None)
        if fold:  # the bulk insert left a +1 row per thread; status_counts folds them
            conn.execute(fold)
            # The fold wrote its rows after a million dead ones, so VACUUM could not
            # truncate the table; folded again once VACUUM has freed the space, they
            # land on the first page and the table shrinks to what a live install
            # keeps (a few pages: status_counts folds past STATUS_FOLD_ROWS rows).
            conn.execute("VACUUM durable_thread_counts")
            conn.execute(fold)
        conn.execute("VACUUM ANALYZE")
    return time.perf_counter() - start


def churn(dsn: str) -> float:
    """What a live install does to the backlog: every claim, renewal and release
    rewrites its thread's row, so the backlog rows move in the heap and the
    correlation of updated_at with it drops (a fresh build has them in order). One
    non-HOT rewrite of each (updated_at is indexed), then the statistics (issue 14:
    the claim's plan flipped to a sort of the whole backlog on such a table)."""
    start = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE durable_threads SET updated_at = updated_at "
            "WHERE status IN ('running', 'stopped', 'queued', 'error')"
        )
        conn.execute("VACUUM ANALYZE durable_threads")
    return time.perf_counter() - start


def _claim_params(statuses: list[str], retry_errors: bool, versions: list[str] | None = None) -> dict[str, Any]:
    params = {
        "statuses": statuses, "retry_errors": retry_errors, "backoff": 1.0, "max_backoff": 60.0,
        "any_version": versions is None, "versions": versions or [], "adopt": True, "skip": [], "limit": 1,
        "owner": "bench:claim", "ttl": 30.0,
    }
    version_params = getattr(recovery_sql, "claim_version_params", None)  # issue 26
    return {**params, **version_params(versions)} if version_params and versions is not None else params


def _claim_sql(statuses: list[str], retry_errors: bool, versions: list[str] | None = None) -> str:
    """The claim as _op_claim sends it for these statuses (one constant before issue 14;
    keyed by the worker's versions since issue 26)."""
    build = getattr(recovery_sql, "claim_sql", None)
    if build is None:
        return recovery_sql.RECOVERY_CLAIM_SQL
    if versions is not None and hasattr(recovery_sql, "claim_version_params"):
        return str(build(statuses, retry_errors, versions=len(versions)))
    return str(build(statuses, retry_errors))


def queries() -> dict[str, tuple[Any, Any, bool]]:
    """name -> (sql, params, run in a transaction rolled back with jit off)."""
    first_page = qi.THREAD_LIST_SQL, {"status": None, "prefix": None, "limit": 50, "after": None, "dead": []}
    later_page = qi.THREAD_LIST_SQL, {"status": None, "prefix": None, "limit": 50, "after": "t00005000", "dead": []}
    return {
        "claim (backlog)": (_claim_sql(list(recovery.RECOVERABLE), True), _claim_params(list(recovery.RECOVERABLE), True), True),
        "claim (idle)": (_claim_sql(["queued"], False), _claim_params(["queued"], False), True),
        "claim (other version)": (
            _claim_sql(list(recovery.RECOVERABLE), True, ["v2"]),
            _claim_params(list(recovery.RECOVERABLE), True, ["v2"]), True),
        # As status_counts sends it: after its plan settings (STATUS_PLAN_SQL), if any.
        "status counts": (recovery_sql.STATUS_COUNTS_SQL, None, hasattr(recovery_sql, "STATUS_PLAN_SQL")),
        "threads counts": (qi.THREAD_STATE_COUNTS_SQL, None, False),
        "untracked scan": (qi.UNTRACKED_COUNT_SQL, None, False),
        "threads list p1": (*first_page, False),
        "threads list p100": (*later_page, False),
    }


def _run(conn: psycopg.Connection[Any], sql: Any, params: Any, tx: bool, explain: bool) -> tuple[float, str]:
    prefix = "EXPLAIN (ANALYZE, BUFFERS) " if explain else ""
    stmt = psycopg.sql.Composed([psycopg.sql.SQL(prefix), sql]) if isinstance(sql, psycopg.sql.Composable) else prefix + sql
    start = time.perf_counter()
    with conn.transaction(force_rollback=True) if tx else _nothing():
        jit_off = getattr(recovery_sql, "JIT_OFF_SQL", None)  # absent before issue 14
        if "WITH cand AS" in sql:  # the claim: its plan settings as _op_claim sends them
            jit_off = getattr(recovery_sql, "CLAIM_PLAN_SQL", jit_off)
        if sql is getattr(recovery_sql, "STATUS_COUNTS_SQL", None):
            jit_off = getattr(recovery_sql, "STATUS_PLAN_SQL", jit_off)
        if tx and jit_off:
            conn.execute(jit_off)
        # prepare=False, as the saver sends the claim: a generic plan of it is far worse.
        rows = conn.execute(stmt, params, prepare=False).fetchall()
    elapsed = time.perf_counter() - start
    plan = "\n".join(str(next(iter(r.values()))) for r in rows) if explain else ""
    return elapsed, plan


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def measure(dsn: str, repeat: int, explain: bool) -> dict[str, tuple[float, str]]:
    out = {}
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        for name, (sql, params, tx) in queries().items():
            _run(conn, sql, params, tx, False)  # warm the cache
            times = [_run(conn, sql, params, tx, False)[0] for _ in range(repeat)]
            plan = _run(conn, sql, params, tx, True)[1] if explain else ""
            out[name] = (statistics.median(times), plan)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="an admin DSN (databases are created)")
    parser.add_argument("--sizes", default="10k,100k,1m")
    parser.add_argument("--size", help="one size only (CI: --size 10k)")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--no-explain", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the databases")
    parser.add_argument("--reuse", action="store_true", help="reuse databases kept by --keep")
    parser.add_argument("--churn", action="store_true",
                        help="rewrite the backlog rows first (a live install's heap order)")
    parser.add_argument("--db-prefix", default="bench_scale", help="name prefix of the databases")
    opts = parser.parse_args(argv)
    labels = [opts.size] if opts.size else opts.sizes.split(",")
    results: dict[str, dict[str, tuple[float, str]]] = {}
    for label in labels:
        n = SIZES[label.lower()]
        name = f"{opts.db_prefix}_{label.lower()}"
        with database(opts.dsn, name, opts.keep, reuse=opts.reuse) as (dsn, exists):
            if exists:  # built by an earlier --keep run: only bring its schema up to date
                with DurablePostgresSaver.from_conn_string(dsn) as saver:
                    saver.setup()
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute("VACUUM ANALYZE")
                print(f"# {label}: reusing {name}", flush=True)
            else:
                built = build(dsn, n)
                print(f"# {label}: {n} threads built in {built:.1f} s", flush=True)
            if opts.churn:
                print(f"# {label}: backlog churned in {churn(dsn):.1f} s", flush=True)
            results[label] = measure(dsn, opts.repeat, not opts.no_explain)
        for name, (_, plan) in results[label].items():
            if plan:
                print(f"\n## EXPLAIN {name} @ {label}\n{plan}")
    names = list(queries())
    header = f"{'query':<24}" + "".join(f"{label + ' (ms)':>14}" for label in labels)
    if len(labels) > 1:
        header += "".join(f"{labels[i + 1] + '/' + labels[i]:>14}" for i in range(len(labels) - 1))
    print("\n" + header)
    for name in names:
        line = f"{name:<24}" + "".join(f"{results[label][name][0] * 1000:>14.2f}" for label in labels)
        for i in range(len(labels) - 1):
            a, b = results[labels[i]][name][0], results[labels[i + 1]][name][0]
            line += f"{b / a:>13.1f}x"
        print(line)


Runner = Callable[[], None]

if __name__ == "__main__":
    main()
