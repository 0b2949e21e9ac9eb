"""Graphs of the versioning tests, three releases of one workflow, plus small ones.

v1: START -> fetch -> review (interrupt) -> audit -> summarize -> END
v2: ``review`` renamed ``approve``, ``audit`` removed; state key ``topic`` became
    ``subject`` and ``priority`` is new.
v3: ``approve`` renamed ``confirm``; ``priority`` doubles.

Every node records ``<release>:<node>`` in the side table ``executed`` of the test
database (``LGD_VERSIONING_DSN``), so a test can prove that nothing ran. A node named in
``LGD_HANG_IN`` records itself and then blocks, so a child process can be SIGKILLed
inside it. Also imported by path by the CLI tests (``--graph file.py:attr``).
"""

from __future__ import annotations

import operator
import os
import time
from typing import Annotated, Any, TypedDict

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send, interrupt

from langgraph_durable import MigrationRegistry

DSN_ENV = "LGD_VERSIONING_DSN"
HANG_ENV = "LGD_HANG_IN"


class State(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    answer: str
    topic: str
    subject: str
    priority: int


def record(config: RunnableConfig, label: str) -> None:
    dsn = os.environ[DSN_ENV]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO executed (thread_id, label) VALUES (%s, %s)",
            (str(config["configurable"]["thread_id"]), label),
        )
    if os.environ.get(HANG_ENV) == label:
        time.sleep(600)  # the parent SIGKILLs this process while it sleeps here


def ensure_side_table(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS executed (id BIGSERIAL PRIMARY KEY, thread_id TEXT, label TEXT)"
        )


def executed(dsn: str, thread_id: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT label FROM executed WHERE thread_id = %s ORDER BY id", (thread_id,)
        ).fetchall()
    return [r[0] for r in rows]


def _node(release: str, name: str, *, asks: bool = False) -> Any:
    def run(state: State, config: RunnableConfig) -> dict[str, Any]:
        record(config, f"{release}:{name}")
        out: dict[str, Any] = {"log": [name]}
        if asks:
            out["answer"] = interrupt({"question": f"{name}?"})
        return out

    run.__name__ = name
    return run


def build_v1(*, order: tuple[str, ...] = ("fetch", "review", "audit", "summarize")) -> StateGraph:
    b = StateGraph(State)
    for name in order:
        b.add_node(name, _node("v1", name, asks=name == "review"))
    b.add_edge(START, "fetch")
    b.add_edge("fetch", "review")
    b.add_edge("review", "audit")
    b.add_edge("audit", "summarize")
    b.add_edge("summarize", END)
    return b


def build_v2() -> StateGraph:
    b = StateGraph(State)
    b.add_node("fetch", _node("v2", "fetch"))
    b.add_node("approve", _node("v2", "approve", asks=True))
    b.add_node("summarize", _node("v2", "summarize"))
    b.add_edge(START, "fetch")
    b.add_edge("fetch", "approve")
    b.add_edge("approve", "summarize")
    b.add_edge("summarize", END)
    return b


def build_v3() -> StateGraph:
    b = StateGraph(State)
    b.add_node("fetch", _node("v3", "fetch"))
    b.add_node("confirm", _node("v3", "confirm", asks=True))
    b.add_node("summarize", _node("v3", "summarize"))
    b.add_edge(START, "fetch")
    b.add_edge("fetch", "confirm")
    b.add_edge("confirm", "summarize")
    b.add_edge("summarize", END)
    return b


def v1_to_v2(state: dict[str, Any]) -> dict[str, Any]:
    state["priority"] = 1 if state.get("subject") == "urgent" else 0
    return state


def v2_to_v3(state: dict[str, Any]) -> dict[str, Any]:
    state["priority"] = state.get("priority", 0) * 2 + 10
    return state


# The registry the CLI finds beside the graphs (one per module: see cli/_versions.py).
registry = MigrationRegistry()
registry.register(
    "v1", "v2", v1_to_v2,
    rename_nodes={"review": "approve", "audit": "summarize"},
    rename_channels={"topic": "subject"},
)
registry.register("v2", "v3", v2_to_v3, rename_nodes={"approve": "confirm"})

graph_v1 = build_v1().compile()
graph_v2 = build_v2().compile()
graph_v3 = build_v3().compile()


# --- parallel branches joined by a barrier: a finished task of a renamed node ------------


def build_parallel(left: str) -> StateGraph:
    """START -> (left, right) -> combine; ``right`` interrupts while ``left`` finishes."""
    release = "p1" if left == "left" else "p2"
    b = StateGraph(State)
    b.add_node(left, _node(release, left))
    b.add_node("right", _node(release, "right", asks=True))
    b.add_node("combine", _node(release, "combine"))
    b.add_edge(START, left)
    b.add_edge(START, "right")
    b.add_edge([left, "right"], "combine")
    b.add_edge("combine", END)
    return b


# --- Send fan-out: finished workers of a renamed node ------------------------------------


def build_fanout(worker: str) -> StateGraph:
    release = "f1" if worker == "worker" else "f2"

    def fan(state: State) -> list[Send]:
        return [Send(worker, {"topic": t}) for t in ("a", "b", "c")]

    def work(state: State, config: RunnableConfig) -> dict[str, Any]:
        record(config, f"{release}:{worker}:{state.get('topic')}")
        if state.get("topic") == "b":
            return {"log": [f"{worker}:b"], "answer": interrupt("b?")}
        return {"log": [f"{worker}:{state.get('topic')}"]}

    b = StateGraph(State)
    b.add_node(worker, work)
    b.add_node("done", _node(release, "done"))
    b.add_conditional_edges(START, fan, [worker])
    b.add_edge(worker, "done")
    b.add_edge("done", END)
    return b


# --- subgraph as a node ----------------------------------------------------------------


def build_with_subgraph(extra_inner_node: bool) -> StateGraph:
    inner = StateGraph(State)
    inner.add_node("draft", _node("sub", "draft"))
    inner.add_edge(START, "draft")
    if extra_inner_node:
        inner.add_node("polish", _node("sub", "polish"))
        inner.add_edge("draft", "polish")
        inner.add_edge("polish", END)
    else:
        inner.add_edge("draft", END)
    outer = StateGraph(State)
    outer.add_node("write", inner.compile())
    outer.add_node("gate", _node("outer", "gate", asks=True))
    outer.add_edge(START, "write")
    outer.add_edge("write", "gate")
    outer.add_edge("gate", END)
    return outer
