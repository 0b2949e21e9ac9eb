"""A tool-calling agent killed with SIGKILL right after charging a card, then resumed: charged once.

    export LANGGRAPH_DURABLE_DSN=embedded   # or your server's DSN
    CRASH=1 python examples/quickstart.py   # charges the card, then the process is killed
    python examples/quickstart.py           # resumes the thread: the charge is not repeated
"""

import os
import signal

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from langgraph_durable import DurablePostgresSaver, idempotent


@idempotent  # recorded in Postgres: a re-executed task gets the recorded result
def charge_card(card: str, cents: int) -> str:
    print(f"CHARGED {card} {cents}", flush=True)  # the side effect (a payment API in real life)
    return f"receipt-{card}-{cents}"


@tool
def checkout(card: str, cents: int) -> str:
    """Charge the card, then (here) crash before the step's checkpoint is written."""
    receipt = charge_card(card, cents)
    if os.environ.pop("CRASH", None):
        os.kill(os.getpid(), signal.SIGKILL)
    return receipt


def model(state: MessagesState) -> dict:  # a scripted model: asks for the tool, then answers
    if isinstance(state["messages"][-1], HumanMessage):
        call = {"name": "checkout", "args": {"card": "4242", "cents": 500}, "id": "call_1"}
        return {"messages": [AIMessage("", tool_calls=[call])]}
    return {"messages": [AIMessage(f"Paid: {state['messages'][-1].content}")]}


builder = StateGraph(MessagesState)
builder.add_node("model", model)
builder.add_node("tools", ToolNode([checkout]))
builder.add_edge(START, "model")
builder.add_conditional_edges("model", tools_condition)
builder.add_edge("tools", "model")

if __name__ == "__main__":
    # No argument: the DSN in LANGGRAPH_DURABLE_DSN; unset, DsnMissingError says so (never a silent local server).
    with DurablePostgresSaver.from_conn_string() as saver:
        saver.setup()
        graph = builder.compile(checkpointer=saver)
        config = {"configurable": {"thread_id": os.environ.get("THREAD", "order-1")}}
        resume = saver.get_tuple(config) is not None  # it has a checkpoint: resume (docs/foundation.md)
        result = graph.invoke(None if resume else {"messages": [HumanMessage("buy it")]}, config)
        print(("resumed: " if resume else "") + result["messages"][-1].content)
