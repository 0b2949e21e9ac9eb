"""Two real agents for the console walk (tests/test_console_walk.py), importable by a
worker process (``langgraph-durable worker --graph tests/_walk_agent.py:support``).

* ``support`` (graph name ``support-agent``, version ``support-v1``): a model node that
  asks for an ``@idempotent`` tool once (``lookup_order``, run by a ``ToolNode``), then
  drafts a reply and waits on an interrupt (``confirm``) for a person to approve it.
* ``billing`` (``billing-agent``, ``billing-v1``): ``steps`` slow steps (``tick``,
  ``TICK_S`` each: a run long enough to cancel from the console), then ``charge``, which
  raises when the input says ``fail`` (a poison thread: quarantined with its traceback).

The model is scripted (no network): what an LLM would answer, in the messages LangChain
uses, so the console sees what a real tool-calling agent writes."""

from __future__ import annotations

import operator
import time
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import interrupt

from langgraph_durable import idempotent

TICK_S = 0.4


@idempotent
@tool
def lookup_order(order_id: int) -> str:
    """The state of an order."""
    return f"order {order_id}: shipped on 2026-11-30, tracking ZX{order_id}9"


class Support(MessagesState, total=False):
    approved: str


def _model(state: Support) -> dict[str, Any]:
    if not any(isinstance(m, ToolMessage) for m in state["messages"]):
        return {"messages": [AIMessage(
            content="Let me look the order up.",
            tool_calls=[{"id": "call_lookup_1", "name": "lookup_order", "args": {"order_id": 42}}],
        )]}
    return {"messages": [AIMessage(content="Your order 42 shipped on 2026-11-30 (tracking ZX429).")]}


def _route(state: Support) -> str:
    return "tools" if getattr(state["messages"][-1], "tool_calls", None) else "confirm"


def _confirm(state: Support) -> dict[str, Any]:
    answer = interrupt({"question": "send this reply to the customer?",
                        "draft": state["messages"][-1].content})
    return {"approved": str(answer)}


def support(saver: Any, version: str = "support-v1") -> Any:
    b = StateGraph(Support)
    b.add_node("model", _model)
    b.add_node("tools", ToolNode([lookup_order]))
    b.add_node("confirm", _confirm)
    b.add_edge(START, "model")
    b.add_conditional_edges("model", _route, ["tools", "confirm"])
    b.add_edge("tools", "model")
    b.add_edge("confirm", END)
    return b.compile(checkpointer=saver.bind(graph_version=version), name="support-agent")


class Billing(TypedDict, total=False):
    steps: int
    done: int
    fail: bool
    log: Annotated[list[str], operator.add]


def _tick(state: Billing) -> Billing:
    time.sleep(TICK_S)
    return {"done": state.get("done", 0) + 1, "log": [f"tick {state.get('done', 0) + 1}"]}


def _more(state: Billing) -> str:
    return "tick" if state.get("done", 0) < state.get("steps", 0) else "charge"


def _charge(state: Billing) -> Billing:
    if state.get("fail"):
        _provider_call(3)
    return {"log": ["charged"]}


def _provider_call(depth: int) -> None:
    if depth:
        _provider_call(depth - 1)
    raise RuntimeError("payment provider returned 500 (card_declined)")


def billing(saver: Any) -> Any:
    b = StateGraph(Billing)
    b.add_node("tick", _tick)
    b.add_node("charge", _charge)
    b.add_conditional_edges(START, _more, ["tick", "charge"])
    b.add_conditional_edges("tick", _more, ["tick", "charge"])
    b.add_edge("charge", END)
    return b.compile(checkpointer=saver.bind(graph_version="billing-v1"), name="billing-agent")
