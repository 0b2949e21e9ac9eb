"""Child processes and the shared graph of tests/test_seams_lease.py.

The graph is a pipeline n1..n5 over state ``{"log": [...]}``; every node execution
inserts a row into ``sl_effects`` (a plain, non-deduplicating "charge"), so a repeated
step shows up as a second row. ``LGD_BLOCK_AT=<node>``: that node records a row in
``sl_started`` and then blocks forever (the parent kills the process).
``LGD_CRASH_AT=<node>``: that node SIGKILLs its own process before its effect.
``LGD_STOCK=1``: the stock PostgresSaver instead of the durable one.
``LGD_CLOCK_OFFSET=<seconds>``: this process's wall clock (``time.time_ns``, which
LangGraph's uuid6 checkpoint ids come from) runs that far ahead.

Usage: python _child_seams_lease.py DSN THREAD_ID
"""

from __future__ import annotations

import operator
import os
import signal
import sys
import time
from typing import Annotated, Any, TypedDict

_OFFSET = float(os.environ.get("LGD_CLOCK_OFFSET", "0") or 0)
if _OFFSET:
    _real_time_ns = time.time_ns

    def _skewed_time_ns() -> int:
        return _real_time_ns() + int(_OFFSET * 1e9)

    time.time_ns = _skewed_time_ns

import psycopg  # noqa: E402
from langchain_core.runnables import RunnableConfig  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from psycopg import sql  # noqa: E402

SCHEMA_SQL = [
    """CREATE TABLE IF NOT EXISTS sl_effects (
        id BIGSERIAL PRIMARY KEY, thread_id TEXT NOT NULL, node TEXT NOT NULL,
        pid INTEGER NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS sl_started (
        id BIGSERIAL PRIMARY KEY, thread_id TEXT NOT NULL, node TEXT NOT NULL,
        pid INTEGER NOT NULL)""",
]

NODES = ("n1", "n2", "n3", "n4", "n5")


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def setup_tables(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for stmt in SCHEMA_SQL:
            conn.execute(stmt)


def record(dsn: str, table: str, thread_id: str, node: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("INSERT INTO {} (thread_id, node, pid) VALUES (%s, %s, %s)").format(
                sql.Identifier(table)
            ),
            (thread_id, node, os.getpid()),
        )


def make_builder(dsn: str) -> StateGraph:
    block_at = os.environ.get("LGD_BLOCK_AT")
    crash_at = os.environ.get("LGD_CRASH_AT")

    def make(name: str) -> Any:
        def node(state: State, config: RunnableConfig) -> dict[str, Any]:
            thread_id = config["configurable"]["thread_id"]
            if name == block_at:
                record(dsn, "sl_started", thread_id, name)
                while True:
                    time.sleep(1)
            if name == crash_at:
                os.kill(os.getpid(), signal.SIGKILL)
            record(dsn, "sl_effects", thread_id, name)
            return {"log": [name]}

        return node

    b = StateGraph(State)
    prev = START
    for name in NODES:
        b.add_node(name, make(name))
        b.add_edge(prev, name)
        prev = name
    b.add_edge(prev, END)
    return b


def main(argv: list[str]) -> int:
    dsn, thread_id = argv[0], argv[1]
    from langgraph.checkpoint.postgres import PostgresSaver

    from langgraph_durable import DurablePostgresSaver

    # LGD_STOCK=1: the stock saver (the failure the durable one prevents, shown).
    stock = os.environ.get("LGD_STOCK") == "1"
    with (PostgresSaver.from_conn_string(dsn) if stock else DurablePostgresSaver.from_conn_string(dsn, lease_ttl=30)) as saver:
        graph = make_builder(dsn).compile(checkpointer=saver)
        graph.invoke({"log": []}, {"configurable": {"thread_id": thread_id}}, durability="sync")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
