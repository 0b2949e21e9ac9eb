"""Whole-thread deletes and the has_root trigger (issue 14): the checkpoints of N threads
deleted as delete_thread / prune(strategy="delete") / retain do it, the thread rows
locked first, then either (old order) the stock tables before the thread rows, or (new
order, DELETE_THREAD_ROWS_FIRST_SQL) the thread rows first. Every run is rolled back.
Runs against a database built by bench_scale.py --keep (its thread ids t00000001...).

    PYTHONPATH=$PWD python bench/bench_delete_order.py --dsn postgresql://.../bench_scale_100k [--threads 10000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import psycopg

from langgraph_durable.sql.checkpoints import DELETE_STOCK_THREADS_SQL, DELETE_THREADS_EXTRA_SQL
from langgraph_durable.sql.threads import DELETE_THREAD_ROWS_SQL, LOCK_THREADS_FOR_DELETE_SQL

TRIGGER_MS: list[float] = []


def run(conn: psycopg.Connection, ids: list[str], rows_first: bool, has_root: bool | None,
        trigger: bool = True) -> float:
    with conn.transaction(force_rollback=True):
        if not trigger:  # the floor: the same deletes without the has_root trigger
            conn.execute("ALTER TABLE checkpoints DISABLE TRIGGER durable_root_del")
        conn.execute("UPDATE durable_threads SET has_root = %s WHERE thread_id = ANY(%s)", (has_root, ids))
        for s in LOCK_THREADS_FOR_DELETE_SQL:
            conn.execute(s, (ids,))
        start = time.perf_counter()
        if rows_first:
            conn.execute(DELETE_THREAD_ROWS_SQL, (ids,))
        trig = 0.0
        for s in DELETE_STOCK_THREADS_SQL:
            # EXPLAIN ANALYZE runs the delete and names the trigger's own time.
            plan = [r[0] for r in conn.execute(psycopg.sql.SQL("EXPLAIN ANALYZE ") + s, (ids,))]
            for line in plan:
                if line.startswith("Trigger durable_root_del"):
                    trig += float(line.split("time=")[1].split()[0])
        for s in DELETE_THREADS_EXTRA_SQL:
            conn.execute(s, (ids,))
        TRIGGER_MS.append(trig)
        return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--threads", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    o = ap.parse_args()
    ids = [f"t{g:08d}" for g in range(1, o.threads + 1)]
    with psycopg.connect(o.dsn) as conn:
        run(conn, ids, False, None, trigger=False)
        times = [run(conn, ids, False, None, trigger=False) for _ in range(o.repeat)]
        print(f"{'trigger disabled':<40} {statistics.median(times) * 1000:8.1f} ms", flush=True)
        for has_root in (None, True):
            for rows_first in (False, True):
                run(conn, ids, rows_first, has_root)  # warm
                TRIGGER_MS.clear()
                times = [run(conn, ids, rows_first, has_root) for _ in range(o.repeat)]
                label = "thread rows first" if rows_first else "stock tables first (old)"
                print(f"has_root={has_root!s:<5} {label:<28} {statistics.median(times) * 1000:8.1f} ms (trigger {statistics.median(TRIGGER_MS):7.1f} ms)", flush=True)


if __name__ == "__main__":
    main()
