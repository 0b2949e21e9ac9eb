"""Graphs (and the worker child) for tests/test_control.py (issue 25: operator decisions).

``ask``: prep -> ask (``interrupt({"question", "order"})``, then logs the answer) ->
after. Each execution of the code after the interrupt inserts a row in ``ctl_effects``
(kind 'ask' / 'after', the pid), then sleeps ``LGD_ASK_SLEEP`` / ``LGD_AFTER_SLEEP``, so
a test can SIGKILL a worker at either point.
``steps``: s0..s{LGD_STEPS-1}, each logs to ``ctl_effects`` (kind 'step'), sleeps
``LGD_SLEEP`` and appends its name to the state.

Mode ``worker ARGS...``: ``langgraph-durable worker --graph this_file:<LGD_GRAPH> ARGS``
(DSN in $LGD_DSN).
"""

from __future__ import annotations

import json
import operator
import os
import sys
import time
from typing import Annotated, Any, TypedDict

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

DSN = os.environ.get("LGD_DSN", "")

SCHEMA_SQL = """CREATE TABLE IF NOT EXISTS ctl_effects (
    id BIGSERIAL PRIMARY KEY, thread_id TEXT NOT NULL, kind TEXT NOT NULL, detail TEXT,
    pid INTEGER NOT NULL, at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())"""


class State(TypedDict):
    log: Annotated[list[str], operator.add]


def effect(dsn: str, thread_id: str, kind: str, detail: str = "") -> None:
    with psycopg.connect(dsn or DSN, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO ctl_effects (thread_id, kind, detail, pid) VALUES (%s, %s, %s, %s)",
            (thread_id, kind, detail, os.getpid()),
        )


def _tid(config: RunnableConfig) -> str:
    return str(config["configurable"]["thread_id"])


def prep(state: State) -> dict[str, Any]:
    return {"log": ["prep"]}


def ask(state: State, config: RunnableConfig) -> dict[str, Any]:
    value = interrupt({"question": "ship it?", "order": 7})
    effect(DSN, _tid(config), "ask", json.dumps(value, sort_keys=True))
    time.sleep(float(os.environ.get("LGD_ASK_SLEEP", "0")))
    return {"log": ["answer:" + json.dumps(value, sort_keys=True)]}


def after(state: State, config: RunnableConfig) -> dict[str, Any]:
    effect(DSN, _tid(config), "after")
    time.sleep(float(os.environ.get("LGD_AFTER_SLEEP", "0")))
    return {"log": ["after"]}


def make_ask() -> StateGraph:
    b = StateGraph(State)
    b.add_node("prep", prep)
    b.add_node("ask", ask)
    b.add_node("after", after)
    b.add_edge(START, "prep")
    b.add_edge("prep", "ask")
    b.add_edge("ask", "after")
    b.add_edge("after", END)
    return b


def make_step(name: str) -> Any:
    def node(state: State, config: RunnableConfig) -> dict[str, Any]:
        effect(DSN, _tid(config), "step", name)
        time.sleep(float(os.environ.get("LGD_SLEEP", "0.05")))
        return {"log": [name]}

    return node


def make_steps(n: int | None = None) -> StateGraph:
    n = int(os.environ.get("LGD_STEPS", "6")) if n is None else n
    b = StateGraph(State)
    prev = START
    for i in range(n):
        b.add_node(f"s{i}", make_step(f"s{i}"))
        b.add_edge(prev, f"s{i}")
        prev = f"s{i}"
    b.add_edge(prev, END)
    return b


ask_builder = make_ask()
steps_builder = make_steps()


def main(argv: list[str]) -> int:
    if argv[0] == "worker":
        from langgraph_durable.cli import main as cli_main

        graph = os.environ.get("LGD_GRAPH", "ask")
        sys.argv = ["langgraph-durable", "worker", "--graph", f"{os.path.abspath(__file__)}:{graph}_builder",
                    "--dsn", DSN, *argv[1:]]
        cli_main()
        return 0
    if argv[0] == "run":  # run the steps graph on thread argv[1] in this process
        from langgraph_durable import DurablePostgresSaver
        from langgraph_durable.errors import RunCancelledError

        with DurablePostgresSaver.from_conn_string(DSN, lease_ttl=float(os.environ.get("LGD_TTL", "30"))) as saver:
            graph = steps_builder.compile(checkpointer=saver)
            try:
                graph.invoke({"log": []}, {"configurable": {"thread_id": argv[1]}})
            except RunCancelledError as exc:
                print(json.dumps({"cancelled": exc.fields}), flush=True)
                return 3
        print(json.dumps({"finished": True}), flush=True)
        return 0
    raise SystemExit(f"unknown mode {argv[0]!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
