"""Child process of the SIGKILL tests in tests/test_crash_resume.py (not a test module).

One child runs several graph threads at once, each in its own Python thread, so that a
single SIGKILL lands at a different point of every thread's run: the 1-2 s it takes to
import LangGraph is paid once per kill, not once per kill point.

Every node first records its execution in ``node_runs`` (its own autocommitted
connection, so the row exists even if the process dies a microsecond later, and it
never deduplicates), then sleeps, then appends its name to the state. The parent
compares that table with the checkpoints it finds after each kill.

Usage: ``python crash_child.py RUN_NO SPECS_JSON`` with ``CRASH_DSN`` in the environment.
SPECS_JSON is a list of ``{"thread_id", "kind", "api", "durability", "delay"}``:
kind ``linear`` (9 nodes, one 3-way fan-out) or ``sub`` (a parent around a 4-node
subgraph); api ``sync`` (DurablePostgresSaver + invoke), ``async``
(AsyncDurablePostgresSaver + ainvoke, async nodes) or ``stock`` (the stock
PostgresSaver). Options: ``--barrier`` waits for a line on stdin before running (so
racers start together), ``--on-busy raise|wait``, ``--lease-ttl``.

It prints ``READY`` once imports and savers are up, then one JSON line per thread:
``{"event": "done" | "busy" | "error", "thread_id": ..., "state": ...}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import operator
import os
import sys
import threading
import time
from typing import Annotated, Any, TypedDict

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph

NODE_RUNS_DDL = """
CREATE TABLE IF NOT EXISTS node_runs (
    id BIGSERIAL PRIMARY KEY,
    thread_id TEXT NOT NULL,
    node TEXT NOT NULL,
    run_no INTEGER NOT NULL,
    pid INTEGER NOT NULL,
    at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
)
"""

# (node, sleep seconds). The three analyses run in one superstep with different
# durations, so kills land while some have finished (pending writes saved) and others
# have not.
LINEAR_CHAIN = [("fetch", 0.08), ("parse", 0.08)]
LINEAR_FANOUT = [("analyze_a", 0.04), ("analyze_b", 0.12), ("analyze_c", 0.2)]
LINEAR_TAIL = [("merge", 0.08), ("draft", 0.08), ("review", 0.08), ("publish", 0.08)]
LINEAR_NODES = [n for n, _ in LINEAR_CHAIN + LINEAR_FANOUT + LINEAR_TAIL]

SUB_NODES = [("s1", 0.08), ("s2", 0.08), ("s3", 0.08), ("s4", 0.08)]
SUB_PARENT = [("prep", 0.08), ("finish", 0.08)]
SUB_ALL_NODES = ["prep", *[n for n, _ in SUB_NODES], "finish"]


class LinearState(TypedDict):
    log: Annotated[list[str], operator.add]


class SubState(TypedDict):
    sub_log: Annotated[list[str], operator.add]


class ParentState(TypedDict):
    log: Annotated[list[str], operator.add]
    # No reducer: the subgraph hands back its whole sub_log when it finishes.
    sub_log: list[str]


def initial_input(kind: str) -> dict[str, Any]:
    return {"log": []} if kind == "linear" else {"log": [], "sub_log": []}


class Recorder:
    """Writes node_runs rows on one autocommit connection per Python thread."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.local = threading.local()

    def record(self, thread_id: str, node: str, run_no: int) -> None:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = psycopg.connect(self.dsn, autocommit=True)
        conn.execute(
            "INSERT INTO node_runs (thread_id, node, run_no, pid) VALUES (%s, %s, %s, %s)",
            (thread_id, node, run_no, os.getpid()),
        )


def _where(config: RunnableConfig) -> tuple[str, int]:
    conf = config["configurable"]
    return str(conf["thread_id"]), int(conf.get("run_no", 0))


