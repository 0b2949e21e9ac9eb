"""Child process and graphs of tests/test_safety_together.py (not a test module).

``python _child_safety.py agent DSN THREAD``: one turn of a tool-calling agent (a
scripted model -> ``ToolNode`` -> model) whose ``@idempotent`` tool ``charge`` records
its effect in ``safety_effects`` and then hangs, so the parent SIGKILLs the process
inside the tool: between the effect and its record (the claim stays behind).

``python _child_safety.py keyed DSN KEY NAME ORDER CLAIM_TTL``: outside a run, an
``@idempotent(key=KEY, name=NAME, claim_ttl=CLAIM_TTL)`` call hanging inside the function
(see ``keyed``).

``python _child_safety.py slow DSN THREAD``: a one-node graph whose node signals that it
runs (a row in ``safety_effects``) and hangs there; the parent SIGKILLs it holding the
lease.

``lease_ttl`` 30 s (the default) unless ``SAFETY_LEASE_TTL`` says otherwise: the point
is what happens before it runs out.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TypedDict

import psycopg
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

TABLE_DDL = (
    "CREATE TABLE IF NOT EXISTS safety_effects ("
    "id BIGSERIAL PRIMARY KEY, thread_id TEXT NOT NULL, tag TEXT NOT NULL, pid INTEGER NOT NULL)"
)


class ScriptedModel(BaseChatModel):
    """Asks for one ``charge`` call, then answers once it sees the tool's reply."""

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        if isinstance(messages[-1], ToolMessage):
            msg = AIMessage(content=f"done: {messages[-1].content}")
        else:
            call = {"name": "charge", "args": {"order": "o-1", "amount": 5}, "id": "call_0", "type": "tool_call"}
            msg = AIMessage(content="", tool_calls=[call])
        return ChatResult(generations=[ChatGeneration(message=msg)])

    @property
    def _llm_type(self) -> str:
        return "scripted"


def effects(dsn: str, thread_id: str, tag: str | None = None) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM safety_effects WHERE thread_id = %s AND (%s::text IS NULL OR tag = %s)",
            (thread_id, tag, tag),
        ).fetchone()
    assert row is not None
    return int(row[0])


def _effect(dsn: str, thread_id: str, tag: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(TABLE_DDL)
        conn.execute(
            "INSERT INTO safety_effects (thread_id, tag, pid) VALUES (%s, %s, %s)",
            (thread_id, tag, os.getpid()),
        )


def agent_builder(dsn: str, *, hang: bool) -> StateGraph:
    from langgraph.config import get_config

    from langgraph_durable import idempotent

    @tool
    def charge(order: str, amount: int) -> str:
        """Charge the card for an order."""
        _effect(dsn, get_config()["configurable"]["thread_id"], "charge")
        if hang:
            time.sleep(600)  # SIGKILLed in here: the effect happened, its record did not
        return f"charged {order} {amount}"

    model = ScriptedModel()

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([idempotent(charge)]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder


class Counter(TypedDict):
    n: int


def slow_builder(dsn: str, *, hang: bool) -> StateGraph:
    from langgraph.config import get_config

    def slow(state: Counter) -> dict[str, int]:
        _effect(dsn, get_config()["configurable"]["thread_id"], "slow")
        if hang:
            time.sleep(600)  # SIGKILLed in here, holding the lease
        return {"n": state["n"] + 1}

    builder = StateGraph(Counter)
    builder.add_node("slow", slow)
    builder.add_edge(START, "slow")
    builder.add_edge("slow", END)
    return builder


def keyed(saver: Any, dsn: str, *, key: str, name: str, order: str, claim_ttl: float) -> None:
    """Outside a run: an ``@idempotent(key=...)`` call named ``name``, SIGKILLed by the
    parent inside the function (its effect row is tagged with the key as thread id)."""
    from langgraph_durable import idempotent

    @idempotent(ledger=saver, key=lambda order: key, name=name, claim_ttl=claim_ttl)
    def call(order: str) -> str:
        _effect(dsn, key, name)
        time.sleep(600)
        return order

    call(order)


# For `langgraph-durable worker --graph tests/_child_safety.py:worker_graph`: the slow
# graph, not hanging (same topology, so the same graph version as the killed run's).
worker_graph = slow_builder(os.environ.get("SAFETY_DSN", ""), hang=False)


def main() -> None:
    from langchain_core.messages import HumanMessage

    from langgraph_durable import DurablePostgresSaver

    mode, dsn, thread_id = sys.argv[1:4]
    config = {"configurable": {"thread_id": thread_id}}
    # SAFETY_LEASE_TTL: longer than the default 30 s where a test must tell "judged at
    # once" from "waited out" with a wide margin, or keep a frozen owner's lease live.
    ttl = float(os.environ.get("SAFETY_LEASE_TTL", "30"))
    with DurablePostgresSaver.from_conn_string(dsn, lease_ttl=ttl) as saver:
        if mode == "agent":
            app = agent_builder(dsn, hang=True).compile(checkpointer=saver)
            app.invoke({"messages": [HumanMessage("charge order o-1")]}, config)
        elif mode == "slow":
            app = slow_builder(dsn, hang=True).compile(checkpointer=saver)
            app.invoke({"n": 1}, config)
        elif mode == "keyed":
            keyed(saver, dsn, key=thread_id, name=sys.argv[4], order=sys.argv[5], claim_ttl=float(sys.argv[6]))
        else:
            raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
