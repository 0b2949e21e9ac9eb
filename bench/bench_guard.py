"""Where a guarded put's server time goes (issue 14): the floor's statement, then the
same statement with one guard variant each, as raw psycopg pipelines (one implicit
transaction per call, what the saver sends), taking turns call by call.

Variants (each its own thread, checkpoints chained, a live lease row per thread):

* ``floor``        stock UPSERT_CHECKPOINTS_SQL
* ``guard``        the previous release's guard (``WHERE durable_put_guard(...)``, plpgsql)
* ``new``          the package's GUARDED_UPSERT_CHECKPOINT_SQL (inline guard, sql.checkpoints._GUARD)
* ``noop``         ``WHERE f()`` with a plpgsql f() returning true: the call alone
* ``share``        plpgsql: FOR SHARE row lock + token/owner check, no order check
* ``order``        plpgsql: the order check alone
* ``keyshare``     plpgsql: FOR KEY SHARE + check, no order check
* ``adv``          plpgsql: pg_advisory_xact_lock_shared + plain read, no order check
* ``adv+order``    plpgsql: advisory + read + order check
* ``sql-adv``      inline SQL: advisory + EXISTS read (no plpgsql on the success path)

``--writes``: the same for put_writes (two rows, executemany). Prints min / median /
p90 ms and the median's ratio to the floor, and the load average.

Run: ``python bench/bench_guard.py [--dsn ...] [--calls 2000]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from typing import Any

import psycopg
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.base import UPSERT_CHECKPOINT_WRITES_SQL, UPSERT_CHECKPOINTS_SQL
from psycopg import conninfo as ci
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from langgraph_durable import DurablePostgresSaver
from langgraph_durable.sql.checkpoints import (
    GUARDED_UPSERT_CHECKPOINT_SQL,
    GUARDED_UPSERT_WRITE_SQL,
)
from langgraph_durable.sql.checkpoints import guard_params as package_guard_params

FUNCS = {
    "noop": """CREATE OR REPLACE FUNCTION bg_noop(p_thread text, p_token bigint, p_owner text,
        p_ns text, p_id text) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN RETURN true; END $$""",
    "share": """CREATE OR REPLACE FUNCTION bg_share(p_thread text, p_token bigint, p_owner text,
        p_ns text, p_id text) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN
        PERFORM 1 FROM durable_threads
        WHERE thread_id = p_thread AND lease_token = p_token AND lease_owner = p_owner FOR SHARE;
        IF NOT FOUND THEN RAISE EXCEPTION USING ERRCODE = 'LGD01', MESSAGE = 'lost'; END IF;
        RETURN true; END $$""",
    "keyshare": """CREATE OR REPLACE FUNCTION bg_keyshare(p_thread text, p_token bigint, p_owner text,
        p_ns text, p_id text) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN
        PERFORM 1 FROM durable_threads
        WHERE thread_id = p_thread AND lease_token = p_token AND lease_owner = p_owner FOR KEY SHARE;
        IF NOT FOUND THEN RAISE EXCEPTION USING ERRCODE = 'LGD01', MESSAGE = 'lost'; END IF;
        RETURN true; END $$""",
    "order": """CREATE OR REPLACE FUNCTION bg_order(p_thread text, p_token bigint, p_owner text,
        p_ns text, p_id text) RETURNS boolean LANGUAGE plpgsql AS $$
        DECLARE v_head text; BEGIN
        SELECT checkpoint_id INTO v_head FROM checkpoints
        WHERE thread_id = p_thread AND checkpoint_ns = p_ns ORDER BY checkpoint_id DESC LIMIT 1;
        IF v_head > p_id AND NOT EXISTS (SELECT 1 FROM checkpoints WHERE thread_id = p_thread
            AND checkpoint_ns = p_ns AND checkpoint_id = p_id) THEN
            RAISE EXCEPTION USING ERRCODE = 'LGD03', MESSAGE = 'skew'; END IF;
        RETURN true; END $$""",
    "adv": """CREATE OR REPLACE FUNCTION bg_adv(p_thread text, p_token bigint, p_owner text,
        p_ns text, p_id text) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN
        PERFORM pg_advisory_xact_lock_shared(27751, hashtext(p_thread));
        PERFORM 1 FROM durable_threads
        WHERE thread_id = p_thread AND lease_token = p_token AND lease_owner = p_owner;
        IF NOT FOUND THEN RAISE EXCEPTION USING ERRCODE = 'LGD01', MESSAGE = 'lost'; END IF;
        RETURN true; END $$""",
    "adv+order": """CREATE OR REPLACE FUNCTION bg_advorder(p_thread text, p_token bigint, p_owner text,
        p_ns text, p_id text) RETURNS boolean LANGUAGE plpgsql AS $$
        DECLARE v_head text; BEGIN
        PERFORM pg_advisory_xact_lock_shared(27751, hashtext(p_thread));
        PERFORM 1 FROM durable_threads
        WHERE thread_id = p_thread AND lease_token = p_token AND lease_owner = p_owner;
        IF NOT FOUND THEN RAISE EXCEPTION USING ERRCODE = 'LGD01', MESSAGE = 'lost'; END IF;
        SELECT checkpoint_id INTO v_head FROM checkpoints
        WHERE thread_id = p_thread AND checkpoint_ns = p_ns ORDER BY checkpoint_id DESC LIMIT 1;
        IF v_head > p_id AND NOT EXISTS (SELECT 1 FROM checkpoints WHERE thread_id = p_thread
            AND checkpoint_ns = p_ns AND checkpoint_id = p_id) THEN
            RAISE EXCEPTION USING ERRCODE = 'LGD03', MESSAGE = 'skew'; END IF;
        RETURN true; END $$""",
    "exists": """CREATE OR REPLACE FUNCTION bg_exists(p_thread text, p_token bigint, p_owner text,
        p_ns text, p_id text) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN
        IF EXISTS (SELECT 1 FROM checkpoints WHERE thread_id = p_thread AND checkpoint_ns = p_ns
                   AND checkpoint_id > p_id)
           AND NOT EXISTS (SELECT 1 FROM checkpoints WHERE thread_id = p_thread
                   AND checkpoint_ns = p_ns AND checkpoint_id = p_id) THEN
            RAISE EXCEPTION USING ERRCODE = 'LGD03', MESSAGE = 'skew'; END IF;
        RETURN true; END $$""",
    "share+exists": """CREATE OR REPLACE FUNCTION bg_shareexists(p_thread text, p_token bigint, p_owner text,
        p_ns text, p_id text) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN
        PERFORM 1 FROM durable_threads
        WHERE thread_id = p_thread AND lease_token = p_token AND lease_owner = p_owner FOR SHARE;
        IF NOT FOUND THEN RAISE EXCEPTION USING ERRCODE = 'LGD01', MESSAGE = 'lost'; END IF;
        IF p_id IS NOT NULL AND EXISTS (SELECT 1 FROM checkpoints WHERE thread_id = p_thread
                AND checkpoint_ns = p_ns AND checkpoint_id > p_id)
           AND NOT EXISTS (SELECT 1 FROM checkpoints WHERE thread_id = p_thread
                AND checkpoint_ns = p_ns AND checkpoint_id = p_id) THEN
            RAISE EXCEPTION USING ERRCODE = 'LGD03', MESSAGE = 'skew'; END IF;
        RETURN true; END $$""",
    "adv+exists": """CREATE OR REPLACE FUNCTION bg_advexists(p_thread text, p_token bigint, p_owner text,
        p_ns text, p_id text) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN
        PERFORM pg_advisory_xact_lock_shared(27751, hashtext(p_thread));
        PERFORM 1 FROM durable_threads
        WHERE thread_id = p_thread AND lease_token = p_token AND lease_owner = p_owner;
        IF NOT FOUND THEN RAISE EXCEPTION USING ERRCODE = 'LGD01', MESSAGE = 'lost'; END IF;
        IF p_id IS NOT NULL AND EXISTS (SELECT 1 FROM checkpoints WHERE thread_id = p_thread
                AND checkpoint_ns = p_ns AND checkpoint_id > p_id)
           AND NOT EXISTS (SELECT 1 FROM checkpoints WHERE thread_id = p_thread
                AND checkpoint_ns = p_ns AND checkpoint_id = p_id) THEN
            RAISE EXCEPTION USING ERRCODE = 'LGD03', MESSAGE = 'skew'; END IF;
        RETURN true; END $$""",
    "lost": """CREATE OR REPLACE FUNCTION bg_lost(p_thread text) RETURNS boolean
        LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION USING ERRCODE = 'LGD01', MESSAGE = 'lost'; END $$""",
}
FN = {"share+exists": "bg_shareexists", "adv+exists": "bg_advexists", "exists": "bg_exists", "noop": "bg_noop", "share": "bg_share", "keyshare": "bg_keyshare", "order": "bg_order",
      "adv": "bg_adv", "adv+order": "bg_advorder"}

_CP_INSERT = """
INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata)
SELECT %s::text, %s::text, %s::text, %s::text, %s::jsonb, %s::jsonb
WHERE {where}
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id)
DO UPDATE SET checkpoint = EXCLUDED.checkpoint, metadata = EXCLUDED.metadata
"""
_W_INSERT = """
INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
SELECT %s::text, %s::text, %s::text, %s::text, %s::text, %s::integer, %s::text, %s::text, %s::bytea
WHERE {where}
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
    channel = EXCLUDED.channel, type = EXCLUDED.type, blob = EXCLUDED.blob
