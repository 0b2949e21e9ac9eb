"""Child process of the @idempotent crash tests (not a test module).

Modes (the DSN comes from the ``IDEM_DSN`` environment variable):

``chaos SPEC_JSON``
    Runs several pipeline threads at once, each in its own Python thread, so one SIGKILL
    lands at a different point of every thread's run (LangGraph's 1-2 s import is paid
    once per kill, not once per kill point). SPEC_JSON: ``{"mode": "package" | "stock"
    | "tx", "threads": [[thread_id, order], ...], "lease_ttl": 1.5}``.

    The pipeline has 8 nodes; each makes one payment-like INSERT into ``payments`` (no
    unique constraint: the table never deduplicates) and then keeps working (sleeps)
    inside the node, which is where a kill makes the stock saver re-run the node.
    ``package``: ``@idempotent`` around the payment, DurablePostgresSaver.
    ``stock``: the stock PostgresSaver, no wrapper.
    ``tx``: ``@idempotent(transactional=True)``: the INSERT runs on the ledger's
    transaction and the function sleeps *inside* that transaction, so kills land inside
    the function; every entry into the function is logged in ``tx_attempts`` on its own
    autocommitted connection (so the parent can count the kills that hit it).

    An ``OutcomeUnknownError`` (killed between the payment and its record) is handled
    the way the docs tell an operator to: look the payment up by its idempotency key in
    the receiving table, then ``Ledger.resolve`` (it happened) or ``Ledger.forget`` (it
    did not), and resume. Prints ``READY``, then one JSON line per event.

``unknown-graph THREAD_ID``
    A one-node durable graph whose ``@idempotent`` payment SIGKILLs its own process right
    after the effect, before the result is recorded.

``unknown-key KEY``
    Outside any run: an ``@idempotent(key=...)`` refund that writes to a deduplicating
    receiver and to a plain log, then SIGKILLs its own process.
"""

from __future__ import annotations

import json
import operator
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from psycopg_pool import ConnectionPool

DSN = os.environ.get("IDEM_DSN", "")
N_NODES = 8
NODE_SLEEP = 0.12  # work after the payment, inside the node (package / stock)
TX_SLEEP = 0.08  # work inside the transactional function
TX_NODE_SLEEP = 0.03

DDL = [
    """CREATE TABLE IF NOT EXISTS payments (
        id BIGSERIAL PRIMARY KEY,
        thread_id TEXT NOT NULL,
        order_id TEXT NOT NULL,
        step INTEGER NOT NULL,
        amount INTEGER NOT NULL,
        idem_key TEXT,
        pid INTEGER NOT NULL,
        at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
    )""",
    """CREATE TABLE IF NOT EXISTS tx_attempts (
        id BIGSERIAL PRIMARY KEY,
        thread_id TEXT NOT NULL,
        step INTEGER NOT NULL,
        pid INTEGER NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS effects (
        id BIGSERIAL PRIMARY KEY,
        tag TEXT NOT NULL,
        idem_key TEXT,
        pid INTEGER NOT NULL
    )""",
    # A receiver that deduplicates on the Idempotency-Key it is handed.
    """CREATE TABLE IF NOT EXISTS receiver (
        idem_key TEXT PRIMARY KEY,
        body TEXT NOT NULL
    )""",
]


