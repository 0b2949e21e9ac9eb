"""Operator console view times at scale (issue 17).

A throwaway database is built as bench/bench_scale.py builds it (a real 3-step run
copied ``generate_series`` times: 90% done, 4% waiting, 2% error, 2% stopped, 1%
running with a live lease, 1% quarantined), plus: two graph versions (half the
threads each), a quarantine record for every quarantined thread, and 200 ledger calls
with an unknown outcome. Then every view of the console is fetched in-process
(starlette's TestClient: routing, the SQL, the templates) ``--repeat`` times and the
median printed; the console's own threads query (graph version / age filters) is
EXPLAINed to show it walks an index.

    PYTHONPATH=$PWD python bench/bench_console.py [--size 100k] [--repeat 5] [--keep]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_scale

from langgraph_durable import DurablePostgresSaver
from langgraph_durable.sql import console as q

VIEWS = [
    ("overview", "/"),
    ("threads p1 (natural order)", "/threads"),
    ("threads p1 (byte order, sort=id)", "/threads?sort=id"),
    ("threads p100 (after=)", "/threads?after=t00005000"),
    ("threads state=quarantined", "/threads?state=quarantined"),
    ("threads version=v1", "/threads?version=v1"),
    ("threads version=v1 idle>1h", "/threads?version=v1&older_than_h=1"),
    ("threads prefix (10% of threads)", "/threads?prefix=t0004"),
    ("threads prefix (every thread)", "/threads?prefix=t"),
    ("threads prefix, byte order", "/threads?prefix=t0004&sort=id"),
    ("thread detail", "/thread?id=t00004242"),
    ("thread diff", "/thread?id=t00004242&a=latest~1&b=latest"),
    ("thread conversation (2000 msgs)", "/thread?id=conv-bench"),
    ("thread conversation diff", "/thread?id=conv-bench&a=latest~1&b=latest"),
    ("quarantine", "/quarantine"),
    ("ledger (unknown)", "/ledger"),
    ("versions", "/versions"),
    ("versions (exact)", "/versions?exact=1"),
    ("storage (no dedup)", "/storage?dedup=0"),
    ("storage (dedup)", "/storage"),
    ("storage largest threads", "/storage?dedup=0&largest=1"),
    ("storage retention dry-run", "/storage?dedup=0&dry_run=1&older_than_days=0.5"),
    ("audit", "/audit"),
]

# The decisions' confirmation pages (issue 25), signed in; {stopped} etc. are filled
# with a thread of that state once the database is built.
DECISION_VIEWS = [
    ("confirm resume", "/confirm/resume?thread={stopped}"),
    ("confirm answer", "/confirm/answer?thread=ask-bench&value=%22yes%22"),
    ("confirm cancel", "/confirm/cancel?thread={running}"),
    ("confirm fork", "/confirm/fork?thread={done}&cp=latest"),
    ("confirm delete", "/confirm/delete?thread={done}"),
    ("confirm rewind", "/confirm/rewind?thread={quarantined}&to=latest~1"),
    ("thread detail (decide panel)", "/thread?id={waiting}"),
]
WORKERS = 50  # registered workers (ten of them dead), for the overview and versions pages


def extras(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE durable_threads SET graph_version = CASE WHEN right(thread_id, 1) IN "
            "('0','1','2','3','4') THEN 'v1' ELSE 'v2' END"
        )
        conn.execute(
            """INSERT INTO durable_quarantine (thread_id, checkpoint_id, attempts, last_error,
                                               graph_version, reason)
               SELECT t.thread_id,
                      (SELECT max(c.checkpoint_id) FROM checkpoints c WHERE c.thread_id = t.thread_id),
                      3, 'ValueError: bench', t.graph_version, 'max_attempts'
               FROM durable_threads t WHERE t.status = 'quarantined' ON CONFLICT DO NOTHING"""
        )
        conn.execute(
            """INSERT INTO durable_ledger (key, fingerprint, status, name, thread_id, owner,
                                           claim_expires_at)
               SELECT 'bench-key-' || g, 'fp', 'started', 'charge', 't' || lpad(g::text, 8, '0'),
                      'dead-worker', now() - interval '1 hour'
               FROM generate_series(1, 200) g"""
        )
        conn.execute("VACUUM ANALYZE")


CONV_TURNS = 500  # x4 messages: human, AI with a tool call, tool result, AI answer


def conversation(saver: DurablePostgresSaver) -> None:
    """A real run writing a 2000-message conversation (500 tool calls) to thread
    ``conv-bench``, and a ledger row for each call keyed as an @idempotent tool keys
    it (issue 25: the transcript view links every call to its row)."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langgraph.graph import END, START, MessagesState, StateGraph

    from langgraph_durable.idempotency.keys import tool_key

    msgs: list[object] = []
    for i in range(CONV_TURNS):
        cid = f"call_{i}"
        msgs += [
            HumanMessage(f"question {i} " + "x" * 200),
            AIMessage("", tool_calls=[{"id": cid, "name": "lookup", "args": {"q": i}}]),
            ToolMessage("result " * 150, tool_call_id=cid),
            AIMessage(f"answer {i}"),
        ]
    b = StateGraph(MessagesState)
    b.add_node("tools", lambda s: {"messages": [AIMessage("done")]})
    b.add_edge(START, "tools")
    b.add_edge("tools", END)
    g = b.compile(checkpointer=saver.bind(graph_version="conv"))
    g.invoke({"messages": msgs}, {"configurable": {"thread_id": "conv-bench"}})
    task = "00000000-0000-0000-0000-000000000000"
    with saver.connection() as conn:
        conn.execute(
            """INSERT INTO durable_ledger (key, fingerprint, status, name, thread_id, task_id,
                                           owner, result_type, result)
               SELECT k, 'fp', 'completed', 'lookup', 'conv-bench', %s, 'bench', 'json', '"ok"'
               FROM unnest(%s::text[]) k ON CONFLICT DO NOTHING""",
            (task, [tool_key("conv-bench", f"tools:{task}", task, f"call_{i}")
                    for i in range(CONV_TURNS)]),
        )


