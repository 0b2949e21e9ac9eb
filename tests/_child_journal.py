"""Child process of tests/test_journal.py (not a test module).

``python _child_journal.py DSN THREAD TAG MODE JOURNAL KILL``: runs one graph whose
``agent`` node calls a chat model that gives a different answer on every call (its
counter is a Postgres table, so it survives the death of the process), then SIGKILLs
its own process where KILL says:

- ``after``: in the node, after the model call returned, before the node's writes
  reach a checkpoint (the window the journal is for);
- ``inside``: in the model, after it answered, before the answer could be recorded
  (the ledger keeps a dead claim: the resume must call the model again, not fail).

MODE: ``invoke`` / ``stream`` (sync graph, DurablePostgresSaver), ``ainvoke`` /
``astream`` (async graph, AsyncDurablePostgresSaver), ``tools`` (agent -> ToolNode ->
agent; the kill is in the second agent turn). JOURNAL: ``1`` wraps the model in
``journaled``, ``0`` uses it as is, ``stock`` uses it as is with the stock PostgresSaver.
"""

from __future__ import annotations

import asyncio
import operator
import os
import signal
import sys
from collections.abc import Iterator
from typing import Annotated, Any

import psycopg
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    ToolMessage,
)
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

CALLS_DDL = """
CREATE TABLE IF NOT EXISTS journal_model_calls (
    id BIGSERIAL PRIMARY KEY, tag TEXT NOT NULL, answer TEXT NOT NULL, pid INTEGER NOT NULL)
"""
TOOLS_DDL = "CREATE TABLE IF NOT EXISTS journal_tool_runs (id BIGSERIAL PRIMARY KEY, tag TEXT, q TEXT)"


def create_tables(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(CALLS_DDL)
        conn.execute(TOOLS_DDL)


def answers(dsn: str, tag: str) -> list[str]:
    """Every answer the model gave for ``tag``, in call order (one per model call)."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT answer FROM journal_model_calls WHERE tag = %s ORDER BY id", (tag,))
        return [r[0] for r in rows.fetchall()]


def tool_runs(dsn: str, tag: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT q FROM journal_tool_runs WHERE tag = %s ORDER BY id", (tag,))
        return [r[0] for r in rows.fetchall()]


class CountingModel(BaseChatModel):
    """A chat model whose n-th call (over all processes) answers ``answer n``.

    With ``tools=True`` a human turn gets a tool call whose arguments carry n too, a
    tool result gets a plain answer. ``kill_inside``: die after answering, before the
    caller sees the answer."""

    dsn: str
    tag: str
    tools: bool = False
    kill_inside: bool = False

    def _answer(self, messages: list[BaseMessage]) -> AIMessage:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) + 1 FROM journal_model_calls WHERE tag = %s", (self.tag,)
            ).fetchone()
            assert row is not None
            text = f"answer {row[0]}"
            conn.execute(
                "INSERT INTO journal_model_calls (tag, answer, pid) VALUES (%s, %s, %s)",
                (self.tag, text, os.getpid()),
            )
        if self.kill_inside:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.tools and isinstance(messages[-1], HumanMessage):
            n = text.split()[-1]
            call = {"name": "lookup", "args": {"q": f"q{n}"}, "id": f"call_{n}", "type": "tool_call"}
            return AIMessage(content=text, tool_calls=[call])
        return AIMessage(content=text)

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self._answer(messages))])

    def _stream(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> Iterator[ChatGenerationChunk]:
        msg = self._answer(messages)
        words = str(msg.content).split(" ")
        for i, word in enumerate(words):
            last = i == len(words) - 1
            yield ChatGenerationChunk(
                message=AIMessageChunk(content=word if last else word + " ", chunk_position="last" if last else None)
            )

    def bind_tools(self, tools: Any, **kw: Any) -> Any:
        return self.bind(tools=[getattr(t, "name", str(t)) for t in tools], **kw)

    @property
    def _llm_type(self) -> str:
        return "counting"


class State(MessagesState):
    chunks: Annotated[list[int], operator.add]


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def build(saver: Any, dsn: str, tag: str, mode: str, *, journal: bool, kill: str = "") -> Any:
    """The graph of MODE; ``kill`` as in the module docstring ("" for the resume)."""
    from langgraph_durable import journaled

    model: Any = CountingModel(dsn=dsn, tag=tag, tools=mode == "tools", kill_inside=kill == "inside")
    if journal:
        model = journaled(model)

    @tool
    def lookup(q: str) -> str:
        """Look something up."""
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO journal_tool_runs (tag, q) VALUES (%s, %s)", (tag, q))
        return f"found {q}"

    bound = model.bind_tools([lookup]) if mode == "tools" else model

    def agent(state: State) -> dict[str, Any]:
        if mode == "stream":
            chunks = list(bound.stream(state["messages"]))
            total = chunks[0]
            for c in chunks[1:]:
                total = total + c
            msg: BaseMessage = AIMessage(content=total.content)
            out: dict[str, Any] = {"messages": [msg], "chunks": [len(chunks)]}
        else:
            msg = bound.invoke(state["messages"])
            out = {"messages": [msg]}
        second_turn = isinstance(state["messages"][-1], ToolMessage)
        if kill == "after" and (mode != "tools" or second_turn):
            _kill()
        return out

    async def aagent(state: State) -> dict[str, Any]:
        if mode == "astream":
            chunks = [c async for c in bound.astream(state["messages"])]
            total = chunks[0]
            for c in chunks[1:]:
                total = total + c
            out: dict[str, Any] = {"messages": [AIMessage(content=total.content)], "chunks": [len(chunks)]}
        else:
            out = {"messages": [await bound.ainvoke(state["messages"])]}
        if kill == "after":
            _kill()
        return out

    builder = StateGraph(State)
    builder.add_node("agent", aagent if mode in ("ainvoke", "astream") else agent)
    builder.add_edge(START, "agent")
    if mode == "tools":
        builder.add_node("tools", ToolNode([lookup], handle_tool_errors=False))
        builder.add_conditional_edges("agent", tools_condition)
        builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=saver)


def main() -> None:
    from langgraph_durable import AsyncDurablePostgresSaver, DurablePostgresSaver

    dsn, thread_id, tag, mode, journal, kill = sys.argv[1:7]
    config = {"configurable": {"thread_id": thread_id}}
    inputs = {"messages": [HumanMessage("hello")], "chunks": []}
    if journal == "stock":
        from langgraph.checkpoint.postgres import PostgresSaver

        with PostgresSaver.from_conn_string(dsn) as stock:
            build(stock, dsn, tag, mode, journal=False, kill=kill).invoke(inputs, config)
    elif mode in ("ainvoke", "astream"):

        async def run() -> None:
            async with AsyncDurablePostgresSaver.from_conn_string(dsn, lease_ttl=1.0) as saver:
                app = build(saver, dsn, tag, mode, journal=journal == "1", kill=kill)
                await app.ainvoke(inputs, config)

        asyncio.run(run())
    else:
        with DurablePostgresSaver.from_conn_string(dsn, lease_ttl=1.0) as saver:
            build(saver, dsn, tag, mode, journal=journal == "1", kill=kill).invoke(inputs, config)
    raise SystemExit("the child was expected to die")


if __name__ == "__main__":
    main()
