"""What the cancel check (issue 25) costs a run's put, side by side in ONE run on the
same connection, taking turns call by call, with the stock ``UPSERT_CHECKPOINTS_SQL`` as
the floor. Each call is one statement, one round trip, its rows fetched as the saver
fetches them:

* ``no cancel check``: the lease guard alone (what a put sent before issue 25);
* ``RETURNING probe``: issue 25's first form, a second probe of the thread row in
  RETURNING, its row fetched;
* ``rowcount (package)``: the package's put (``sql.checkpoints._LEASE_PUT_PROBE``): the
  lease and the cancel flag from one probe, the argument of the guard's CASE, a cancel
  read from the rowcount.

Run: ``python bench/bench_cancel_probe.py [--dsn postgresql://...] [--calls 2000]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from typing import Any

import psycopg
from langgraph.checkpoint.postgres.base import BasePostgresSaver
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from langgraph_durable import DurablePostgresSaver
from langgraph_durable.sql.checkpoints import (
    _UPSERT_CHECKPOINT,
    GUARDED_UPSERT_CHECKPOINT_SQL,
    _guard,
    guard_params,
)

# Issue 25's probe, as it was (two parameters: the run's token, the thread).
RETURNING_PROBE = """RETURNING (SELECT d.cancel_token = %s::bigint FROM durable_threads d
                        WHERE d.thread_id = %s) AS cancel
"""

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", default=os.environ.get("BENCH_DSN", DEFAULT_DSN))
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    with DurablePostgresSaver.from_conn_string(args.dsn) as saver:
        saver.setup()
    plain = _UPSERT_CHECKPOINT.format(guard=_guard("lease", True))
    texts = {
        "floor (stock upsert)": BasePostgresSaver.UPSERT_CHECKPOINTS_SQL,
        "no cancel check": plain,
        "RETURNING probe": plain + RETURNING_PROBE,
        "rowcount (package)": GUARDED_UPSERT_CHECKPOINT_SQL["lease"],
    }
    thread = f"bench-probe-{uuid.uuid4().hex[:8]}"
    times: dict[str, list[float]] = {name: [] for name in texts}
    with psycopg.connect(args.dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row) as conn:
        conn.execute(
            "INSERT INTO durable_threads (thread_id, status, lease_owner, lease_token, lease_expires_at) "
            "VALUES (%s, 'running', 'me', 1, now() + interval '1 hour')", (thread,),
        )
        load = os.getloadavg()
        for i in range(args.calls):
            for name, sql in texts.items():
                cid = _uuid6()
                params: tuple[Any, ...] = (thread, "", cid, None, Jsonb({"v": 4, "id": cid}), Jsonb({"step": i}))
                if name.startswith("rowcount"):
                    params = (*params, *guard_params("lease", thread, 1, "me", "", cid))
                elif not name.startswith("floor"):
                    # The older forms' order: the lease probe's, the failure's, the order check's.
                    params = (*params, 1, "me", thread, thread, 1, thread, "", cid, cid, thread, "", cid)
                if name == "RETURNING probe":
                    params = (*params, 1, thread)
                started = time.perf_counter()
                cur = conn.execute(sql, params)
                if name == "RETURNING probe":
                    cur.fetchall()
                elif name.startswith("rowcount"):
                    assert cur.rowcount == 1, cur.rowcount  # 0: cancelled
                times[name].append((time.perf_counter() - started) * 1000)
        conn.execute("DELETE FROM checkpoints WHERE thread_id = %s", (thread,))
        conn.execute("DELETE FROM durable_threads WHERE thread_id = %s", (thread,))
    print(f"load average before: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} ({os.cpu_count()} cpus)")
    print(f"{args.calls} calls each, taking turns; median and p90 ms per put")
    base = statistics.median(times["floor (stock upsert)"])
    for name, samples in times.items():
        med = statistics.median(samples)
        p90 = statistics.quantiles(samples, n=10)[-1]
        print(f"{name:22} {med:7.3f}  p90 {p90:7.3f}  x floor {med / base:5.2f}")


def _uuid6() -> str:
    from langgraph.checkpoint.base.id import uuid6

    return str(uuid6())


if __name__ == "__main__":
    main()
