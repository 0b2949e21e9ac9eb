"""Child process for tests/test_poison.py: a fork server of real attempts.

Started once per test module with ``sys.executable tests/_child_poison.py DSN``. It pays
the LangGraph import once, then for every JSON command on stdin forks a fresh process
that opens its own saver (durable or stock), runs ONE invoke of the graph below and
reports; the node may SIGKILL that process. The server answers one JSON line per
command: the attempt's pid, the signal that killed it (9 for SIGKILL) or its result
(ok + steps, or the exception type and its structured fields).

Command: {"saver": "durable"|"stock", "scenario": "kill"|"raise"|"kill_once",
          "thread": str, "input": bool, "max": int}

Graph: prep -> danger -> finish. Every node execution is committed to the side table
poison_exec BEFORE the node fails, so a killed execution is still counted. The durable
saver's on_poison hook writes its record to poison_hook (from the child that detects).
"""

from __future__ import annotations

import json
import operator
import os
import signal
import sys
import traceback
from typing import Annotated, Any, TypedDict

import psycopg
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph

from langgraph_durable import DurablePostgresSaver, PoisonRecord

DSN = sys.argv[1]


class State(TypedDict):
    doc: str
    steps: Annotated[list[str], operator.add]


def _record(thread: str, node: str) -> int:
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO poison_exec (thread_id, node, pid) VALUES (%s, %s, %s)",
            (thread, node, os.getpid()),
        )
        row = conn.execute(
            "SELECT count(*) FROM poison_exec WHERE thread_id = %s AND node = %s", (thread, node)
        ).fetchone()
    assert row is not None
    return int(row[0])


def _hook(record: PoisonRecord) -> None:
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO poison_hook (thread_id, checkpoint_id, attempts, last_error, "
            "graph_version, reason, pid) VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (record.thread_id, record.checkpoint_id, record.attempts, record.last_error,
             record.graph_version, record.reason, os.getpid()),
        )


def _builder(scenario: str, thread: str) -> Any:
    def prep(state: State) -> dict[str, Any]:
        _record(thread, "prep")
        return {"steps": ["prep"]}

    def danger(state: State) -> dict[str, Any]:
        n = _record(thread, "danger")
        if scenario == "kill" or (scenario == "kill_once" and n == 1):
            # What an OOM kill or a segfaulting native library does: no exception, no
            # exit handler, nothing written after this point.
            os.kill(os.getpid(), signal.SIGKILL)
        if scenario == "raise":
            raise RuntimeError(f"bad document in {thread} (execution {n})")
        return {"steps": ["danger"]}

    def finish(state: State) -> dict[str, Any]:
        _record(thread, "finish")
        return {"steps": ["finish"]}

    builder = StateGraph(State)
    builder.add_node("prep", prep)
    builder.add_node("danger", danger)
    builder.add_node("finish", finish)
    builder.add_edge(START, "prep")
    builder.add_edge("prep", "danger")
    builder.add_edge("danger", "finish")
    builder.add_edge("finish", END)
    return builder


def _attempt(cmd: dict[str, Any]) -> dict[str, Any]:
    thread = cmd["thread"]
    builder = _builder(cmd["scenario"], thread)
    config = {"configurable": {"thread_id": thread}}
    inputs = {"doc": "d", "steps": []} if cmd["input"] else None
    try:
        if cmd["saver"] == "durable":
            # A SIGKILLed attempt keeps its lease until it expires: a short ttl, and
            # on_busy="wait" makes the next attempt wait for it instead of failing.
            with DurablePostgresSaver.from_conn_string(
                DSN,
                lease_ttl=1.5,
                on_busy="wait",
                busy_timeout=30,
                max_resume_attempts=cmd["max"],
                on_poison=_hook,
                graph_version="poison-v1",
            ) as saver:
                graph = builder.compile(checkpointer=saver)
                # durability="sync": the checkpoint before `danger` is committed before
                # it runs, so which checkpoint each kill counts against is deterministic.
                out = graph.invoke(inputs, config, durability="sync")
        else:
            with PostgresSaver.from_conn_string(DSN) as stock:
                graph = builder.compile(checkpointer=stock)
                out = graph.invoke(inputs, config, durability="sync")
        return {"ok": True, "steps": out["steps"]}
    except Exception as exc:
        return {
            "ok": False,
            "error": type(exc).__name__,
            "fields": {k: v for k, v in getattr(exc, "fields", {}).items()},
            "message": str(exc),
            "traceback": traceback.format_exc()[-2000:],
        }


def _serve_one(cmd: dict[str, Any]) -> dict[str, Any]:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the attempt: a fresh process (no connection is inherited)
        os.close(read_fd)
        try:
            payload = json.dumps(_attempt(cmd), default=str).encode()
        except BaseException as exc:  # report, never return into the server loop
            payload = json.dumps({"ok": False, "error": type(exc).__name__}).encode()
        with os.fdopen(write_fd, "wb") as out:
            out.write(payload)
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as src:
        data = src.read()
    _, status = os.waitpid(pid, 0)
    return {
        "pid": pid,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "result": json.loads(data) if data else None,
    }


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        reply = _serve_one(json.loads(line))
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