def create_tables(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for stmt in DDL:
            conn.execute(stmt)


class State(TypedDict):
    order: str
    receipts: Annotated[list[str], operator.add]


def receipt(order: str, step: int, amount: int) -> dict[str, str]:
    return {"receipt": f"{order}:{step}:{amount}"}


def build_pipeline(charge: Callable[..., dict[str, str]], node_sleep: float) -> StateGraph:
    builder = StateGraph(State)

    def make(i: int) -> Callable[[State, RunnableConfig], dict[str, Any]]:
        def node(state: State, config: RunnableConfig) -> dict[str, Any]:
            thread_id = config["configurable"]["thread_id"]
            r = charge(thread_id, state["order"], i, 100 + i)
            time.sleep(node_sleep)  # keeps working inside the node after the effect
            return {"receipts": [r["receipt"]]}

        return node

    for i in range(N_NODES):
        builder.add_node(f"step{i}", make(i))
    builder.add_edge(START, "step0")
    for i in range(N_NODES - 1):
        builder.add_edge(f"step{i}", f"step{i + 1}")
    builder.add_edge(f"step{N_NODES - 1}", END)
    return builder


def emit(**event: Any) -> None:
    sys.stdout.write(json.dumps(event, default=str) + "\n")
    sys.stdout.flush()


def chaos(spec: dict[str, Any]) -> None:
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    from langgraph_durable import (
        DurablePostgresSaver,
        Ledger,
        OutcomeUnknownError,
        ThreadBusyError,
        idempotent,
    )

    mode = spec["mode"]
    effects = ConnectionPool(DSN, min_size=1, max_size=4, kwargs={"autocommit": True}, open=True)

    def pay(thread_id: str, order: str, step: int, amount: int, key: str | None) -> None:
        with effects.connection() as conn:
            conn.execute(
                "INSERT INTO payments (thread_id, order_id, step, amount, idem_key, pid) "
                "VALUES (%s, %s, %s, %s, %s, %s)",
                (thread_id, order, step, amount, key, os.getpid()),
            )

    def stock_charge(thread_id: str, order: str, step: int, amount: int) -> dict[str, str]:
        pay(thread_id, order, step, amount, None)
        return receipt(order, step, amount)

    @idempotent
    def charge(
        thread_id: str, order: str, step: int, amount: int, idempotency_key: str
    ) -> dict[str, str]:
        pay(thread_id, order, step, amount, idempotency_key)
        return receipt(order, step, amount)

    @idempotent(transactional=True)
    def charge_tx(
        conn: psycopg.Connection[Any],
        thread_id: str,
        order: str,
        step: int,
        amount: int,
        idempotency_key: str,
    ) -> dict[str, str]:
        with effects.connection() as log:
            log.execute(
                "INSERT INTO tx_attempts (thread_id, step, pid) VALUES (%s, %s, %s)",
                (thread_id, step, os.getpid()),
            )
        conn.execute(
            "INSERT INTO payments (thread_id, order_id, step, amount, idem_key, pid) "
            "VALUES (%s, %s, %s, %s, %s, %s)",
            (thread_id, order, step, amount, idempotency_key, os.getpid()),
        )
        time.sleep(TX_SLEEP)  # still inside the function (and its transaction)
        return receipt(order, step, amount)

    saver: Any
    if mode == "stock":
        pool = ConnectionPool(
            DSN,
            min_size=1,
            max_size=6,
            kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
            open=True,
        )
        saver = PostgresSaver(pool)  # type: ignore[arg-type]
        app = build_pipeline(stock_charge, NODE_SLEEP).compile(checkpointer=saver)
        cm = None
    else:
        cm = DurablePostgresSaver.from_conn_string(
            DSN,
            pool_size=8 if mode == "tx" else 6,
            lease_ttl=spec.get("lease_ttl", 1.5),
            on_busy="wait",
            busy_timeout=30.0,
            # Random kills hit the same checkpoint again and again: not a poison.
            max_resume_attempts=10_000,
        )
        saver = cm.__enter__()
        if mode == "tx":
            app = build_pipeline(charge_tx, TX_NODE_SLEEP).compile(checkpointer=saver)
        else:
            app = build_pipeline(charge, NODE_SLEEP).compile(checkpointer=saver)
    ledger = Ledger(saver) if mode != "stock" else None

    def reconcile(key: str) -> bool:
        """The operator's procedure for an unknown outcome: ask the receiver."""
        assert ledger is not None
        with effects.connection() as conn:
            row = conn.execute(
                "SELECT order_id, step, amount FROM payments WHERE idem_key = %s LIMIT 1", (key,)
            ).fetchone()
        if row is not None:
            ledger.resolve(key, receipt(row[0], row[1], row[2]))
            return True
        ledger.forget(key)
        return False

    def drive(thread_id: str, order: str) -> None:
        cfg: RunnableConfig = {"configurable": {"thread_id": thread_id}}
        while True:
            try:
                # Always run: "no next node" can also mean the last task's writes are
                # saved but the next checkpoint is not (durability "async").
                snap = app.get_state(cfg)
                app.invoke(None if snap.values else {"order": order, "receipts": []}, cfg)
                final = app.get_state(cfg)
                if not final.next and not final.tasks:
                    emit(event="done", thread_id=thread_id, state=final.values)
                    return
            except OutcomeUnknownError as exc:
                found = reconcile(exc.key)
                emit(event="unknown", thread_id=thread_id, key=exc.key, found=found)
            except ThreadBusyError:
                time.sleep(0.2)
            except Exception as exc:  # reported, then retried: the parent sees it
                emit(event="error", thread_id=thread_id, error=f"{type(exc).__name__}: {exc}")
                time.sleep(0.2)

    emit(event="READY")
    workers = [threading.Thread(target=drive, args=(t, o)) for t, o in spec["threads"]]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if cm is not None:
        cm.__exit__(None, None, None)
    effects.close()


def unknown_graph(thread_id: str) -> None:
    from langgraph_durable import DurablePostgresSaver, idempotent

    @idempotent(name="pay_once", claim_ttl=1.0)
    def pay_once(order: str) -> dict[str, str]:
        with psycopg.connect(DSN, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO effects (tag, pid) VALUES (%s, %s)", (f"pay:{order}", os.getpid())
            )
        os.kill(os.getpid(), signal.SIGKILL)  # dies between the effect and the record
        raise AssertionError("unreachable")

    builder = StateGraph(State)
    builder.add_node("pay", lambda s: {"receipts": [pay_once(s["order"])["receipt"]]})
    builder.add_edge(START, "pay")
    builder.add_edge("pay", END)
    with DurablePostgresSaver.from_conn_string(DSN, lease_ttl=1.0) as saver:
        app = builder.compile(checkpointer=saver)
        emit(event="READY")
        app.invoke({"order": "o-1", "receipts": []}, {"configurable": {"thread_id": thread_id}})


def unknown_key(key: str) -> None:
    from langgraph_durable import DurablePostgresSaver, idempotent

    with DurablePostgresSaver.from_conn_string(DSN) as saver:

        @idempotent(ledger=saver, key=lambda order: key, name="refund", claim_ttl=1.0)
        def refund(order: str, idempotency_key: str) -> str:
            with psycopg.connect(DSN, autocommit=True) as conn:
                conn.execute(
                    "INSERT INTO effects (tag, idem_key, pid) VALUES (%s, %s, %s)",
                    ("refund", idempotency_key, os.getpid()),
                )
                conn.execute(
                    "INSERT INTO receiver (idem_key, body) VALUES (%s, %s) "
                    "ON CONFLICT (idem_key) DO NOTHING",
                    (idempotency_key, f"refund {order}"),
                )
            os.kill(os.getpid(), signal.SIGKILL)
            raise AssertionError("unreachable")

        emit(event="READY")
        refund("o-9")


def main() -> None:
    mode = sys.argv[1]
    if mode == "chaos":
        chaos(json.loads(sys.argv[2]))
    elif mode == "unknown-graph":
        unknown_graph(sys.argv[2])
    elif mode == "unknown-key":
        unknown_key(sys.argv[2])
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
