"""The write guard's plans where the data make the planner's choice matter (issue 14).

The guard is inline SQL in every put / put_writes (sql.checkpoints._GUARD) and runs as
the prepared statement's generic plan. Two table shapes, each built with SQL, ANALYZEd,
then EXPLAIN (ANALYZE, BUFFERS) of the generic plan (``plan_cache_mode =
force_generic_plan``: what a prepared put runs from its sixth execution on), for the
stock upsert (the floor), the previous release's guard texts (``old``, embedded below)
and the package's:

* ``long thread``: one thread with a long history (--checkpoints, default 20k): the
  order check. ``old``: EXISTS (id > mine), planned as a scan of the whole table.
* ``live leases``: --threads (default 100k) threads, 200 live leases each held by its
  own run: the foreign-lease check of a write outside a run. ``old``: the live-lease
  index walked (a heap row per live lease).
The lease check of a run's write had the same shape (its generic plan took the owner
index when few leases were live); with one owner per run start that index holds one
entry per owner, so it cost nothing measurable and is not shown.

Prints the plan's scans of durable_threads / checkpoints, shared buffers and execution
ms (one execution after one warm-up, inside a rolled-back transaction), and the load.

Run: ``python bench/bench_guard_plans.py [--dsn ...] [--checkpoints 20000] [--threads 100000]``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Iterator
from typing import Any, cast

import psycopg
from langgraph.checkpoint.postgres.base import UPSERT_CHECKPOINT_WRITES_SQL, UPSERT_CHECKPOINTS_SQL
from psycopg import conninfo as ci
from psycopg.types.json import Jsonb

from langgraph_durable import DurablePostgresSaver
from langgraph_durable.sql import checkpoints as C

# The previous release's guard (f57f707), for the side-by-side.
_OLD_LEASE = """
    WHEN NOT EXISTS (
        SELECT 1 FROM durable_threads
        WHERE thread_id = %s AND lease_token = %s::bigint AND lease_owner = %s FOR SHARE)
    THEN durable_guard_fail('lost', %s, %s::bigint, NULL, NULL)"""
_OLD_FOREIGN = """
    WHEN EXISTS (
        SELECT 1 FROM durable_threads
        WHERE thread_id = %s AND lease_owner IS NOT NULL AND lease_expires_at > now())
    THEN durable_guard_fail('busy', %s, NULL, NULL, NULL)"""
_OLD_ORDER = """
    WHEN EXISTS (
        SELECT 1 FROM checkpoints
        WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id > %s)
      AND NOT EXISTS (
        SELECT 1 FROM checkpoints
        WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s)
    THEN durable_guard_fail('order', %s, NULL, %s, %s)"""


def _old_guard(mode: str, order: bool) -> str:
    part = {"lease": _OLD_LEASE, "foreign": _OLD_FOREIGN, "none": ""}[mode]
    return f"CASE{part}{_OLD_ORDER if order else ''}\n    ELSE true END"


def _old_params(mode: str, thread: str, token: int | None, owner: str | None, ns: str | None, cid: str | None) -> tuple[Any, ...]:
    out: tuple[Any, ...] = ()
    if mode == "lease":
        out = (thread, token, owner, thread, token)
    elif mode == "foreign":
        out = (thread, thread)
    if cid is not None:
        out = (*out, thread, ns, cid, thread, ns, cid, thread, ns, cid)
    return out


def _numbered(query: str) -> str:
    n = iter(range(1, 1000))
    return re.sub("%s", lambda _: f"${next(n)}", query)


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


def _explain(conn: psycopg.Connection[Any], text: str, params: tuple[Any, ...]) -> str:
    conn.execute(f"PREPARE g AS {_numbered(text)}")
    holes = ", ".join(["%s"] * len(params))
    cur = psycopg.ClientCursor(conn)
    try:
        for _ in range(2):  # a warm-up, then the measured execution
            with conn.transaction(force_rollback=True):
                row = cur.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE g({holes})", params).fetchone()
    finally:
        conn.execute("DEALLOCATE g")
    assert row is not None
    top = row[0][0]
    scans = [
        f"{n['Node Type']}{' ' + n['Index Name'] if 'Index Name' in n else ''}"
        for n in _nodes(top["Plan"])
        if n.get("Relation Name") in ("durable_threads", "checkpoints") and n["Node Type"] != "ModifyTable"
    ]
    hits = top["Plan"].get("Shared Hit Blocks", 0) + top["Plan"].get("Shared Read Blocks", 0)
    return f"{top['Execution Time']:7.3f} ms  {hits:6} buffers  {', '.join(scans) or '-'}"


def _put(mode: str, new: bool, thread: str, token: int | None, owner: str | None, cid: str) -> tuple[str, tuple[Any, ...]]:
    row = (thread, "", cid, None, Jsonb({}), Jsonb({}))
    if mode == "floor":
        return UPSERT_CHECKPOINTS_SQL, row
    if new:
        m = cast(C.GuardMode, mode)
        return C.GUARDED_UPSERT_CHECKPOINT_SQL[m], (*row, *C.guard_params(m, thread, token, owner, "", cid))
    text = C._UPSERT_CHECKPOINT.format(guard=_old_guard(mode, True))
    return text, (*row, *_old_params(mode, thread, token, owner, "", cid))


def _writes(mode: str, new: bool, thread: str, token: int | None, owner: str | None) -> tuple[str, tuple[Any, ...]]:
    row = (thread, "", "99999999", "task", "", 0, "ch", "msgpack", b"\x01")
    if mode == "floor":
        return UPSERT_CHECKPOINT_WRITES_SQL, row
    if new:
        m = cast(C.GuardMode, mode)
        return C.GUARDED_UPSERT_WRITE_SQL[m], (*row, *C.guard_params(m, thread, token, owner, None, None))
    return C._UPSERT_WRITE.format(guard=_old_guard(mode, False)), (*row, *_old_params(mode, thread, token, owner, None, None))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", default=os.environ.get("BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--checkpoints", type=int, default=20_000)
    ap.add_argument("--threads", type=int, default=100_000)
    args = ap.parse_args(argv)
    name = f"bench_guard_plans_{os.getpid()}"
    with psycopg.connect(args.dsn, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    params = ci.conninfo_to_dict(args.dsn)
    params["dbname"] = name
    dsn = ci.make_conninfo("", **params)
    print(f"load before: {os.getloadavg()}")
    try:
        with DurablePostgresSaver.from_conn_string(dsn) as s:
            s.setup()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SET plan_cache_mode = force_generic_plan")
            conn.execute(
                "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, checkpoint, metadata)"
                " SELECT 'long', '', lpad(i::text, 8, '0'), '{}', '{}' FROM generate_series(1, %s) i",
                (args.checkpoints,))
            conn.execute("INSERT INTO durable_threads (thread_id, lease_owner, lease_token, lease_expires_at)"
                         " VALUES ('long', 'run-long', 1, now() + interval '1 hour')")
            conn.execute("ANALYZE")
            print(f"\nlong thread: one thread, {args.checkpoints} checkpoints; a put of its next checkpoint")
            for label, mode, new in (("floor", "floor", True), ("old lease", "lease", False), ("lease", "lease", True),
                                     ("old none", "none", False), ("none", "none", True)):
                text, p = _put(mode, new, "long", 1, "run-long", "99999999")
                print(f"  {label:12} {_explain(conn, text, p)}")
            conn.execute("TRUNCATE checkpoints, durable_threads")
            # 200 live leases, each run its own owner (what a run start writes), spread over
            # the table as runs start over time; the other threads released, 3 checkpoints each.
            step = max(args.threads // 200, 1)
            conn.execute(
                "INSERT INTO durable_threads (thread_id, status, lease_owner, lease_token, lease_expires_at)"
                " SELECT 't' || i, 'done', CASE WHEN i %% %s = 0 THEN 'run-' || i END, 1,"
                "        now() + CASE WHEN i %% %s = 0 THEN interval '1 hour' ELSE interval '-1 day' END"
                " FROM generate_series(1, %s) i", (step, step, args.threads))
            conn.execute(
                "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, checkpoint, metadata)"
                " SELECT 't' || i, '', lpad(j::text, 8, '0'), '{}', '{}'"
                " FROM generate_series(1, %s) i, generate_series(1, 3) j", (args.threads,))
            conn.execute("ANALYZE")
            print(f"\nlive leases: {args.threads} threads, 200 live leases (one per run, spread);"
                  " a write outside a run (foreign check)")
            for label, mode, new in (("floor", "floor", True), ("old foreign", "foreign", False), ("foreign", "foreign", True)):
                text, p = _put(mode, new, "t999", None, None, "99999999")
                print(f"  put {label:12} {_explain(conn, text, p)}")
                text, p = _writes(mode, new, "t999", None, None)
                print(f"  pw  {label:12} {_explain(conn, text, p)}")
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(f"\nload after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