def asking(saver: DurablePostgresSaver) -> None:
    """A real thread waiting on an interrupt (``ask-bench``), for the answer's page."""
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt

    from langgraph_durable.ops import inspection as lgi

    try:
        if lgi.show_thread(saver, "ask-bench").get("interrupts"):
            return
    except LookupError:
        pass
    b: StateGraph = StateGraph(dict)
    b.add_node("confirm", lambda s: {"ok": interrupt({"question": "ship it?"})})
    b.add_edge(START, "confirm")
    b.add_edge("confirm", END)
    g = b.compile(checkpointer=saver.bind(graph_version="v1"))
    g.invoke({"ok": None}, {"configurable": {"thread_id": "ask-bench"}})


def samples(saver: DurablePostgresSaver) -> dict[str, str]:
    """One of the 100k threads of each state the decisions need (not conv-bench)."""
    from langgraph_durable.ops import inspection as lgi

    out = {}
    for state in ("stopped", "waiting", "running", "done", "quarantined"):
        rows = lgi.list_threads(saver, status=state, prefix="t0", limit=1)
        out[state] = rows[0]["thread_id"] if rows else "none"
    return out


def register_workers(saver: DurablePostgresSaver, n: int) -> None:
    """``n`` registered workers serving v1 or v2, the last fifth dead (no heartbeat for
    an hour); the rows RecoveryWorker.run writes (sql.workers.WORKER_REGISTER_SQL)."""
    with saver.connection() as conn:
        conn.execute("DELETE FROM durable_workers WHERE host = 'bench-host'")
        conn.execute(
            """INSERT INTO durable_workers (worker_id, name, host, pid, identity, ttl_s, versions,
                                            graph_names, concurrency, claimed, started_at,
                                            heartbeat_at, last_poll_at)
               SELECT md5(g::text), 'bench-host:' || (1000 + g), 'bench-host', 1000 + g,
                      'bench-host:' || (1000 + g), 30,
                      ARRAY[CASE WHEN g %% 2 = 0 THEN 'v1' ELSE 'v2' END], ARRAY['bench'], 8,
                      g %% 3, now() - interval '1 hour',
                      now() - CASE WHEN g > %s THEN interval '1 hour' ELSE interval '1 second' END,
                      now() - interval '1 second'
               FROM generate_series(1, %s) g""",
            (n - n // 5, n),
        )


def explain(dsn: str) -> list[str]:
    out = []
    cases = {
        "version=v1": {"version": "v1"},
        "version=v1, idle>1h": {"version": "v1", "older": 3600.0},
    }
    with psycopg.connect(dsn) as conn:
        for name, extra in cases.items():
            params = {
                "after": None, "prefix": None, "version": None, "older": None, "newer": None,
                "status": None, "limit": 51, "dead": [], **extra,
            }
            rows = conn.execute(
                psycopg.sql.Composed([psycopg.sql.SQL("EXPLAIN (ANALYZE, BUFFERS) "), q.THREADS_SQL]),
                params,
            ).fetchall()
            out.append(f"-- console threads query, {name}")
            out.extend(r[0] for r in rows)
        natural = {
            "natural order, page 1": {},
            "natural order, after t00050000": {"after": "t00050000"},
            "natural order, prefix t0004 (10% of threads)": {"prefix": "t0004"},
        }
        for name, extra in natural.items():
            params = {
                "after": None, "prefix": None, "version": None, "older": None, "newer": None,
                "status": None, "limit": 51, "dead": [], **extra,
            }
            rows = conn.execute(
                psycopg.sql.Composed([psycopg.sql.SQL("EXPLAIN (ANALYZE, BUFFERS) "), q.THREADS_NATURAL_SQL]),
                params,
            ).fetchall()
            out.append(f"-- console threads query, {name}")
            out.extend(r[0] for r in rows)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn", default=bench_scale.DEFAULT_DSN)
    ap.add_argument("--size", default="100k", choices=sorted(bench_scale.SIZES))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--keep", action="store_true", help="keep (and reuse) the database")
    args = ap.parse_args(argv)
    n = bench_scale.SIZES[args.size]
    from starlette.testclient import TestClient

    from langgraph_durable.console import create_app

    with bench_scale.database(args.dsn, f"lgd_bench_console_{args.size}", args.keep, args.keep) as (dsn, reused):
        if not reused:
            built = bench_scale.build(dsn, n)
            extras(dsn)
            print(f"built {n} threads in {built:.1f} s")
        with DurablePostgresSaver.from_conn_string(dsn) as saver:
            saver.setup()
            if not reused:
                conversation(saver)
            asking(saver)
            register_workers(saver, WORKERS)
            picks = samples(saver)
            app = create_app(saver, sample_interval=0, allow_actions=True, token="bench")
            with TestClient(app) as client:
                client.post("/login", data={"name": "bench", "token": "bench"})
                views = VIEWS + [(n, v.format(**picks)) for n, v in DECISION_VIEWS]
                print(f"{'view':34} {'median ms':>10} {'max ms':>8}  status")
                for name, path in views:
                    times = []
                    status = 0
                    for _ in range(args.repeat):
                        start = time.perf_counter()
                        r = client.get(path)
                        times.append((time.perf_counter() - start) * 1000)
                        status = r.status_code
                    print(f"{name:34} {statistics.median(times):10.1f} {max(times):8.1f}  {status}")
        for line in explain(dsn):
            print(line)


if __name__ == "__main__":
    main()