def make_node(name: str, pause: float, key: str, recorder: Recorder, use_async: bool) -> Any:
    if use_async:

        async def anode(state: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
            thread_id, run_no = _where(config)
            await asyncio.to_thread(recorder.record, thread_id, name, run_no)
            await asyncio.sleep(pause)
            return {key: [name]}

        return anode

    def node(state: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        thread_id, run_no = _where(config)
        recorder.record(thread_id, name, run_no)
        time.sleep(pause)
        return {key: [name]}

    return node


def build(kind: str, recorder: Recorder, *, use_async: bool = False) -> StateGraph[Any]:
    """The uncompiled graph of ``kind``; the same builder serves children and parent."""
    if kind == "linear":
        g: StateGraph[Any] = StateGraph(LinearState)
        for name, pause in LINEAR_CHAIN + LINEAR_FANOUT + LINEAR_TAIL:
            g.add_node(name, make_node(name, pause, "log", recorder, use_async))
        g.add_edge(START, "fetch")
        g.add_edge("fetch", "parse")
        for name, _ in LINEAR_FANOUT:
            g.add_edge("parse", name)
        g.add_edge([n for n, _ in LINEAR_FANOUT], "merge")
        g.add_edge("merge", "draft")
        g.add_edge("draft", "review")
        g.add_edge("review", "publish")
        g.add_edge("publish", END)
        return g
    if kind == "sub":
        sub: StateGraph[Any] = StateGraph(SubState)
        prev = START
        for name, pause in SUB_NODES:
            sub.add_node(name, make_node(name, pause, "sub_log", recorder, use_async))
            sub.add_edge(prev, name)
            prev = name
        sub.add_edge(prev, END)
        g = StateGraph(ParentState)
        for name, pause in SUB_PARENT:
            g.add_node(name, make_node(name, pause, "log", recorder, use_async))
        # Compiled without a checkpointer: it inherits the parent's and checkpoints
        # under its own namespace ("inner:<task id>").
        g.add_node("inner", sub.compile())
        g.add_edge(START, "prep")
        g.add_edge("prep", "inner")
        g.add_edge("inner", "finish")
        g.add_edge("finish", END)
        return g
    raise ValueError(f"unknown graph kind {kind!r}")


def _emit(event: dict[str, Any]) -> None:
    # One write per line: several threads print concurrently.
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _config(spec: dict[str, Any], run_no: int) -> RunnableConfig:
    # run_no sits in configurable: nodes read it, and LangGraph copies it into the
    # metadata of every checkpoint this run writes (the parent reads it back).
    return {"configurable": {"thread_id": spec["thread_id"], "run_no": run_no}}


def run_sync(spec: dict[str, Any], run_no: int, saver: Any, recorder: Recorder) -> dict[str, Any]:
    graph = build(spec["kind"], recorder).compile(checkpointer=saver)
    config = _config(spec, run_no)
    # Resume whenever a checkpoint exists: invoke(None) on a finished thread is a no-op.
    # (Do not test snap.next: it is empty when every task of the step has its writes
    # saved but the next step was never checkpointed, and that thread is not finished.)
    snap = graph.get_state(config)
    inp = None if snap.created_at is not None else initial_input(spec["kind"])
    return dict(graph.invoke(inp, config, durability=spec["durability"]))


async def run_async(spec: dict[str, Any], run_no: int, dsn: str, opts: dict[str, Any], recorder: Recorder) -> dict[str, Any]:
    from langgraph_durable import AsyncDurablePostgresSaver

    async with AsyncDurablePostgresSaver.from_conn_string(dsn, pool_size=4, **opts) as saver:
        graph = build(spec["kind"], recorder, use_async=True).compile(checkpointer=saver)
        config = _config(spec, run_no)
        snap = await graph.aget_state(config)
        inp = None if snap.created_at is not None else initial_input(spec["kind"])
        return dict(await graph.ainvoke(inp, config, durability=spec["durability"]))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_no", type=int)
    parser.add_argument("specs")
    parser.add_argument("--barrier", action="store_true")
    parser.add_argument("--on-busy", default="wait", choices=["wait", "raise"])
    parser.add_argument("--lease-ttl", type=float, default=2.0)
    args = parser.parse_args()
    specs: list[dict[str, Any]] = json.loads(args.specs)
    # The application_name lets the parent wait until every backend of this process is
    # gone after the kill: a COMMIT already on the wire still lands after SIGKILL.
    dsn = psycopg.conninfo.make_conninfo(
        os.environ["CRASH_DSN"], application_name=f"crash_child_{args.run_no}"
    )

    from langgraph.checkpoint.postgres import PostgresSaver

    from langgraph_durable import DurablePostgresSaver, ThreadBusyError

    # A short lease so a resume after SIGKILL waits at most ~2 s for the dead run's
    # lease to expire; a high attempt limit because this test kills the same
    # checkpoint's run over and over on purpose (by default the third crash at one
    # checkpoint quarantines the thread: that is poison detection, tested elsewhere).
    opts: dict[str, Any] = {
        "lease_ttl": args.lease_ttl,
        "on_busy": args.on_busy,
        "busy_timeout": 30.0,
        "max_resume_attempts": 1000,
    }
    recorder = Recorder(dsn)
    with (
        DurablePostgresSaver.from_conn_string(dsn, **opts) as saver,
        PostgresSaver.from_conn_string(dsn) as stock,
    ):
        print("READY", flush=True)
        if args.barrier:
            sys.stdin.readline()

        def worker(spec: dict[str, Any]) -> None:
            time.sleep(spec.get("delay", 0.0))
            try:
                if spec["api"] == "async":
                    state = asyncio.run(run_async(spec, args.run_no, dsn, opts, recorder))
                else:
                    use = stock if spec["api"] == "stock" else saver
                    state = run_sync(spec, args.run_no, use, recorder)
                _emit({"event": "done", "thread_id": spec["thread_id"], "state": state})
            except ThreadBusyError as exc:
                _emit({"event": "busy", "thread_id": spec["thread_id"], "error": str(exc)})
            except Exception as exc:
                _emit(
                    {
                        "event": "error",
                        "thread_id": spec["thread_id"],
                        "error": f"{type(exc).__name__}: {exc}",
                    }
                )

        threads: list[threading.Thread] = []
        for spec in specs:
            t = threading.Thread(target=worker, args=(spec,), name=spec["thread_id"])
            t.start()
            threads.append(t)
        for t in threads:
            t.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
