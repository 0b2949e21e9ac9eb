"""Large values: the package vs the stock saver, side by side (issue 14, problem 3).

For each size (5 MB and 50 MB of text by default) and each saver, in a database of its
own on the same PostgreSQL:

* ``put_writes``: one task write carrying the value;
* ``put``: a checkpoint whose channel holds the value;
* ``step``: both at once from two threads, as LangGraph runs a step's writes and its
  checkpoint (the package must compress and send the shared artifact once);
* the table bytes after the runs (``pg_total_relation_size``), and for the package the
  artifact table's size against the compressed bytes it holds.

Medians of ``--reps`` runs, each with a fresh value (no dedup between runs).

    PYTHONPATH=$PWD python bench/bench_big_values.py [--dsn ...] [--sizes 5,50] [--reps 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.postgres import PostgresSaver
from psycopg import conninfo as ci

from langgraph_durable import DurablePostgresSaver

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
_WORDS = [
    "".join(random.Random(i).choices("abcdefghijklmnopqrstuvwxyz", k=random.Random(i).randint(2, 10)))
    for i in range(5000)
]


def text_value(mb: float, seed: int) -> str:
    """~``mb`` MB of word soup (compresses ~2.5x with zstd, like prose or JSON)."""
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    target = int(mb * 1_000_000)
    while size < target:
        chunk = " ".join(rng.choices(_WORDS, k=2000))
        out.append(chunk)
        size += len(chunk) + 1
    return "\n".join(out)[:target]


@contextmanager
def database(admin: str, name: str) -> Iterator[str]:
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield ci.make_conninfo(admin, dbname=name)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _cfg(thread: str, checkpoint_id: str | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
    if checkpoint_id:
        c["checkpoint_id"] = checkpoint_id
    return {"configurable": c}


def _checkpoint(saver: Any, values: dict[str, Any]) -> Any:
    cp = empty_checkpoint()
    cp["channel_values"] = values
    cp["channel_versions"] = {k: saver.get_next_version(None, None) for k in values}
    return cp


_MD: Any = {"source": "loop", "step": 1, "parents": {}}


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run_saver(saver: Any, mb: float, reps: int, seed: int) -> dict[str, float]:
    w_times: list[float] = []
    p_times: list[float] = []
    s_times: list[float] = []
    for rep in range(reps):
        w, p, st = _one_rep(saver, mb, seed * 1000 + rep * 10)
        w_times.append(w)
        p_times.append(p)
        s_times.append(st)
    return {
        "put_writes": statistics.median(w_times),
        "put": statistics.median(p_times),
        "step": statistics.median(s_times),
    }


def _one_rep(saver: Any, mb: float, base: int) -> tuple[float, float, float]:
    if True:
        thread = f"big-{uuid.uuid4().hex[:8]}"
        root = saver.put(_cfg(thread), _checkpoint(saver, {"n": 0}), _MD, {})
        cid = root["configurable"]["checkpoint_id"]
        value = text_value(mb, base + 1)
        w_time = _timed(lambda: saver.put_writes(_cfg(thread, cid), [("doc", value)], "task-w"))
        value = text_value(mb, base + 2)
        cp = _checkpoint(saver, {"doc": value})
        p_time = _timed(lambda: saver.put(_cfg(thread, cid), cp, _MD, cp["channel_versions"]))
        # The step: the task's write and the next checkpoint, concurrently, same value.
        value = text_value(mb, base + 3)
        cp = _checkpoint(saver, {"doc": value})
        errors: list[BaseException] = []

        def guard(fn: Callable[[], Any]) -> Callable[[], None]:
            def run() -> None:
                try:
                    fn()
                except BaseException as exc:
                    errors.append(exc)

            return run

        threads = [
            threading.Thread(target=guard(lambda: saver.put_writes(_cfg(thread, cid), [("doc", value)], "task-s"))),
            threading.Thread(target=guard(lambda: saver.put(_cfg(thread, cid), cp, _MD, cp["channel_versions"]))),
        ]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        s_time = time.perf_counter() - start
        if errors:
            raise errors[0]
    return w_time, p_time, s_time


def sizes(dsn: str, durable: bool) -> dict[str, float]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM")
        total = conn.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind = 'r' AND n.nspname = 'public'"
        ).fetchone()[0]  # type: ignore[index]
        out = {"total": float(total)}
        if durable:
            table, held = conn.execute(
                "SELECT pg_total_relation_size('durable_artifacts'), "
                "coalesce(sum(octet_length(data)), 0) FROM durable_artifacts"
            ).fetchone()  # type: ignore[misc]
            out["artifacts_table"] = float(table)
            out["artifacts_bytes"] = float(held)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="an admin DSN (databases are created)")
    parser.add_argument("--sizes", default="5,50", help="value sizes in MB, comma-separated")
    parser.add_argument("--reps", type=int, default=3)
    opts = parser.parse_args()
    mbs = [float(s) for s in opts.sizes.split(",")]
    results: dict[tuple[str, float], dict[str, float]] = {}
    for i, mb in enumerate(mbs):
        for name in ("stock", "durable"):
            with database(opts.dsn, f"bench_big_{name}") as dsn:
                if name == "stock":
                    with PostgresSaver.from_conn_string(dsn) as saver:
                        saver.setup()
                        res = run_saver(saver, mb, opts.reps, i)
                else:
                    with DurablePostgresSaver.from_conn_string(dsn) as saver:
                        saver.setup()
                        res = run_saver(saver, mb, opts.reps, i)
                res.update(sizes(dsn, name == "durable"))
                results[(name, mb)] = res
    print(f"{'size':>6} {'metric':<22} {'stock':>12} {'durable':>12} {'ratio':>7}")
    for mb in mbs:
        s, d = results[("stock", mb)], results[("durable", mb)]
        for key in ("put_writes", "put", "step"):
            print(
                f"{mb:>4.0f}MB {key + ' (ms)':<22} {s[key] * 1000:>12.1f} {d[key] * 1000:>12.1f} "
                f"{d[key] / s[key]:>6.2f}x"
            )
        print(f"{mb:>4.0f}MB {'tables (MB)':<22} {s['total'] / 1e6:>12.1f} {d['total'] / 1e6:>12.1f} "
              f"{d['total'] / s['total']:>6.2f}x")
        print(
            f"{mb:>4.0f}MB {'artifact table/bytes':<22} {'':>12} "
            f"{d['artifacts_table'] / 1e6:>7.1f}/{d['artifacts_bytes'] / 1e6:.1f} "
            f"{d['artifacts_table'] / max(d['artifacts_bytes'], 1):>6.2f}x"
        )


if __name__ == "__main__":
    main()
