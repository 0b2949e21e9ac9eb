"""Issue 16, journaled model calls: a re-executed node reads its recorded model answers.

The model in these tests answers differently on every call (``answer n``, its counter a
Postgres table that survives the death of a process), so whether a resumed node saw
the answer of the run that crashed, or a new one, is visible in the state. The crash
tests SIGKILL a real child process (tests/_child_journal.py) and resume in this one.
Every test talks to the real PostgreSQL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command, RetryPolicy, interrupt
from pydantic import BaseModel

from langgraph_durable import (
    AsyncDurablePostgresSaver,
    ConfigurationError,
    DurablePostgresSaver,
    JournaledRunnable,
    Ledger,
    NoLedgerError,
    idempotent,
    journaled,
)

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = os.path.join(HERE, "_child_journal.py")
sys.path.insert(0, HERE)
import _child_journal as child  # noqa: E402

HELLO = {"messages": [HumanMessage("hello")], "chunks": []}


def k(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def cfg(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


@pytest.fixture(scope="module")
def tables(dsn: str) -> str:
    child.create_tables(dsn)
    return dsn


def crash(dsn: str, mode: str, journal: str, kill: str = "after") -> tuple[str, str]:
    """Run MODE in a child that SIGKILLs itself; returns (thread, tag)."""
    thread, tag = k(mode), uuid.uuid4().hex[:10]
    proc = subprocess.run(
        [sys.executable, CHILD, dsn, thread, tag, mode, journal, kill], timeout=180, capture_output=True
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-3000:]
    return thread, tag


def last_ai(out: dict[str, Any]) -> str:
    return str([m for m in out["messages"] if isinstance(m, AIMessage)][-1].content)


# --- SIGKILL after the model call, before the checkpoint -------------------------------


@pytest.mark.parametrize("mode", ["invoke", "stream"])
def test_sigkill_after_the_model_call_resume_replays_the_first_answer(
    saver: DurablePostgresSaver, tables: str, mode: str
) -> None:
    thread, tag = crash(tables, mode, "1")
    assert child.answers(tables, tag) == ["answer 1"]  # the crashed run's call
    out = child.build(saver, tables, tag, mode, journal=True).invoke(None, cfg(thread))
    assert last_ai(out) == "answer 1"  # the resumed node saw the FIRST answer
    assert child.answers(tables, tag) == ["answer 1"]  # and the model was not called again
    if mode == "stream":
        assert out["chunks"] == [1]  # replayed as the recorded sum, one chunk
    (entry,) = Ledger(saver).entries(thread_id=thread)
    assert entry.key.startswith("llm:") and entry.status == "completed"


@pytest.mark.parametrize("mode", ["ainvoke", "astream"])
async def test_async_sigkill_after_the_model_call_resume_replays_the_first_answer(
    asaver: AsyncDurablePostgresSaver, tables: str, mode: str
) -> None:
    thread, tag = crash(tables, mode, "1")
    assert child.answers(tables, tag) == ["answer 1"]
    out = await child.build(asaver, tables, tag, mode, journal=True).ainvoke(None, cfg(thread))
    assert last_ai(out) == "answer 1"
    assert child.answers(tables, tag) == ["answer 1"]


@pytest.mark.parametrize("journal", ["0", "stock"])
def test_unjournaled_model_is_called_again_on_resume(
    saver: DurablePostgresSaver, tables: str, journal: str
) -> None:
    """The stock behaviour the package prevents: same crash, plain model, the resumed
    node calls the model again and sees a different answer (package saver or stock
    PostgresSaver alike: checkpointing alone cannot help)."""
    thread, tag = crash(tables, "invoke", journal)
    if journal == "stock":
        from langgraph.checkpoint.postgres import PostgresSaver

        with PostgresSaver.from_conn_string(tables) as stock:
            out = child.build(stock, tables, tag, "invoke", journal=False).invoke(None, cfg(thread))
    else:
        out = child.build(saver, tables, tag, "invoke", journal=False).invoke(None, cfg(thread))
    assert child.answers(tables, tag) == ["answer 1", "answer 2"]
    assert last_ai(out) == "answer 2"


@pytest.mark.parametrize("journal", [True, False])
def test_tool_node_loop_sigkill_in_the_second_turn(
    saver: DurablePostgresSaver, tables: str, journal: bool
) -> None:
    """agent (tool call) -> ToolNode -> agent, killed after the second model call:
    journaled, the resumed second turn replays answer 2; plain, it gets answer 3. The
    first turn and the tool were checkpointed and run once either way."""
    thread, tag = crash(tables, "tools", "1" if journal else "0")
    assert child.answers(tables, tag) == ["answer 1", "answer 2"]
    app = child.build(saver, tables, tag, "tools", journal=journal)
    out = app.invoke(None, cfg(thread))
    first = [m for m in out["messages"] if isinstance(m, AIMessage)][0]
    assert first.tool_calls[0]["args"] == {"q": "q1"} and first.tool_calls[0]["id"] == "call_1"
    assert child.tool_runs(tables, tag) == ["q1"]
    if journal:
        assert last_ai(out) == "answer 2" and child.answers(tables, tag) == ["answer 1", "answer 2"]
    else:
        assert last_ai(out) == "answer 3" and len(child.answers(tables, tag)) == 3
    # The loop keeps working after the resume: a new turn calls the model (and the tool).
    out = app.invoke({"messages": [HumanMessage("again")]}, cfg(thread))
    n = len(child.answers(tables, tag))
    assert last_ai(out) == f"answer {n}" and len(child.tool_runs(tables, tag)) == 2


def test_sigkill_inside_the_model_call_calls_it_again(saver: DurablePostgresSaver, tables: str) -> None:
    """The model answered but the process died before the answer was recorded. A model
    call is not an effect: the journal holds no claim, so there is no unknown outcome and
    no claim lease to wait out; the resume calls the model again."""
    thread, tag = crash(tables, "invoke", "1", kill="inside")
    assert child.answers(tables, tag) == ["answer 1"]
    assert Ledger(saver).entries(thread_id=thread) == []
    out = child.build(saver, tables, tag, "invoke", journal=True).invoke(None, cfg(thread))
    assert last_ai(out) == "answer 2" and child.answers(tables, tag) == ["answer 1", "answer 2"]
    (entry,) = Ledger(saver).entries(thread_id=thread)
    assert entry.status == "completed" and entry.attempts == 1


# --- forks call the model anew -----------------------------------------------------------


def test_a_fork_calls_the_model_anew(saver: DurablePostgresSaver, tables: str) -> None:
    tag, thread = uuid.uuid4().hex[:10], k("fork")
    app = child.build(saver, tables, tag, "invoke", journal=True)
    assert last_ai(app.invoke(HELLO, cfg(thread))) == "answer 1"
    before = next(s for s in app.get_state_history(cfg(thread)) if s.next == ("agent",))
    # update_state writes a source="update" checkpoint: new task ids, a new call.
    fork = app.update_state(before.config, {"chunks": [0]})
    assert last_ai(app.invoke(None, fork)) == "answer 2"
    # Time travel (replay from a stored checkpoint) forks too.
    assert last_ai(app.invoke(None, before.config)) == "answer 3"
    assert child.answers(tables, tag) == ["answer 1", "answer 2", "answer 3"]
    # A plain resume of the finished thread calls nothing.
    app.invoke(None, cfg(thread))
    assert len(child.answers(tables, tag)) == 3
    # The records belong to the thread: deleted with it.
    assert len(Ledger(saver).entries(thread_id=thread)) == 3
    saver.delete_thread(thread)
    assert Ledger(saver).entries(thread_id=thread) == []


# --- in-process re-executions (an interrupt, then Command(resume=...)) ------------------
# A node attempt that raises rejects its answers (a RetryPolicy retry asks the model
# again: tests/test_journal_seams.py), so the re-execution that replays in process is the
# one after an interrupt, as after a crash.


class Scripted(BaseChatModel):
    """Answers ``answer n`` (n counts this instance's calls); fails the calls listed in
    ``fail`` first. With ``tool_name``, answers with a tool call of that name."""

    calls: list[str] = []
    fail: list[int] = []
    tool_name: str = ""

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any) -> ChatResult:
        n = len(self.calls) + 1
        self.calls.append(str(messages[-1].content))
        if n in self.fail:
            raise ConnectionError(f"call {n} failed")
        if self.tool_name:
            call = {"name": self.tool_name, "args": {"city": f"city {n}"}, "id": f"c{n}", "type": "tool_call"}
            msg = AIMessage(content="", tool_calls=[call])
        else:
            msg = AIMessage(content=f"answer {n}")
        return ChatResult(generations=[ChatGeneration(message=msg)])

    def bind_tools(self, tools: Any, **kw: Any) -> Any:
        return self.bind(tools=[getattr(t, "__name__", str(t)) for t in tools], **kw)

    @property
    def _llm_type(self) -> str:
        return "scripted"


def _graph(saver: Any, node: Any, *, retry: bool = True) -> Any:
    builder = StateGraph(MessagesState)
    builder.add_node("n", node, retry_policy=RetryPolicy(max_attempts=3, initial_interval=0.01, retry_on=RuntimeError) if retry else None)
    builder.add_edge(START, "n")
    builder.add_edge("n", END)
    return builder.compile(checkpointer=saver)


def _interrupted_node(body: Any) -> Any:
    """A node that runs ``body``, then interrupts: ``Command(resume=...)`` re-executes
    it from its first line (``_run_twice``)."""

    def node(state: MessagesState) -> dict[str, Any]:
        out = body(state)
        interrupt("re-execute me")
        return out

    return node


def _run_twice(app: Any, inputs: Any, config: dict[str, Any]) -> Any:
    app.invoke(inputs, config)
    return app.invoke(Command(resume=True), config)


def _flaky_node(body: Any) -> Any:
    """A node that runs ``body`` and fails after it on its first execution only."""
    runs: list[int] = []

    def node(state: MessagesState) -> dict[str, Any]:
        out = body(state)
        runs.append(1)
        if len(runs) == 1:
            raise RuntimeError("died after the model call")
        return out

    return node


def test_a_re_execution_replays_and_identical_calls_keep_their_order(saver: DurablePostgresSaver) -> None:
    """Two calls with the same input in one node get two answers; the re-executed node
    gets them back in the same order, and a call with another input is independent of
    their position."""
    model = Scripted(calls=[])
    jm = journaled(model)

    def body(state: MessagesState) -> dict[str, Any]:
        a = jm.invoke(state["messages"])
        other = jm.invoke([HumanMessage("other")])
        b = jm.invoke(state["messages"])
        return {"messages": [a, other, b]}

    out = _run_twice(_graph(saver, _interrupted_node(body)), {"messages": [HumanMessage("hi")]}, cfg(k()))
    assert [m.content for m in out["messages"][1:]] == ["answer 1", "answer 2", "answer 3"]
    assert model.calls == ["hi", "other", "hi"]  # the re-execution replayed all three


def test_a_failed_call_gives_its_position_back(saver: DurablePostgresSaver) -> None:
    """The node retries a failed model call itself; the re-executed node replays the
    retry's answer instead of calling the model for the first (failed) try."""
    model = Scripted(calls=[], fail=[1])
    jm = journaled(model)

    def body(state: MessagesState) -> dict[str, Any]:
        try:
            msg = jm.invoke(state["messages"])
        except ConnectionError:
            msg = jm.invoke(state["messages"])
        return {"messages": [msg]}

    out = _run_twice(_graph(saver, _interrupted_node(body)), {"messages": [HumanMessage("hi")]}, cfg(k()))
    assert out["messages"][-1].content == "answer 2"
    assert len(model.calls) == 2


def test_batch_replays(saver: DurablePostgresSaver) -> None:
    model = Scripted(calls=[])
    jm = journaled(model)

    def body(state: MessagesState) -> dict[str, Any]:
        return {"messages": jm.batch([[HumanMessage("a")], [HumanMessage("b")]])}

    out = _run_twice(_graph(saver, _interrupted_node(body)), {"messages": [HumanMessage("hi")]}, cfg(k()))
    assert sorted(model.calls) == ["a", "b"]
    assert sorted(str(m.content) for m in out["messages"][1:]) == ["answer 1", "answer 2"]


class Weather(BaseModel):
    city: str


def test_with_structured_output_journals_the_message(saver: DurablePostgresSaver) -> None:
    model = Scripted(calls=[], tool_name="Weather")
    structured = journaled(model).with_structured_output(Weather)
    seen: list[str] = []

    def body(state: MessagesState) -> dict[str, Any]:
        w = structured.invoke(state["messages"])
        assert isinstance(w, Weather)
        seen.append(w.city)
        return {"messages": [AIMessage(w.city)]}

    thread = k()
    _run_twice(_graph(saver, _interrupted_node(body)), {"messages": [HumanMessage("hi")]}, cfg(thread))
    assert seen == ["city 1", "city 1"] and len(model.calls) == 1
    (entry,) = Ledger(saver).entries(thread_id=thread)
    # The record is the model's message (re-parsed on replay), not the user's class.
    assert isinstance(Ledger(saver).result(entry.key), AIMessage)


def test_bind_tools_returns_a_journaled_model() -> None:
    jm = journaled(Scripted(calls=[]))
    assert isinstance(jm, JournaledRunnable)
    assert isinstance(jm.bind_tools([Weather]), JournaledRunnable)
    assert journaled(jm) is jm
    assert jm.get_name() == "Scripted" and jm._llm_type == "scripted"


def test_idempotent_on_a_runnable_journals_it() -> None:
    assert isinstance(idempotent(Scripted(calls=[])), JournaledRunnable)
    with pytest.raises(ConfigurationError, match="side effects only"):
        idempotent(key=lambda *a: "x")(Scripted(calls=[]))
    with pytest.raises(ConfigurationError):
        journaled(lambda x: x)  # type: ignore[arg-type]


# --- where it does not journal -------------------------------------------------------------


def test_outside_a_run_and_without_checkpointer_it_calls_through(saver: DurablePostgresSaver) -> None:
    model = Scripted(calls=[])
    jm = journaled(model)
    assert jm.invoke("x").content == "answer 1"
    assert jm.invoke("x").content == "answer 2"
    assert [c.content for c in jm.stream("x")] == ["answer 3"]
    node = _flaky_node(lambda s: {"messages": [jm.invoke(s["messages"])]})
    # No checkpointer: nothing can be resumed, so nothing is recorded.
    out = _graph(None, node).invoke({"messages": [HumanMessage("hi")]})
    assert out["messages"][-1].content == "answer 5" and len(model.calls) == 5
    thread = k()
    out = _graph(saver, _flaky_node(lambda s: {"messages": [jm.invoke(s["messages"])]})).invoke(
        {"messages": [HumanMessage("hi")]}, cfg(thread), durability="exit"
    )
    assert len(model.calls) == 7 and Ledger(saver).entries(thread_id=thread) == []


def test_a_non_durable_checkpointer_needs_ledger(saver: DurablePostgresSaver) -> None:
    model = Scripted(calls=[])
    app = _graph(InMemorySaver(), lambda s: {"messages": [journaled(model).invoke(s["messages"])]}, retry=False)
    with pytest.raises(NoLedgerError, match="InMemorySaver"):
        app.invoke({"messages": [HumanMessage("hi")]}, cfg(k()))
    assert model.calls == []
    jm = journaled(model, ledger=saver)
    app = _graph(InMemorySaver(), _interrupted_node(lambda s: {"messages": [jm.invoke(s["messages"])]}))
    thread = k()
    _run_twice(app, {"messages": [HumanMessage("hi")]}, cfg(thread))
    assert len(model.calls) == 1 and len(Ledger(saver).entries(thread_id=thread)) == 1


def test_a_stream_stopped_early_records_nothing(saver: DurablePostgresSaver) -> None:
    class Words(Scripted):
        def _stream(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any) -> Iterator[Any]:
            from langchain_core.messages import AIMessageChunk
            from langchain_core.outputs import ChatGenerationChunk

            self.calls.append("stream")
            for w in ("a ", "b ", "c"):
                yield ChatGenerationChunk(message=AIMessageChunk(content=w))

    model = Words(calls=[])
    jm = journaled(model)
    seen: list[str] = []

    def body(state: MessagesState) -> dict[str, Any]:
        first = next(iter(jm.stream(state["messages"])))  # stops after one chunk
        seen.append(str(first.content))
        full = list(jm.stream(state["messages"]))
        seen.append("".join(str(c.content) for c in full))
        return {"messages": [AIMessage(seen[-1])]}

    thread = k()
    _run_twice(_graph(saver, _interrupted_node(body)), {"messages": [HumanMessage("hi")]}, cfg(thread))
    # The stream stopped early did not complete: nothing recorded, the re-execution
    # calls the model for it again; the complete one is replayed.
    assert seen == ["a ", "a b c", "a ", "a b c"]
    assert model.calls == ["stream", "stream", "stream"]


def test_interrupt_after_the_model_call_replays_it_on_resume(saver: DurablePostgresSaver) -> None:
    """Human in the loop: the node calls the model, then interrupts; ``Command(resume=)``
    re-executes the node from its first line. Journaled, the model is not called again
    and the approved answer is the one the human saw; plain, it is called again."""
    from langgraph.types import Command, interrupt

    for journal, expected_calls in ((True, 1), (False, 2)):
        model = Scripted(calls=[])
        m: Any = journaled(model) if journal else model

        def node(state: MessagesState, m: Any = m) -> dict[str, Any]:
            msg = m.invoke(state["messages"])
            approved = interrupt({"draft": msg.content})
            return {"messages": [AIMessage(f"{msg.content} ({approved})")]}

        app = _graph(saver, node, retry=False)
        thread = k()
        first = app.invoke({"messages": [HumanMessage("hi")]}, cfg(thread))
        assert first["__interrupt__"][0].value == {"draft": "answer 1"}
        out = app.invoke(Command(resume="ok"), cfg(thread))
        assert len(model.calls) == expected_calls
        assert out["messages"][-1].content == ("answer 1 (ok)" if journal else "answer 2 (ok)")


async def test_async_calls_with_different_inputs_replay_in_any_order(asaver: AsyncDurablePostgresSaver) -> None:
    import asyncio

    model = Scripted(calls=[])
    jm = journaled(model)
    runs: list[int] = []

    async def node(state: MessagesState) -> dict[str, Any]:
        runs.append(1)
        questions = ["a", "b"] if len(runs) == 1 else ["b", "a"]
        msgs = await asyncio.gather(*(jm.ainvoke([HumanMessage(q)]) for q in questions))
        answers = dict(zip(questions, (str(m.content) for m in msgs), strict=True))
        interrupt("re-execute me")
        return {"messages": [AIMessage(f"{answers['a']} / {answers['b']}")]}

    app, thread = _graph(asaver, node), cfg(k())
    await app.ainvoke({"messages": [HumanMessage("hi")]}, thread)
    out = await app.ainvoke(Command(resume=True), thread)
    assert len(model.calls) == 2
    assert sorted(str(out["messages"][-1].content).split(" / ")) == ["answer 1", "answer 2"]


async def test_astream_stopped_early_records_nothing(asaver: AsyncDurablePostgresSaver) -> None:
    from langchain_core.messages import AIMessageChunk
    from langchain_core.outputs import ChatGenerationChunk

    class Words(Scripted):
        async def _astream(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any) -> Any:
            self.calls.append("astream")
            for w in ("a ", "b ", "c"):
                yield ChatGenerationChunk(message=AIMessageChunk(content=w))

    model = Words(calls=[])
    jm = journaled(model)
    seen: list[str] = []

    async def node(state: MessagesState) -> dict[str, Any]:
        stream = jm.astream(state["messages"])
        first = await anext(aiter(stream))
        await stream.aclose()  # type: ignore[attr-defined]
        seen.append(str(first.content))
        seen.append("".join([str(c.content) async for c in jm.astream(state["messages"])]))
        interrupt("re-execute me")
        return {"messages": [AIMessage(seen[-1])]}

    app, thread = _graph(asaver, node), cfg(k())
    await app.ainvoke({"messages": [HumanMessage("hi")]}, thread)
    await app.ainvoke(Command(resume=True), thread)
    assert seen == ["a ", "a b c", "a ", "a b c"]
    assert model.calls == ["astream", "astream", "astream"]  # the stopped one is asked again


def test_structured_output_include_raw_and_subgraph(saver: DurablePostgresSaver) -> None:
    model = Scripted(calls=[], tool_name="Weather")
    structured = journaled(model).with_structured_output(Weather, include_raw=True)
    seen: list[str] = []

    def body(state: MessagesState) -> dict[str, Any]:
        out = structured.invoke(state["messages"])
        assert isinstance(out["raw"], AIMessage) and isinstance(out["parsed"], Weather)
        seen.append(out["parsed"].city)
        return {"messages": [AIMessage(out["parsed"].city)]}

    inner = _graph(None, _interrupted_node(body))  # a subgraph: inherits the parent's saver
    parent = StateGraph(MessagesState)
    parent.add_node("sub", inner)
    parent.add_edge(START, "sub")
    parent.add_edge("sub", END)
    thread = k()
    _run_twice(parent.compile(checkpointer=saver), {"messages": [HumanMessage("hi")]}, cfg(thread))
    assert seen == ["city 1", "city 1"] and len(model.calls) == 1
    (entry,) = Ledger(saver).entries(thread_id=thread)
    assert isinstance(Ledger(saver).result(entry.key), AIMessage)


def test_functional_api_entrypoint_replays(saver: DurablePostgresSaver) -> None:
    from langgraph.func import entrypoint

    model = Scripted(calls=[])
    jm = journaled(model)

    @entrypoint(checkpointer=saver)
    def flow(q: str) -> str:
        answer = str(jm.invoke([HumanMessage(q)]).content)
        interrupt("re-execute me")
        return answer

    thread = k()
    flow.invoke("x", cfg(thread))
    assert flow.invoke(Command(resume=True), cfg(thread)) == "answer 1" and model.calls == ["x"]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_create_react_agent_binds_tools_on_the_journaled_model(saver: DurablePostgresSaver) -> None:
    from langchain_core.tools import tool
    from langgraph.prebuilt import create_react_agent

    class Agentic(Scripted):
        def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any) -> ChatResult:
            self.calls.append(str(messages[-1].content))
            if isinstance(messages[-1], HumanMessage):
                call = {"name": "lookup", "args": {"q": "a"}, "id": "c1", "type": "tool_call"}
                msg = AIMessage(content="", tool_calls=[call])
            else:
                msg = AIMessage(content="final")
            return ChatResult(generations=[ChatGeneration(message=msg)])

    @tool
    def lookup(q: str) -> str:
        """Look something up."""
        return f"found {q}"

    model = Agentic(calls=[])
    agent = create_react_agent(journaled(model), [lookup], checkpointer=saver)
    thread = k()
    out = agent.invoke({"messages": [HumanMessage("q")]}, cfg(thread))
    assert [m.content for m in out["messages"]] == ["q", "", "found a", "final"]
    assert len(model.calls) == 2 and len(Ledger(saver).entries(thread_id=thread)) == 2
