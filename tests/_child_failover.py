"""Child process of the failover tests (not a test module).

``python _child_failover.py SPEC_JSON`` runs several threads of a ``N_STEPS``-step graph
at once (one Python thread each) through a ``DurablePostgresSaver`` on the spec's DSN
(multi-host, ``target_session_attrs=read-write``). Every step makes one
``@idempotent(transactional=True)`` effect: an INSERT into the plain ``effects`` table
(no unique constraint, so a repeat would show), on the ledger's transaction.

Each checkpoint ``put()`` that returned (the saver acknowledged it committed) is
appended to the spec's ``ack_log`` as ``{"t": wall time, "thread", "checkpoint_id"}``,
so the parent can check every acknowledged checkpoint survived the failover.

A run that raises is resumed (``invoke(None)``, a plain invoke loop, what an operator's
retry does); each such error is printed. Prints ``READY``, then one JSON line per event,
``{"event": "done", "thread", "steps"}`` per finished thread.
"""

from __future__ import annotations

import asyncio
import json
import operator
import os
import sys
import threading
import time
import traceback
from typing import Annotated, Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph

from langgraph_durable import AsyncDurablePostgresSaver, DurablePostgresSaver, idempotent

N_STEPS = 12
EFFECTS_DDL = """CREATE TABLE IF NOT EXISTS effects (
    id BIGSERIAL PRIMARY KEY,
    thread_id TEXT NOT NULL,
    step INTEGER NOT NULL,
    pid INTEGER NOT NULL,
    at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
)"""


class State(TypedDict):
    steps: Annotated[list[int], operator.add]


@idempotent(transactional=True)
def record_effect(conn: Any, thread_id: str, step: int) -> int:
    conn.execute(
        "INSERT INTO effects (thread_id, step, pid) VALUES (%s, %s, %s)",
        (thread_id, step, os.getpid()),
    )
    return step


@idempotent(transactional=True)
async def arecord_effect(conn: Any, thread_id: str, step: int) -> int:
    await conn.execute(
        "INSERT INTO effects (thread_id, step, pid) VALUES (%s, %s, %s)",
        (thread_id, step, os.getpid()),
    )
    return step


def build_graph(node_sleep: float, asynchronous: bool = False) -> StateGraph:
    builder = StateGraph(State)

    def make(i: int) -> Any:
        def node(state: State, config: RunnableConfig) -> dict[str, Any]:
            record_effect(config["configurable"]["thread_id"], i)
            time.sleep(node_sleep)
            return {"steps": [i]}

        async def anode(state: State, config: RunnableConfig) -> dict[str, Any]:
            await arecord_effect(config["configurable"]["thread_id"], i)
            await asyncio.sleep(node_sleep)
            return {"steps": [i]}

        return anode if asynchronous else node

    for i in range(N_STEPS):
        builder.add_node(f"s{i}", make(i))
    builder.add_edge(START, "s0")
    for i in range(N_STEPS - 1):
        builder.add_edge(f"s{i}", f"s{i + 1}")
    builder.add_edge(f"s{N_STEPS - 1}", END)
    return builder


_out_lock = threading.Lock()


def emit(**event: Any) -> None:
    with _out_lock:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()


def main() -> None:
    spec = json.loads(sys.argv[1])  # the sync saver; amain for the async one
    ack = open(spec["ack_log"], "a", buffering=1)
    ack_lock = threading.Lock()

    class AckSaver(DurablePostgresSaver):
        def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            out = super().put(config, checkpoint, metadata, new_versions)
            with ack_lock:
                ack.write(json.dumps({
                    "t": time.time(),
                    "thread": out["configurable"]["thread_id"],
                    "checkpoint_id": out["configurable"]["checkpoint_id"],
                }) + "\n")
            return out

    with AckSaver.from_conn_string(
        spec["dsn"], lease_ttl=spec.get("lease_ttl", 4.0), on_busy="wait", busy_timeout=40.0,
    ) as saver:
        graph = build_graph(spec.get("node_sleep", 0.1)).compile(checkpointer=saver)
        emit(event="ready")
        sys.stdout.write("READY\n")
        sys.stdout.flush()

        def run(thread_id: str) -> None:
            config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
            deadline = time.monotonic() + spec.get("deadline", 50.0)
            first = saver.get_tuple(config) is None
            while True:
                try:
                    out = graph.invoke({"steps": []} if first else None, config)
                    emit(event="done", thread=thread_id, steps=out["steps"])
                    return
                except Exception as exc:
                    emit(event="error", thread=thread_id, type=type(exc).__name__, error=str(exc)[:300],
                         tb=traceback.format_exc()[-2500:])
                    if time.monotonic() > deadline:
                        emit(event="gave_up", thread=thread_id)
                        return
                    time.sleep(0.3)
                    try:
                        first = saver.get_tuple(config) is None
                    except Exception:
                        pass  # still failing over: the next invoke tells

        workers = [threading.Thread(target=run, args=(t,)) for t in spec["threads"]]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    emit(event="exit")


async def amain(spec: dict[str, Any]) -> None:
    """``main`` with ``AsyncDurablePostgresSaver``: the threads are ``ainvoke`` tasks."""
    ack = open(spec["ack_log"], "a", buffering=1)

    class AckSaver(AsyncDurablePostgresSaver):
        async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            out = await super().aput(config, checkpoint, metadata, new_versions)
            ack.write(json.dumps({
                "t": time.time(),
                "thread": out["configurable"]["thread_id"],
                "checkpoint_id": out["configurable"]["checkpoint_id"],
            }) + "\n")
            return out

    async with AckSaver.from_conn_string(
        spec["dsn"], lease_ttl=spec.get("lease_ttl", 4.0), on_busy="wait", busy_timeout=40.0,
    ) as saver:
        graph = build_graph(spec.get("node_sleep", 0.1), asynchronous=True).compile(checkpointer=saver)
        sys.stdout.write("READY\n")
        sys.stdout.flush()

        async def run(thread_id: str) -> None:
            config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
            deadline = time.monotonic() + spec.get("deadline", 50.0)
            first = await saver.aget_tuple(config) is None
            while True:
                try:
                    out = await graph.ainvoke({"steps": []} if first else None, config)
                    emit(event="done", thread=thread_id, steps=out["steps"])
                    return
                except Exception as exc:
                    emit(event="error", thread=thread_id, type=type(exc).__name__, error=str(exc)[:300],
                         tb=traceback.format_exc()[-2500:])
                    if time.monotonic() > deadline:
                        emit(event="gave_up", thread=thread_id)
                        return
                    await asyncio.sleep(0.3)
                    try:
                        first = await saver.aget_tuple(config) is None
                    except Exception:
                        pass

        await asyncio.gather(*(run(t) for t in spec["threads"]))
    emit(event="exit")


if __name__ == "__main__":
    _spec = json.loads(sys.argv[1])
    if _spec.get("asynchronous"):
        asyncio.run(amain(_spec))
    else:
        main()
