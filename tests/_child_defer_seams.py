"""Child process of tests/test_defer_seams.py (not a test module).

``python _child_defer_seams.py DSN THREAD SHAPE POLICY MODE [DURABILITY]``

The graph of issue 23, defect 1: ``START -> prep -> {charge, slow}``. ``POLICY=defer``:
``prep`` is deferred (node metadata ``{"checkpoint": "defer"}``), ``charge`` and
``slow`` are "always"; ``POLICY=none``: no policy at all (the control);
``POLICY=budget``: ``ReworkBudget(0.5)``, every node deferrable, ``charge`` taking
twice the budget. ``SHAPE`` says how the step after ``prep`` is made: ``branches``
(two edges), ``send`` (two ``Send`` packets), ``subgraph`` (``charge`` inside a
compiled subgraph node) or ``stateless_subgraph`` (the same compiled with
``checkpointer=False``).

``charge`` records each execution in ``defer_charges`` (its own autocommitted
connection) before it returns. With ``MODE=hang``, ``slow`` waits for that row, prints
CHARGED and then sleeps until the parent SIGKILLs the process; with ``MODE=go`` it
returns at once. Prints READY before the run and the final state as JSON after it.
"""

from __future__ import annotations

import json
import operator
import os
import sys
import time
from typing import Annotated, Any, TypedDict

import psycopg
from langgraph.config import get_config
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

from langgraph_durable import DurablePostgresSaver, ReworkBudget

BUDGET = 0.5
DDL = "CREATE TABLE IF NOT EXISTS defer_charges (id BIGSERIAL PRIMARY KEY, thread_id TEXT, pid INTEGER)"


class State(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    charged: Annotated[list[str], operator.add]


class Inner(TypedDict, total=False):
    charged: Annotated[list[str], operator.add]


def build(dsn: str, shape: str, policy: str, mode: str) -> StateGraph:
    def thread_id() -> str:
        return str(get_config()["configurable"]["thread_id"])

    def prep(state: State) -> dict[str, Any]:
        return {"log": ["prep"]}

    def charge(state: Any) -> dict[str, Any]:
        if policy == "budget":
            # Past the budget: finished work that a crash must not redo (see granularity).
            time.sleep(2 * BUDGET)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO defer_charges (thread_id, pid) VALUES (%s, %s)", (thread_id(), os.getpid()))
        return {"charged": ["charge"]}

    def slow(state: Any) -> dict[str, Any]:
        if mode == "hang":
            with psycopg.connect(dsn, autocommit=True) as conn:
                while not conn.execute("SELECT 1 FROM defer_charges WHERE thread_id = %s", (thread_id(),)).fetchone():
                    time.sleep(0.01)
            print("CHARGED", flush=True)
            time.sleep(3600)  # the parent SIGKILLs us here
        return {"log": ["slow"]}

    metadata = {"checkpoint": "defer"} if policy == "defer" else None
    builder = StateGraph(State)
    builder.add_node("prep", prep, metadata=metadata)
    builder.add_node("slow", slow)
    builder.add_edge(START, "prep")
    if shape in ("subgraph", "stateless_subgraph"):
        inner = StateGraph(Inner)
        inner.add_node("charge", charge)
        inner.add_edge(START, "charge")
        inner.add_edge("charge", END)
        # stateless_subgraph: no checkpointer of its own (nothing of it reaches the
        # saver before the subgraph task's own writes in the root namespace).
        builder.add_node("charge_sub", inner.compile(checkpointer=False if shape == "stateless_subgraph" else None))
        builder.add_edge("prep", "charge_sub")
        builder.add_edge("prep", "slow")
        builder.add_edge("charge_sub", END)
    elif shape == "send":
        builder.add_node("charge", charge)
        builder.add_conditional_edges("prep", lambda s: [Send("charge", {"log": []}), Send("slow", {"log": []})])
        builder.add_edge("charge", END)
    else:
        builder.add_node("charge", charge)
        builder.add_edge("prep", "charge")
        builder.add_edge("prep", "slow")
        builder.add_edge("charge", END)
    builder.add_edge("slow", END)
    return builder


def main() -> None:
    dsn, thread, shape, policy, mode = sys.argv[1:6]
    durability = sys.argv[6] if len(sys.argv) > 6 else "sync"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(DDL)
    checkpoint_policy = ReworkBudget(seconds=BUDGET) if policy == "budget" else None
    with DurablePostgresSaver.from_conn_string(dsn, checkpoint_policy=checkpoint_policy) as saver:
        graph = build(dsn, shape, policy, mode).compile(checkpointer=saver)
        config = {"configurable": {"thread_id": thread}}
        started = graph.get_state(config).values
        print("READY", flush=True)
        out = graph.invoke(None if started else {"log": []}, config, durability=durability)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
