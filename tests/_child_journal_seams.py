"""Graphs of tests/test_journal_seams.py, and its child process (not a test module).

``python _child_journal_seams.py DSN THREAD MODE``: runs MODE's graph in this process,
then SIGKILLs it where MODE says (the parent resumes the thread with ``build(...)``):

- ``stream-raise`` / ``astream-raise``: the node's consumer of a journaled stream raises
  after two chunks (and the node catches it); killed before the node's checkpoint;
- ``stream-break`` / ``astream-break``: the consumer stops after the first chunk;
  killed the same way;
- ``parse-error``: ``journaled(model) | JsonOutputParser()``, no ``RetryPolicy``: the
  model's answer is not JSON, the run ends with the parser's error (LangGraph stores it
  as the task's ``__error__`` write), then the process dies;
- ``parse-retry``: the same with ``RetryPolicy``: the retry gets valid JSON, and the
  process dies after the node parsed it, before its checkpoint.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

from langchain_core.exceptions import OutputParserException
from langchain_core.language_models.fake_chat_models import FakeListChatModel, GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.output_parsers import JsonOutputParser
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import RetryPolicy

WHOLE = "alpha beta gamma delta"


class Words(GenericFakeChatModel):
    """Streams ``alpha``, `` ``, ``beta``, ... on every call; counts its calls (an
    ``astream`` runs ``_stream`` in an executor: counted there too)."""

    calls: list[str] = []

    def _stream(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any) -> Iterator[Any]:
        self.calls.append("stream")
        yield from super()._stream(messages, stop, run_manager, **kw)


def words() -> Words:
    return Words(messages=iter([AIMessage(WHOLE)] * 100), calls=[])


class Answers(FakeListChatModel):
    """``FakeListChatModel`` that records each answer it gives."""

    given: list[str] = []

    def _call(self, *args: Any, **kwargs: Any) -> str:
        answer = super()._call(*args, **kwargs)
        self.given.append(answer)
        return answer


def answers(*responses: str) -> Answers:
    return Answers(responses=list(responses), given=[])


class ConsumerGone(Exception):
    """The code consuming the stream failed (a closed websocket, say)."""


def consume(stream: Iterator[Any], stop: str) -> str:
    """The text the consumer saw: all of it, or up to where ``stop`` makes it leave."""
    seen: list[str] = []
    try:
        for chunk in stream:
            seen.append(str(chunk.content))
            if stop == "break":
                break
            if stop == "raise" and len(seen) == 2:
                raise ConsumerGone("the client went away")
    except ConsumerGone:
        pass
    return "".join(seen)


async def aconsume(stream: Any, stop: str) -> str:
    seen: list[str] = []
    try:
        async for chunk in stream:
            seen.append(str(chunk.content))
            if stop == "break":
                break
            if stop == "raise" and len(seen) == 2:
                raise ConsumerGone("the client went away")
    except ConsumerGone:
        pass
    return "".join(seen)


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def build_stream(saver: Any, model: Any, *, asynchronous: bool, stop: str, kill: bool = False) -> Any:
    """One node that streams from the journaled ``model`` and returns what it saw."""
    from langgraph_durable import journaled

    jm = journaled(model)

    def node(state: MessagesState) -> dict[str, Any]:
        text = consume(jm.stream(state["messages"]), stop)
        if kill:
            _kill()
        return {"messages": [AIMessage(text)]}

    async def anode(state: MessagesState) -> dict[str, Any]:
        stream = jm.astream(state["messages"])
        text = await aconsume(stream, stop)
        await stream.aclose()  # type: ignore[attr-defined]  # a break leaves it open
        if kill:
            _kill()
        return {"messages": [AIMessage(text)]}

    builder = StateGraph(MessagesState)
    builder.add_node("n", anode if asynchronous else node)
    builder.add_edge(START, "n")
    builder.add_edge("n", END)
    return builder.compile(checkpointer=saver)


def build_parse(saver: Any, model: Any, *, retry: bool, kill_after_parse: bool = False, journal: bool = True) -> Any:
    """One node: ``journaled(model) | JsonOutputParser()``; with ``RetryPolicy`` on the
    parser's error when ``retry``."""
    from langgraph_durable import journaled

    chain = (journaled(model) if journal else model) | JsonOutputParser()

    def node(state: MessagesState) -> dict[str, Any]:
        parsed = chain.invoke(state["messages"])
        if kill_after_parse:
            _kill()
        return {"messages": [AIMessage(f"parsed {parsed}")]}

    policy = RetryPolicy(max_attempts=3, initial_interval=0.01, jitter=False, retry_on=OutputParserException)
    builder = StateGraph(MessagesState)
    builder.add_node("n", node, retry_policy=policy if retry else None)
    builder.add_edge(START, "n")
    builder.add_edge("n", END)
    return builder.compile(checkpointer=saver)


HELLO = {"messages": [HumanMessage("hello")]}


def main() -> None:
    from langgraph_durable import AsyncDurablePostgresSaver, DurablePostgresSaver

    dsn, thread_id, mode = sys.argv[1:4]
    config = {"configurable": {"thread_id": thread_id}}
    kind, _, stop = mode.partition("-")
    if kind == "astream":

        async def run() -> None:
            async with AsyncDurablePostgresSaver.from_conn_string(dsn, lease_ttl=1.0) as saver:
                app = build_stream(saver, words(), asynchronous=True, stop=stop, kill=True)
                await app.ainvoke(HELLO, config)

        asyncio.run(run())
    with DurablePostgresSaver.from_conn_string(dsn, lease_ttl=1.0) as saver:
        if kind == "stream":
            build_stream(saver, words(), asynchronous=False, stop=stop, kill=True).invoke(HELLO, config)
        elif mode == "parse-error":
            try:
                build_parse(saver, answers("not json"), retry=False).invoke(HELLO, config)
            except OutputParserException:
                _kill()  # the run failed and was recorded as failed; then the worker died
        elif mode == "parse-retry":
            model = answers("not json", '{"ok": 1}')
            build_parse(saver, model, retry=True, kill_after_parse=True).invoke(HELLO, config)
    raise SystemExit("the child was expected to die")


if __name__ == "__main__":
    main()
