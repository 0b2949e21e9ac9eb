"""Graphs of tests/test_review23.py, and its child process (not a test module).

``python _child_review23.py DSN THREAD SHAPE``: runs SHAPE's graph ("send" or
"subgraph") with deferral and SIGKILLs itself in the last worker, after its
journaled model call; the parent resumes the thread with ``build(...)``.
"""

from __future__ import annotations

import operator
import os
import signal
import sys
from typing import Annotated, Any, TypedDict

import psycopg
from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableLambda
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

from langgraph_durable import DurablePostgresSaver, journaled

QUESTIONS = ("q0", "q1")


class S(TypedDict, total=False):
    answers: Annotated[list[str], operator.add]
    q: str


def _model(dsn: str, thread: str) -> Any:
    """A 'model' that records each call it answers in r23_calls (made by the test)."""

    def answer(prompt: Any) -> AIMessage:
        text = str(prompt)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO r23_calls VALUES (%s, %s)", (thread, text))
        return AIMessage(f"answer to {text}")

    return journaled(RunnableLambda(answer, name="model"))


def _until_answers_recorded(dsn: str, thread: str) -> None:
    """Until both workers' answers are recorded in the journal (at most 10 s): the kill
    must land after every call completed, or the other worker's unrecorded call is
    rightly asked again (seen under load)."""
    import time

    deadline = time.monotonic() + 10
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM durable_ledger WHERE thread_id = %s AND status = 'completed'", (thread,)
            ).fetchone()
            if row and row[0] >= len(QUESTIONS):
                return
            time.sleep(0.02)


def build(dsn: str, thread: str, shape: str, saver: Any, kill: bool) -> Any:
    model = _model(dsn, thread)

    def ask(s: S) -> dict[str, Any]:
        with psycopg.connect(dsn, autocommit=True) as conn:  # every execution of the task
            conn.execute("INSERT INTO r23_asks VALUES (%s, %s)", (thread, s["q"]))
        answer = model.invoke(s["q"]).content
        if kill and s["q"] == QUESTIONS[-1]:
            _until_answers_recorded(dsn, thread)  # the other worker's call too: exact counts
            os.kill(os.getpid(), signal.SIGKILL)  # after its journaled call, before its writes
        return {"answers": [answer]}

    if shape == "subgraph":
        sub = StateGraph(S)
        sub.add_node("ask", ask, metadata={"checkpoint": "defer"})
        sub.add_edge(START, "ask")
        sub.add_edge("ask", END)
        compiled = sub.compile()

        def worker(s: S) -> dict[str, Any]:  # a subgraph run inside the node (its own namespace)
            return {"answers": compiled.invoke({"q": s["q"]})["answers"]}
    else:
        worker = ask  # type: ignore[assignment]

    def collect(s: S) -> dict[str, Any]:
        return {}

    g = StateGraph(S)
    g.add_node("prep", lambda s: {"answers": []}, metadata={"checkpoint": "defer"})
    g.add_node("worker", worker, metadata={"checkpoint": "defer"})
    g.add_node("collect", collect)
    g.add_edge(START, "prep")
    g.add_conditional_edges("prep", lambda s: [Send("worker", {"q": q}) for q in QUESTIONS], ["worker"])
    g.add_edge("worker", "collect")
    g.add_edge("collect", END)
    return g.compile(checkpointer=saver)


if __name__ == "__main__":
    dsn, thread, shape = sys.argv[1:4]
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        build(dsn, thread, shape, saver, kill=True).invoke({"answers": []}, {"configurable": {"thread_id": thread}}, durability="sync")
    raise SystemExit("not killed")
