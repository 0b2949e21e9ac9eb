"""Whole-thread deletes and the has_root trigger (issue 14): the checkpoints of N threads
deleted as delete_thread / prune(strategy="delete") / retain do it, the thread rows
locked first, then either (old order) the stock tables before the thread rows, or (new
order, DELETE_THREAD_ROWS_FIRST_SQL) the thread rows first. Every run is rolled back.
Runs against a database built by bench_scale.py --keep (its thread ids t00000001...).

Each case is run three ways, alternating in one process so load hits all of them: with
the trigger disabled (the floor), with the previous durable_unroot (the first MIGRATIONS
entry defining it, installed inside the rolled-back transaction), and with the installed
one. durable_threads is vacuumed before every run: each run's has_root UPDATE leaves 10k
dead versions, and without autovacuum keeping up the primary-key probes walk them (a pass
took 23-30 ms with 1M dead tuples, 6-12 ms vacuumed), which is the bench, not the trigger.

    PYTHONPATH=$PWD python bench/bench_delete_order.py --dsn postgresql://.../bench_scale_100k [--threads 10000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import psycopg

from langgraph_durable.sql.checkpoints import DELETE_STOCK_THREADS_SQL, DELETE_THREADS_EXTRA_SQL
from langgraph_durable.sql.schema import MIGRATIONS
from langgraph_durable.sql.threads import DELETE_THREAD_ROWS_SQL, LOCK_THREADS_FOR_DELETE_SQL

# The first definition of durable_unroot (a DO block with its triggers): "previous".
PREVIOUS_UNROOT = next(m for m in MIGRATIONS if "CREATE OR REPLACE FUNCTION durable_unroot" in m)
MODES = ("off", "previous", "current")


def run(conn: psycopg.Connection, ids: list[str], rows_first: bool, has_root: bool | None,
        mode: str) -> tuple[float, float]:
    """(whole delete s, trigger ms) of one rolled-back whole-thread delete."""
    with conn.transaction(force_rollback=True):
        if mode == "off":  # the floor: the same deletes without the has_root trigger
            conn.execute("ALTER TABLE checkpoints DISABLE TRIGGER durable_root_del")
        elif mode == "previous":
            conn.execute(PREVIOUS_UNROOT)
        conn.execute("UPDATE durable_threads SET has_root = %s WHERE thread_id = ANY(%s)", (has_root, ids))
        for s in LOCK_THREADS_FOR_DELETE_SQL:
            conn.execute(s, (ids,))
        start = time.perf_counter()
        if rows_first:
            conn.execute(DELETE_THREAD_ROWS_SQL, (ids,))
        trig = 0.0
        for stmt in DELETE_STOCK_THREADS_SQL:
            # EXPLAIN ANALYZE runs the delete and names the trigger's own time.
            plan = [r[0] for r in conn.execute(psycopg.sql.SQL("EXPLAIN ANALYZE {}").format(stmt), (ids,))]
            for line in plan:
                if line.startswith("Trigger durable_root_del"):
                    trig += float(line.split("time=")[1].split()[0])
        for stmt in DELETE_THREADS_EXTRA_SQL:
            conn.execute(stmt, (ids,))
        return time.perf_counter() - start, trig


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", required=True)
    ap.add_argument("--threads", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    o = ap.parse_args()
    ids = [f"t{g:08d}" for g in range(1, o.threads + 1)]
    with psycopg.connect(o.dsn) as conn, psycopg.connect(o.dsn, autocommit=True) as vac:
        n_cp = conn.execute("SELECT count(*) FROM checkpoints WHERE thread_id = ANY(%s)", (ids,)).fetchone()
        conn.rollback()
        print(f"# {o.threads} threads, {n_cp[0] if n_cp else '?'} checkpoints, median of {o.repeat}; "
              "whole delete ms (trigger off / previous / current), trigger ms (previous / current)")
        for has_root in (None, True):
            for rows_first in (False, True):
                res: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
                for m in MODES:
                    run(conn, ids, rows_first, has_root, m)  # warm
                for _ in range(o.repeat):
                    for m in MODES:
                        vac.execute("VACUUM durable_threads")
                        res[m].append(run(conn, ids, rows_first, has_root, m))
                whole = {m: statistics.median(r[0] for r in res[m]) * 1000 for m in MODES}
                trig = {m: statistics.median(r[1] for r in res[m]) for m in MODES}
                label = "thread rows first" if rows_first else "stock tables first"
                print(f"has_root={has_root!s:<5} {label:<19} whole {whole['off']:7.1f} / {whole['previous']:7.1f}"
                      f" / {whole['current']:7.1f} ms   trigger {trig['previous']:6.1f} / {trig['current']:6.1f} ms",
                      flush=True)


if __name__ == "__main__":
    main()
