"""The reconciliation-like workload of tests/test_granularity.py and
bench/bench_granularity.py (not a test module): fetch, 20 cheap transforms, one
model-like call with an ``@idempotent`` effect, 10 cheap steps, report.

Every node records its execution in ``gran_runs`` on its own autocommitted connection
(start, then end with its duration), so a parent can tell after a SIGKILL which
completed nodes were executed again; the effect inserts into ``gran_effects``.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import psycopg
from langgraph.graph import END, START, StateGraph

DDL = [
    "CREATE TABLE IF NOT EXISTS gran_runs (id BIGSERIAL PRIMARY KEY, thread_id TEXT, node TEXT, "
    "pid INTEGER, seconds DOUBLE PRECISION)",
    "CREATE TABLE IF NOT EXISTS gran_effects (id BIGSERIAL PRIMARY KEY, thread_id TEXT, amount INTEGER)",
]

TRANSFORMS = [f"transform_{i:02d}" for i in range(20)]
TAIL = [f"step_{i:02d}" for i in range(10)]
NODES = ["fetch", *TRANSFORMS, "model", *TAIL, "report"]


class State(TypedDict):
    log: Annotated[list[str], operator.add]
    total: int


def setup(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for stmt in DDL:
            conn.execute(stmt)


def build(
    dsn: str | None, *, cheap: float = 0.01, model: float = 0.2, log: bool = True, ledger: Any = None
) -> StateGraph:
    import os

    from langgraph.config import get_config

    from langgraph_durable import idempotent

    def record(node: str, seconds: float | None) -> None:
        if not log or dsn is None:
            return
        thread_id = get_config()["configurable"]["thread_id"]
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO gran_runs (thread_id, node, pid, seconds) VALUES (%s, %s, %s, %s)",
                (thread_id, node, os.getpid(), seconds),
            )

    @idempotent(ledger=ledger)
    def post_adjustment(amount: int) -> int:
        if dsn is not None:
            thread_id = get_config()["configurable"]["thread_id"]
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("INSERT INTO gran_effects (thread_id, amount) VALUES (%s, %s)", (thread_id, amount))
        return amount

    def node(name: str, seconds: float, effect: bool = False) -> Callable[[State], dict[str, Any]]:
        def run(state: State) -> dict[str, Any]:
            started = time.monotonic()
            record(name, None)
            time.sleep(seconds)
            if effect:
                post_adjustment(state["total"])
            record(name, time.monotonic() - started)
            return {"log": [name], "total": state["total"] + len(name)}

        return run

    builder = StateGraph(State)
    previous = START
    for name in NODES:
        builder.add_node(name, node(name, model if name == "model" else cheap, effect=name == "model"))
        builder.add_edge(previous, name)
        previous = name
    builder.add_edge(previous, END)
    return builder


def expected_final() -> dict[str, Any]:
    return {"log": list(NODES), "total": sum(len(n) for n in NODES)}
