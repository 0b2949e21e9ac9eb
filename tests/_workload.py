"""One application's worth of work, run as a given role / through a given pooler: a
leased graph with a plain and a transactional ``@idempotent`` effect, a submitted
thread recovered by a worker, retention and GC. Shared by test_roles.py and
test_pgbouncer.py."""

from __future__ import annotations

import uuid
from typing import Any, TypedDict

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph

from langgraph_durable import DurablePostgresSaver, idempotent
from langgraph_durable.ops.retention import gc, retain
from langgraph_durable.recovery import recover, submit

EFFECTS_DDL = "CREATE TABLE IF NOT EXISTS wl_effects (k TEXT PRIMARY KEY, n INT NOT NULL)"


class S(TypedDict):
    n: int
    paid: str
    booked: str


def run_workload(dsn: str, *, schema: str | None = None, **saver_kw: Any) -> dict[str, Any]:
    """Runs everything; returns the figures the caller asserts on. ``wl_effects`` must
    exist (``EFFECTS_DDL``) and be writable by the role of ``dsn``."""
    run = uuid.uuid4().hex[:8]
    calls = {"pay": 0}
    out: dict[str, Any] = {}
    with DurablePostgresSaver.from_conn_string(dsn, schema=schema, **saver_kw) as saver:
        saver.setup()

        @idempotent(ledger=saver, key=lambda tid: f"pay:{tid}")
        def pay(tid: str) -> str:
            calls["pay"] += 1
            return f"paid {tid}"

        @idempotent(ledger=saver, key=lambda tid: f"book:{tid}", transactional=True)
        def book(conn: psycopg.Connection[Any], tid: str) -> str:
            conn.execute(
                "INSERT INTO wl_effects (k, n) VALUES (%s, 1) "
                "ON CONFLICT (k) DO UPDATE SET n = wl_effects.n + 1",
                (tid,),
            )
            return f"booked {tid}"

        def step(s: S) -> dict[str, Any]:
            return {"n": s["n"] + 1}

        def charge(s: S, config: RunnableConfig) -> dict[str, Any]:
            tid = config["configurable"]["thread_id"]
            return {"paid": pay(tid), "booked": book(tid)}

        b = StateGraph(S)
        b.add_node("a", step)
        b.add_node("charge", charge)
        b.add_node("c", step)
        b.add_edge(START, "a")
        b.add_edge("a", "charge")
        b.add_edge("charge", "c")
        b.add_edge("c", END)
        graph = b.compile(checkpointer=saver)
        tids = [f"wl-{run}-{i}" for i in range(3)]
        results = [
            graph.invoke({"n": 0, "paid": "", "booked": ""}, {"configurable": {"thread_id": t}})
            for t in tids
        ]
        # Once more: a finished thread's effects are not repeated (ledger hits).
        for t in tids:
            assert pay(t) == f"paid {t}" and book(t) == f"booked {t}"
        queued = f"wl-{run}-queued"
        submit(graph, {"n": 10, "paid": "", "booked": ""}, {"configurable": {"thread_id": queued}})
        stats = recover(graph)
        queued_state = graph.get_state({"configurable": {"thread_id": queued}}).values
        with saver.connection() as conn:
            conn.execute("SELECT 1")  # the package's connection() serves user SQL too
        report = retain(saver, older_than_days=0)
        gc_report = gc(saver, grace=0)
        with saver.connection() as conn, conn.transaction():
            effects = conn.execute(
                "SELECT k, n FROM wl_effects WHERE k = ANY(%s)", ([*tids, queued],)
            ).fetchall()
        out.update(
            results=results, pay_calls=calls["pay"], worker=stats, queued=queued_state,
            retained=report, gc=gc_report, threads=tids, queued_thread=queued,
            effects={(r["k"] if isinstance(r, dict) else r[0]): (r["n"] if isinstance(r, dict) else r[1]) for r in effects},
        )
    return out


def check_workload(out: dict[str, Any]) -> None:
    tids = out["threads"]
    for t, r in zip(tids, out["results"], strict=True):
        assert r == {"n": 2, "paid": f"paid {t}", "booked": f"booked {t}"}, r
    assert out["worker"].claimed == 1 and out["worker"].outcomes, out["worker"]
    q = out["queued_thread"]
    assert out["queued"] == {"n": 12, "paid": f"paid {q}", "booked": f"booked {q}"}
    assert out["pay_calls"] == 4  # 3 threads + the queued one, never repeated
    assert out["effects"] == {t: 1 for t in [*tids, q]}
    assert out["retained"].threads_deleted >= 4, out["retained"]