"""
_SQL_ADV = ("(SELECT pg_advisory_xact_lock_shared(27751, hashtext(%s)) IS NOT NULL) AND CASE WHEN EXISTS ("
            "SELECT 1 FROM durable_threads WHERE thread_id = %s AND lease_token = %s AND lease_owner = %s)"
            " THEN true ELSE bg_lost(%s) END")


# Inline (no plpgsql on the success path): the lease check with its row lock, then the
# order check as "is any checkpoint of this thread and namespace after mine?" (a forward
# index probe that touches no heap row when the answer is no); a CASE keeps the order.
_SQL_SHARE = ("CASE WHEN NOT EXISTS (SELECT 1 FROM durable_threads WHERE thread_id = %s AND lease_token = %s"
              " AND lease_owner = %s FOR SHARE) THEN bg_lost(%s) ELSE true END")
_SQL_SHARE_EXISTS = ("CASE WHEN NOT EXISTS (SELECT 1 FROM durable_threads WHERE thread_id = %s AND lease_token = %s"
                     " AND lease_owner = %s FOR SHARE) THEN bg_lost(%s)"
                     " WHEN %s::text IS NOT NULL AND EXISTS (SELECT 1 FROM checkpoints WHERE thread_id = %s"
                     " AND checkpoint_ns = %s AND checkpoint_id > %s) AND NOT EXISTS (SELECT 1 FROM checkpoints"
                     " WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s) THEN bg_lost(%s)"
                     " ELSE true END")


def variants() -> list[str]:
    return ["floor", "guard", "new", "noop", "share", "keyshare", "order", "exists", "share+exists", "adv", "adv+order", "adv+exists", "sql-adv",
            "sql-share", "sql-share+exists"]


def _variant_sql(v: str, template: str, floor: str, new: str) -> str:
    """Variant ``v`` of one write statement: the stock text (floor), the package's (new),
    or ``template`` with that variant's guard as its WHERE."""
    if v == "floor":
        return floor
    if v == "new":
        return new
    where = {"guard": "durable_put_guard(%s, %s::bigint, %s, false, %s, %s)", "sql-adv": _SQL_ADV,
             "sql-share": _SQL_SHARE, "sql-share+exists": _SQL_SHARE_EXISTS}.get(v)
    return template.format(where=where or f"{FN[v]}(%s, %s::bigint, %s, %s, %s)")


