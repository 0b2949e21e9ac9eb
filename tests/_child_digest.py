"""Child process of tests/test_digest_secret.py (not a test module).

``python _child_digest.py DSN SCHEMA THREAD MODE KEYS [main]``: runs one graph whose
``work`` node calls a journaled model, an ``@idempotent`` ``charge`` and an
``@idempotent`` ``ship``, each recording its effect in ``digest_effects`` (a table, so
the count survives the process). KEYS: hex keys, comma-separated, the current first
(``DurableEncryptedSerializer(current, old=[...])``), ``-`` for none. MODE:

- ``kill``: a new run with a large document in its input (offloaded to an artifact);
  ``ship`` SIGKILLs its own process after its effect, before its result is recorded
  (the model's answer and the charge are recorded; the node's writes are not);
- ``resume``: ``invoke(None)`` on the thread; prints ``{"error": ...}`` or ``{"ok": ...}``.

``main``: keys the digests and fingerprints the way the code before digest27 did (the
secret derived from the oldest key, nothing in ``durable_secrets``), to stand for a
database written by that release.
"""

from __future__ import annotations

import json
import operator
import os
import signal
import sys
from typing import Annotated, Any, TypedDict

import psycopg
from langchain_core.runnables import RunnableLambda
from langgraph.graph import END, START, StateGraph

EFFECTS_DDL = "CREATE TABLE IF NOT EXISTS digest_effects (id BIGSERIAL PRIMARY KEY, thread TEXT, kind TEXT)"
BIG = "a contract about Ada Lovelace, " + "clause " * 200


class State(TypedDict, total=False):
    doc: str
    out: Annotated[list[str], operator.add]


def effects(dsn: str, thread: str) -> dict[str, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(EFFECTS_DDL)
        rows = conn.execute("SELECT kind, count(*) FROM digest_effects WHERE thread = %s GROUP BY kind", (thread,))
        return {k: int(n) for k, n in rows.fetchall()}


def _effect(dsn: str, thread: str, kind: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO digest_effects (thread, kind) VALUES (%s, %s)", (thread, kind))


def build(dsn: str, thread: str, kill: bool) -> Any:
    from langgraph_durable import idempotent, journaled

    effects(dsn, thread)  # creates the effects table

    def answer(messages: Any) -> str:
        _effect(dsn, thread, "model")
        return "the model says yes"

    model = journaled(RunnableLambda(answer), name="model")

    @idempotent(name="charge", claim_ttl=1.0)
    def charge(card: str) -> dict[str, str]:
        _effect(dsn, thread, "charge")
        return {"receipt": "r-" + card[-4:]}

    @idempotent(name="ship", claim_ttl=1.0)
    def ship(order: str) -> str:
        _effect(dsn, thread, "ship")
        if kill:
            os.kill(os.getpid(), signal.SIGKILL)  # after the effect, before the record
        return "shipped " + order

    def work(state: State) -> dict[str, Any]:
        said = model.invoke("may I charge card 4111 1111 1111 1111?")
        receipt = charge("4111 1111 1111 1111")
        return {"out": [said, receipt["receipt"], ship("order-7")]}

    g = StateGraph(State)
    g.add_node("work", work)
    g.add_edge(START, "work")
    g.add_edge("work", END)
    return g


def main() -> None:
    dsn, schema, thread, mode, keys_hex = sys.argv[1:6]
    legacy = sys.argv[6:] == ["main"]
    from langgraph_durable import DurablePostgresSaver
    from langgraph_durable.keyring import DurableEncryptedSerializer, Keyring

    keys = [bytes.fromhex(k) for k in keys_hex.split(",") if k != "-"]
    serde = DurableEncryptedSerializer(keys[0], old=keys[1:]) if keys else None
    effects(dsn, thread)
    with DurablePostgresSaver.from_conn_string(
        dsn, schema=schema, serde=serde, artifact_threshold=256, lease_ttl=1.0,
        on_busy="wait", busy_timeout=30, max_resume_attempts=10,
    ) as saver:
        if legacy and serde is not None:
            ring = Keyring.from_serde(serde)
            assert ring is not None
            saver.codec.digest.set(ring.digest_key())  # what the release before digest27 keyed with
        app = build(dsn, thread, kill=mode == "kill").compile(checkpointer=saver)
        cfg = {"configurable": {"thread_id": thread}}
        if mode == "kill":
            app.invoke({"doc": BIG, "out": []}, cfg)
            raise AssertionError("unreachable: ship kills the process")
        try:
            result = app.invoke(None, cfg)
        except Exception as exc:
            print(json.dumps({"error": type(exc).__name__, "message": str(exc)[:500],
                              "key": getattr(exc, "key", None), "thread_id": getattr(exc, "thread_id", None)}))
            return
        print(json.dumps({"ok": result["out"]}))


if __name__ == "__main__":
    main()
