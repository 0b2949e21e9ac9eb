"""Child process of tests/test_seams_idem.py (not a test module).

``python _child_seams_idem.py DSN THREAD``: runs one agent turn whose ToolNode makes two
parallel calls, ``send_email`` (call_0, idempotent) and ``slow`` (call_1, a bare tool, so
it leaves no claim of its own). ``slow`` waits until the email's ledger record is
completed, then SIGKILLs its own process: the tools task dies after one effect was
recorded and before the task's writes reached the checkpoint.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

import psycopg
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from psycopg.sql import SQL, Identifier

TABLE = "seams_emails"


class PerMessageIds(BaseChatModel):
    """Numbers tool calls per message: call_0 and call_1 on every turn."""

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any) -> ChatResult:
        if isinstance(messages[-1], HumanMessage):
            msg = AIMessage(
                content="",
                tool_calls=[
                    {"name": "send_email", "args": {"to": "a@x"}, "id": "call_0", "type": "tool_call"},
                    {"name": "slow", "args": {"q": "s"}, "id": "call_1", "type": "tool_call"},
                ],
            )
        else:
            msg = AIMessage(content="done")
        return ChatResult(generations=[ChatGeneration(message=msg)])

    @property
    def _llm_type(self) -> str:
        return "per-message-ids"


def create_table(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            SQL("CREATE TABLE IF NOT EXISTS {} (id BIGSERIAL PRIMARY KEY, thread_id TEXT, recipient TEXT)").format(
                Identifier(TABLE)
            )
        )


def emails(dsn: str, thread_id: str) -> int:
    with psycopg.connect(dsn) as conn:
        query = SQL("SELECT count(*) FROM {} WHERE thread_id = %s").format(Identifier(TABLE))
        row = conn.execute(query, (thread_id,)).fetchone()
        assert row is not None
        return int(row[0])


def build(saver: Any, dsn: str, *, kill: bool) -> Any:
    from langgraph.config import get_config

    from langgraph_durable import idempotent

    @tool
    def send_email(to: str) -> str:
        """Send an email."""
        thread_id = get_config()["configurable"]["thread_id"]
        with psycopg.connect(dsn, autocommit=True) as conn:
            insert = SQL("INSERT INTO {} (thread_id, recipient) VALUES (%s, %s)").format(Identifier(TABLE))
            conn.execute(insert, (thread_id, to))
        return f"sent to {to}"

    @tool
    def slow(q: str) -> str:
        """Work that outlives the email."""
        if kill:
            thread_id = get_config()["configurable"]["thread_id"]
            with psycopg.connect(dsn, autocommit=True) as conn:
                for _ in range(3000):
                    row = conn.execute(
                        "SELECT count(*) FROM durable_ledger WHERE thread_id = %s "
                        "AND name = 'send_email' AND status = 'completed'",
                        (thread_id,),
                    ).fetchone()
                    if row and row[0]:
                        os.kill(os.getpid(), signal.SIGKILL)
                    time.sleep(0.01)
            raise RuntimeError("the email was never recorded")
        return f"found {q}"

    model = PerMessageIds()

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([idempotent(send_email), slow], handle_tool_errors=False))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=saver)


def main() -> None:
    from langgraph_durable import DurablePostgresSaver

    dsn, thread_id = sys.argv[1], sys.argv[2]
    with DurablePostgresSaver.from_conn_string(dsn, lease_ttl=1.0) as saver:
        app = build(saver, dsn, kill=True)
        app.invoke({"messages": [HumanMessage("email a")]}, {"configurable": {"thread_id": thread_id}})
    raise SystemExit("the child was expected to die inside its tools task")


if __name__ == "__main__":
    main()
