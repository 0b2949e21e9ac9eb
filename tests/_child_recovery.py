"""Child process (and shared graph) for tests/test_recovery.py and tests/test_leases.py.

The graph is a side-effecting pipeline: nodes s0..s{n-1}, each logs its execution to
``rec_log`` (thread, node, pid, lease token, start/end on the database clock), sleeps,
performs an effect (a plain, non-deduplicating insert into ``rec_effects``) and appends
``node:pid:token`` to the state.

Modes (DSN in $LGD_DSN; LGD_STEPS / LGD_SLEEP shape the pipeline):
  worker ARGS...              ``langgraph-durable worker --graph this_file:builder ARGS``
  run SAVER:THREAD...         start a run per thread at once (threads), input {"done": []}
  resume SAVER THREAD         print "ready", wait for a line on stdin, then
                              ``invoke(None)`` the thread; print JSON
SAVER is ``durable`` or ``stock`` (langgraph.checkpoint.postgres.PostgresSaver).
"""

from __future__ import annotations

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

from langgraph_durable import idempotent
from langgraph_durable.saver import _DurableBase

DSN = os.environ.get("LGD_DSN", "")

SCHEMA_SQL = [
    """CREATE TABLE IF NOT EXISTS rec_log (
        id BIGSERIAL PRIMARY KEY, thread_id TEXT NOT NULL, node TEXT NOT NULL,
        pid INTEGER NOT NULL, token BIGINT, owner TEXT,
        t_start TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(), t_end TIMESTAMPTZ)""",
    """CREATE TABLE IF NOT EXISTS rec_effects (
        id BIGSERIAL PRIMARY KEY, thread_id TEXT NOT NULL, node TEXT NOT NULL,
        pid INTEGER NOT NULL, token BIGINT, at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())""",
]


class State(TypedDict):
    done: Annotated[list[str], operator.add]


_local = threading.local()

# In-process tests hook into nodes: BEFORE[node](state, config) runs after the start row.
BEFORE: dict[str, Any] = {}


def use_dsn(dsn: str) -> None:
    global DSN
    DSN = dsn


def _db(fn: Any) -> Any:
    """Run fn(conn) on this thread's connection, reconnecting when the server dropped it
    (the backend-termination test kills these connections too)."""
    for attempt in range(20):
        conn = getattr(_local, "conn", None)
        try:
            if conn is None or conn.closed or getattr(_local, "dsn", None) != DSN:
                if conn is not None:
                    conn.close()
                conn = _local.conn = psycopg.connect(DSN, autocommit=True)
                _local.dsn = DSN
            return fn(conn)
        except psycopg.OperationalError:
            _local.conn = None
            if attempt == 19:
                raise
            time.sleep(0.1)
    return None


def setup_tables(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for stmt in SCHEMA_SQL:
            conn.execute(stmt)


def _lease(config: Any, thread_id: str) -> tuple[int | None, str | None]:
    saver = config["configurable"].get("__pregel_checkpointer")
    lease = saver.lease_for(thread_id) if hasattr(saver, "lease_for") else None
    return (lease.token, lease.owner) if lease is not None else (None, None)


EFFECT_SQL = "INSERT INTO rec_effects (thread_id, node, pid, token) VALUES (%s, %s, %s, %s)"


def plain_effect(thread_id: str, node: str, token: int | None) -> None:
    """A non-deduplicating insert: every execution leaves a row."""
    _db(lambda c: c.execute(EFFECT_SQL, (thread_id, node, os.getpid(), token)))


# Under a durable saver the effect goes through @idempotent in transactional mode: the
# insert and its ledger record commit together, so a SIGKILL either loses both (the
# resumed node does it again, once) or keeps both (the resumed node replays it). The
# lease token differs per attempt, so it is left out of the call's fingerprint.
@idempotent(transactional=True, exclude=["token"])
def idempotent_effect(thread_id: str, node: str, token: int | None, conn: Any = None) -> bool:
    conn.execute(EFFECT_SQL, (thread_id, node, os.getpid(), token))
    return True


def effect(config: RunnableConfig, thread_id: str, node: str, token: int | None) -> None:
    if isinstance(config["configurable"].get("__pregel_checkpointer"), _DurableBase):
        idempotent_effect(thread_id, node, token)
    else:  # the stock saver has no ledger
        plain_effect(thread_id, node, token)


def make_node(name: str, sleep: float) -> Any:
    def node(state: State, config: RunnableConfig) -> dict[str, Any]:
        thread_id = config["configurable"]["thread_id"]
        token, owner = _lease(config, thread_id)
        log_id = _db(
            lambda c: c.execute(
                "INSERT INTO rec_log (thread_id, node, pid, token, owner) "
                "VALUES (%s, %s, %s, %s, %s) RETURNING id",
                (thread_id, name, os.getpid(), token, owner),
            ).fetchone()[0]
        )
        hook = BEFORE.get(name)
        if hook is not None:
            hook(state, config)
        time.sleep(sleep)
        effect(config, thread_id, name, token)
        _db(lambda c: c.execute("UPDATE rec_log SET t_end = clock_timestamp() WHERE id = %s", (log_id,)))
        return {"done": [f"{name}:{os.getpid()}:{token}"]}

    return node


def make_builder(steps: int, sleep: float) -> StateGraph:
    b = StateGraph(State)
    prev = START
    for i in range(steps):
        b.add_node(f"s{i}", make_node(f"s{i}", sleep))
        b.add_edge(prev, f"s{i}")
        prev = f"s{i}"
    b.add_edge(prev, END)
    return b


STEPS = int(os.environ.get("LGD_STEPS", "5"))
SLEEP = float(os.environ.get("LGD_SLEEP", "0.1"))
builder = make_builder(STEPS, SLEEP)


def _saver(kind: str) -> Any:
    if kind == "stock":
        from langgraph.checkpoint.postgres import PostgresSaver

        return PostgresSaver.from_conn_string(DSN)
    from langgraph_durable import DurablePostgresSaver

    return DurablePostgresSaver.from_conn_string(
        DSN, lease_ttl=float(os.environ.get("LGD_TTL", "30"))
    )


def main(argv: list[str]) -> int:
    mode = argv[0]
    if mode == "worker":
        from langgraph_durable.cli import main as cli_main

        sys.argv = ["langgraph-durable", "worker", "--graph", f"{os.path.abspath(__file__)}:builder",
                    "--dsn", DSN, *argv[1:]]
        cli_main()
        return 0
    if mode == "run":
        pairs = [a.split(":", 1) for a in argv[1:]]
        with _saver("stock") as stock, _saver("durable") as durable:
            graphs = {
                "stock": builder.compile(checkpointer=stock),
                "durable": builder.compile(checkpointer=durable),
            }
            workers = [
                threading.Thread(
                    target=graphs[kind].invoke,
                    args=({"done": []}, {"configurable": {"thread_id": t}}),
                )
                for kind, t in pairs
            ]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
        return 0
    if mode == "resume":
        kind, thread = argv[1], argv[2]
        with _saver(kind) as saver:
            graph = builder.compile(checkpointer=saver)
            # The parent starts every child at once when all are ready (imported,
            # connected): a fixed start time was missed under load by a slow import.
            print("ready", flush=True)
            sys.stdin.readline()
            try:
                out = graph.invoke(None, {"configurable": {"thread_id": thread}})
                print(json.dumps({"ok": True, "done": out["done"]}), flush=True)
            except Exception as exc:
                print(json.dumps({"ok": False, "error": type(exc).__name__}), flush=True)
        return 0
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
