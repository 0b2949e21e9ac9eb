"""Checkpoint granularity benchmark (issue 16), modelled on the reference's
reconciliation: fetch, 20 cheap transforms, one 200 ms model-like call with an
``@idempotent`` effect, 10 cheap steps, report.

For stock PostgresSaver (durability "sync" and "async") and DurablePostgresSaver with
and without ``checkpoint_policy=ReworkBudget(1.0)``: checkpoint rows and write rows per
run, bytes stored (checkpoints + blobs + writes), wall time. Then KILLS random
SIGKILLs of a child running the policy: the mean completed work re-executed on resume.

    PYTHONPATH=. python bench/bench_granularity.py [DSN] [--runs 3] [--kills 8]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

import psycopg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from _gran_workload import build, expected_final, setup  # noqa: E402

SIZE_SQL = """
SELECT
  (SELECT count(*) FROM checkpoints WHERE thread_id = %(t)s) AS checkpoints,
  (SELECT count(*) FROM checkpoint_writes WHERE thread_id = %(t)s) AS writes,
  (SELECT coalesce(sum(pg_column_size(c.*)), 0) FROM checkpoints c WHERE thread_id = %(t)s)
  + (SELECT coalesce(sum(pg_column_size(b.*)), 0) FROM checkpoint_blobs b WHERE thread_id = %(t)s)
  + (SELECT coalesce(sum(pg_column_size(w.*)), 0) FROM checkpoint_writes w WHERE thread_id = %(t)s) AS bytes
"""


def _measure(dsn: str, thread: str) -> dict[str, Any]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(SIZE_SQL, {"t": thread}).fetchone()
    assert row is not None
    return {"checkpoints": int(row[0]), "writes": int(row[1]), "bytes": int(row[2])}


def run_variant(dsn: str, name: str, runs: int) -> dict[str, Any]:
    from langgraph.checkpoint.postgres import PostgresSaver

    from langgraph_durable import DurablePostgresSaver, ReworkBudget

    stats: list[dict[str, Any]] = []
    for _ in range(runs):
        thread = f"bench-{name}-{uuid.uuid4()}"
        durability = "async" if name.endswith("async") else "sync"
        if name.startswith("stock"):
            cm: Any = PostgresSaver.from_conn_string(dsn)
        else:
            policy = ReworkBudget(seconds=1.0) if "policy" in name else "always"
            cm = DurablePostgresSaver.from_conn_string(dsn, checkpoint_policy=policy)
        with cm as saver, DurablePostgresSaver.from_conn_string(dsn) as ledger:
            # The stock saver is no ledger: the effect is recorded through a durable one.
            graph = build(dsn, log=False, ledger=ledger if name.startswith("stock") else None).compile(
                checkpointer=saver
            )
            started = time.perf_counter()
            out = graph.invoke({"log": [], "total": 0}, {"configurable": {"thread_id": thread}}, durability=durability)
            wall = time.perf_counter() - started
        assert out == expected_final(), out
        stats.append({**_measure(dsn, thread), "wall": wall})
    return {
        "variant": name,
        "checkpoints": statistics.mean(s["checkpoints"] for s in stats),
        "writes": statistics.mean(s["writes"] for s in stats),
        "bytes": statistics.mean(s["bytes"] for s in stats),
        "wall_s": statistics.median(s["wall"] for s in stats),
    }


def kills(dsn: str, n: int) -> list[float]:
    child = os.path.join(ROOT, "tests", "_child_granularity.py")
    rng = random.Random(7)
    reworks: list[float] = []
    for i in range(n):
        thread = f"bench-kill-{i}-{uuid.uuid4()}"
        for kill_after in (rng.uniform(0.1, 1.3), None):
            proc = subprocess.Popen([sys.executable, child, dsn, thread, "1.0"], stdout=subprocess.PIPE, text=True)
            assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
            if kill_after is not None:
                time.sleep(kill_after)
                proc.kill()
                proc.wait()
            else:
                assert json.loads(proc.stdout.read().strip().splitlines()[-1]) == expected_final()
                proc.wait()
        with psycopg.connect(dsn) as conn:
            rows = conn.execute(
                "SELECT node, pid, seconds FROM gran_runs WHERE thread_id = %s AND seconds IS NOT NULL ORDER BY id",
                (thread,),
            ).fetchall()
            effects = conn.execute("SELECT count(*) FROM gran_effects WHERE thread_id = %s", (thread,)).fetchone()
        assert effects is not None and effects[0] == 1, effects
        pids = list(dict.fromkeys(r[1] for r in rows))
        if len(pids) == 2:
            done = {r[0]: r[2] for r in rows if r[1] == pids[0]}
            again = {r[0] for r in rows if r[1] == pids[1]}
            reworks.append(sum(s for node, s in done.items() if node in again))
        else:
            reworks.append(0.0)
    return reworks


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dsn", nargs="?", default=os.environ.get("LANGGRAPH_DURABLE_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--kills", type=int, default=8)
    args = parser.parse_args()
    from langgraph.checkpoint.postgres import PostgresSaver

    from langgraph_durable import DurablePostgresSaver

    setup(args.dsn)
    with PostgresSaver.from_conn_string(args.dsn) as stock:
        stock.setup()
    with DurablePostgresSaver.from_conn_string(args.dsn) as saver:
        saver.setup()
    results = [
        run_variant(args.dsn, name, args.runs)
        for name in ("stock-sync", "stock-async", "durable-sync", "durable-async", "durable-policy-sync", "durable-policy-async")
    ]
    print(f"{'variant':24} {'checkpoints':>11} {'writes':>7} {'bytes':>9} {'wall s':>7}")
    for r in results:
        print(f"{r['variant']:24} {r['checkpoints']:11.1f} {r['writes']:7.1f} {r['bytes']:9.0f} {r['wall_s']:7.3f}")
    reworks = kills(args.dsn, args.kills)
    print(f"re-executed seconds after {len(reworks)} random kills (budget 1.0 s): mean "
          f"{statistics.mean(reworks):.3f}, max {max(reworks):.3f}")
    out = {"results": results, "reworks": reworks}
    with open(os.path.join(ROOT, "bench", "granularity_results.json"), "w") as fh:
        json.dump(out, fh, indent=2)


if __name__ == "__main__":
    main()
