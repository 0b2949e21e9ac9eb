"""Graphs of the adoption tests, and the child that runs them on the STOCK saver.

Every node records ``label`` in the side table ``adopt_ran`` of the database named by
``LGD_ADOPT_DSN`` (each copy of the database has its own, so a test sees which nodes
each resume ran). The node whose label is ``LGD_ADOPT_HANG`` records itself and then
blocks, so the parent can SIGKILL the child inside it.

Child: ``python _child_adoption.py DSN SCENARIO THREAD`` runs SCENARIO with the stock
``PostgresSaver`` (durability "sync") until it is killed.
"""

# No `from __future__ import annotations`: LangGraph evaluates the state schemas.

import operator
import os
import sys
import time
from typing import Annotated, Any, TypedDict

import psycopg
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.channels.delta import DeltaChannel
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import _messages_delta_reducer
from langgraph.types import Send, interrupt

DSN_ENV = "LGD_ADOPT_DSN"
HANG_ENV = "LGD_ADOPT_HANG"
SIDE_TABLE = (
    "CREATE TABLE IF NOT EXISTS adopt_ran (id BIGSERIAL PRIMARY KEY, thread_id TEXT, label TEXT)"
)


def record(config: RunnableConfig, label: str) -> None:
    with psycopg.connect(os.environ[DSN_ENV], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO adopt_ran (thread_id, label) VALUES (%s, %s)",
            (str(config["configurable"]["thread_id"]), label),
        )
    if os.environ.get(HANG_ENV) == label:
        time.sleep(600)  # SIGKILLed here


def ran(dsn: str, thread_id: str, after: int = 0) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT label FROM adopt_ran WHERE thread_id = %s AND id > %s ORDER BY id",
            (thread_id, after),
        ).fetchall()
    return [r[0] for r in rows]


class State(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    answer: str
    item: int


class Chat(TypedDict, total=False):
    messages: Annotated[list, DeltaChannel(_messages_delta_reducer, snapshot_frequency=2)]


def _step(name: str) -> Any:
    def run(state: State, config: RunnableConfig) -> dict[str, Any]:
        record(config, name)
        return {"log": [name]}

    return run


def linear() -> StateGraph:
    """START -> a -> b -> c -> END (killed inside b)."""
    b = StateGraph(State)
    for n in ("a", "b", "c"):
        b.add_node(n, _step(n))
    b.add_edge(START, "a")
    b.add_edge("a", "b")
    b.add_edge("b", "c")
    b.add_edge("c", END)
    return b


def fanout(*, ask_in: int | None = None) -> StateGraph:
    """split -> Send(worker, i) for i in 0..3 -> join. Killed inside worker 3 after the
    others committed their writes, or (``ask_in``) one worker interrupts."""

    def worker(state: State, config: RunnableConfig) -> dict[str, Any]:
        i = state["item"]
        record(config, f"worker:{i}")
        if ask_in == i:
            return {"log": [f"w{i}:{interrupt(f'worker {i}?')}"]}
        return {"log": [f"w{i}"]}

    b = StateGraph(State)
    b.add_node("split", _step("split"))
    b.add_node("worker", worker)
    b.add_node("join", _step("join"))
    b.add_edge(START, "split")
    b.add_conditional_edges(
        "split", lambda s: [Send("worker", {"item": i}) for i in range(4)], ["worker"]
    )
    b.add_edge("worker", "join")
    b.add_edge("join", END)
    return b


def asking() -> StateGraph:
    """START -> prepare -> ask (interrupt) -> finish -> END."""

    def ask(state: State, config: RunnableConfig) -> dict[str, Any]:
        record(config, "ask")
        return {"answer": interrupt("approve?")}

    b = StateGraph(State)
    b.add_node("prepare", _step("prepare"))
    b.add_node("ask", ask)
    b.add_node("finish", _step("finish"))
    b.add_edge(START, "prepare")
    b.add_edge("prepare", "ask")
    b.add_edge("ask", "finish")
    b.add_edge("finish", END)
    return b


def chat() -> StateGraph:
    """A DeltaChannel message list: START -> think -> reply -> END per turn (messages
    carry fixed ids so two resumes produce equal values)."""

    def think(state: Chat, config: RunnableConfig) -> dict[str, Any]:
        n = len(state["messages"])
        record(config, f"think:{n}")
        return {"messages": [AIMessage(f"thought {n}", id=f"t{n}")]}

    def reply(state: Chat, config: RunnableConfig) -> dict[str, Any]:
        n = len(state["messages"])
        record(config, f"reply:{n}")
        return {"messages": [AIMessage(f"reply {n}", id=f"r{n}")]}

    b = StateGraph(Chat)
    b.add_node("think", think)
    b.add_node("reply", reply)
    b.add_edge(START, "think")
    b.add_edge("think", "reply")
    b.add_edge("reply", END)
    return b


def turn(i: int) -> dict[str, Any]:
    return {"messages": [HumanMessage(f"question {i}", id=f"h{i}")]}


def main() -> None:
    from langgraph.checkpoint.postgres import PostgresSaver

    dsn, scenario, thread_id = sys.argv[1], sys.argv[2], sys.argv[3]
    os.environ[DSN_ENV] = dsn
    config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
    with PostgresSaver.from_conn_string(dsn) as saver:
        if scenario == "linear":
            linear().compile(checkpointer=saver).invoke({"log": []}, config, durability="sync")
        elif scenario == "fanout":
            fanout().compile(checkpointer=saver).invoke({"log": []}, config, durability="sync")
        elif scenario == "chat":
            g = chat().compile(checkpointer=saver)
            for i in range(3):  # killed in the third turn's reply (8 messages seen)
                g.invoke(turn(i), config, durability="sync")
    print("finished without being killed", file=sys.stderr)
    sys.exit(3)


if __name__ == "__main__":
    main()