def cp_sql(v: str) -> str:
    return _variant_sql(v, _CP_INSERT, UPSERT_CHECKPOINTS_SQL, GUARDED_UPSERT_CHECKPOINT_SQL["lease"])


def w_sql(v: str) -> str:
    return _variant_sql(v, _W_INSERT, UPSERT_CHECKPOINT_WRITES_SQL, GUARDED_UPSERT_WRITE_SQL["lease"])


def guard_params(v: str, thread: str, ns: str | None, cid: str | None) -> tuple[Any, ...]:
    if v == "floor":
        return ()
    if v == "new":
        return package_guard_params("lease", thread, 1, "bench-owner", ns, cid)
    if v == "sql-adv":
        return (thread, thread, 1, "bench-owner", thread)
    if v == "sql-share":
        return (thread, 1, "bench-owner", thread)
    if v == "sql-share+exists":
        return (thread, 1, "bench-owner", thread, cid, thread, ns, cid, thread, ns, cid, thread)
    return (thread, 1, "bench-owner", ns, cid)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", default=os.environ.get("BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--only", default="")
    args = ap.parse_args(argv)
    name = f"fence14_guard_{os.getpid()}"
    with psycopg.connect(args.dsn, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    params = ci.conninfo_to_dict(args.dsn)
    params["dbname"] = name
    dsn = ci.make_conninfo(**params)
    try:
        with psycopg.connect(dsn, autocommit=True) as c:
            PostgresSaver(c).setup()
        with DurablePostgresSaver.from_conn_string(dsn) as s:
            s.setup()
        with psycopg.connect(dsn, autocommit=True) as c:
            for f in FUNCS.values():
                c.execute(f)
        vs = [v for v in variants() if not args.only or v in args.only.split(",")]
        if "floor" not in vs:
            vs.insert(0, "floor")
        conns = {v: psycopg.connect(dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row) for v in vs}
        threads = {v: f"bg-{v}-{uuid.uuid4().hex[:6]}" for v in vs}
        with psycopg.connect(dsn, autocommit=True) as c:
            for t in threads.values():
                c.execute(
                    "INSERT INTO durable_threads (thread_id, lease_owner, lease_token, lease_expires_at)"
                    " VALUES (%s, 'bench-owner', 1, now() + interval '1 hour')", (t,))
        parent: dict[str, str | None] = {v: None for v in vs}
        res: dict[str, dict[str, list[float]]] = {v: {"put": [], "pw": []} for v in vs}
        print(f"load before: {os.getloadavg()}")
        for i in range(args.calls + 50):
            order = vs[i % len(vs):] + vs[: i % len(vs)]
            for v in order:
                conn, t = conns[v], threads[v]
                cp = empty_checkpoint()
                cp["channel_values"] = {"n": i, "note": f"step {i}"}
                md = {"source": "loop", "step": i, "parents": {}}
                row = (t, "", cp["id"], parent[v], Jsonb(cp), Jsonb(md))
                t0 = time.perf_counter()
                with conn.pipeline(), conn.cursor(binary=True) as cur:
                    cur.execute(cp_sql(v), (*row, *guard_params(v, t, "", cp["id"])))
                dt = time.perf_counter() - t0
                parent[v] = cp["id"]
                task = str(uuid.uuid4())
                rows = [(t, "", cp["id"], task, "", k, ch, "msgpack", b"\x01")
                        for k, ch in enumerate(("n", "note"))]
                t0 = time.perf_counter()
                with conn.pipeline(), conn.cursor(binary=True) as cur:
                    cur.executemany(w_sql(v), [(*r, *guard_params(v, t, None, None)) for r in rows])
                dw = time.perf_counter() - t0
                if i >= 50:
                    res[v]["put"].append(dt * 1000)
                    res[v]["pw"].append(dw * 1000)
        print(f"load after: {os.getloadavg()}")
        fput = statistics.median(res["floor"]["put"])
        fpw = statistics.median(res["floor"]["pw"])
        print(f"{'':10} {'put min':>8} {'med':>7} {'p90':>7} {'x floor':>7}   {'pw min':>7} {'med':>7} {'p90':>7} {'x floor':>7}")
        for v in vs:
            p, w = res[v]["put"], res[v]["pw"]
            q = statistics.quantiles
            print(f"{v:10} {min(p):8.3f} {statistics.median(p):7.3f} {q(p, n=10)[-1]:7.3f} {statistics.median(p) / fput:7.2f}"
                  f"   {min(w):7.3f} {statistics.median(w):7.3f} {q(w, n=10)[-1]:7.3f} {statistics.median(w) / fpw:7.2f}")
        for c in conns.values():
            c.close()
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return 0


if __name__ == "__main__":
    sys.exit(main())
