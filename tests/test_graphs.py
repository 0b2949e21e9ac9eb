"""Real LangGraph graphs on the durable savers: interrupt() + Command(resume=...),
subgraphs (checkpoint namespaces), the three durability modes, sync and async graphs,
and the run lifecycle the saver records around them (durable_threads).

Crash-and-resume of these graphs in real processes is in test_crash_resume.py; here
everything runs in-process, with a *new* saver (new pool) for each resume, as another
process would have.
"""

from __future__ import annotations

import asyncio
import operator
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Annotated, Any, Literal, TypedDict

import psycopg
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from langgraph_durable import (
    AsyncDurablePostgresSaver,
    DurablePostgresSaver,
    SerializationError,
    ThreadBusyError,
)

Durability = Literal["sync", "async", "exit"]
MODES: tuple[Durability, ...] = ("sync", "async", "exit")


class State(TypedDict):
    log: Annotated[list[str], operator.add]
    answer: str


class SubState(TypedDict):
    sub_log: Annotated[list[str], operator.add]


class ParentState(TypedDict):
    log: Annotated[list[str], operator.add]
    sub_log: list[str]


def cfg(thread_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id}}


def thread_row(dsn: str, thread_id: str) -> tuple[str, str | None]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT status, lease_owner FROM durable_threads WHERE thread_id = %s", (thread_id,)
        ).fetchone()
    assert row is not None, thread_id
    return row[0], row[1]


def checkpoint_count(dsn: str, thread_id: str, ns: str | None = "") -> int:
    with psycopg.connect(dsn) as conn:
        if ns is None:
            row = conn.execute("SELECT count(*) FROM checkpoints WHERE thread_id = %s", (thread_id,)).fetchone()
        else:
            row = conn.execute(
                "SELECT count(*) FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = %s",
                (thread_id, ns),
            ).fetchone()
    assert row is not None
    return int(row[0])


# --------------------------------------------------------------------------- graphs
def approval_graph(runs: Counter[str], *, use_async: bool = False) -> StateGraph[Any]:
    """plan -> approve (interrupt) -> act."""

    def plan(state: State) -> dict[str, Any]:
        runs["plan"] += 1
        return {"log": ["plan"]}

    def approve(state: State) -> dict[str, Any]:
        runs["approve"] += 1
        answer = interrupt({"question": "go ahead?", "log": state["log"]})
        return {"log": ["approve"], "answer": answer}

    def act(state: State) -> dict[str, Any]:
        runs["act"] += 1
        return {"log": [f"act:{state['answer']}"]}

    async def aplan(state: State) -> dict[str, Any]:
        await asyncio.sleep(0)
        return plan(state)

    async def aact(state: State) -> dict[str, Any]:
        await asyncio.sleep(0)
        return act(state)

    g: StateGraph[Any] = StateGraph(State)
    g.add_node("plan", aplan if use_async else plan)
    g.add_node("approve", approve)
    g.add_node("act", aact if use_async else act)
    g.add_edge(START, "plan")
    g.add_edge("plan", "approve")
    g.add_edge("approve", "act")
    g.add_edge("act", END)
    return g


def subgraph_graph(runs: Counter[str], *, ask: bool) -> StateGraph[Any]:
    """prep -> inner(s1 -> [ask (interrupt)] -> s2) -> finish."""

    def step(name: str, key: str) -> Any:
        def node(state: Any) -> dict[str, Any]:
            runs[name] += 1
            return {key: [name]}

        return node

    def ask_node(state: SubState) -> dict[str, Any]:
        runs["ask"] += 1
        reply = interrupt("inner question")
        return {"sub_log": [f"ask:{reply}"]}

    sub: StateGraph[Any] = StateGraph(SubState)
    sub.add_node("s1", step("s1", "sub_log"))
    sub.add_node("s2", step("s2", "sub_log"))
    sub.add_edge(START, "s1")
    if ask:
        sub.add_node("ask", ask_node)
        sub.add_edge("s1", "ask")
        sub.add_edge("ask", "s2")
    else:
        sub.add_edge("s1", "s2")
    sub.add_edge("s2", END)

    g: StateGraph[Any] = StateGraph(ParentState)
    g.add_node("prep", step("prep", "log"))
    g.add_node("inner", sub.compile())
    g.add_node("finish", step("finish", "log"))
    g.add_edge(START, "prep")
    g.add_edge("prep", "inner")
    g.add_edge("inner", "finish")
    g.add_edge("finish", END)
    return g


# --------------------------------------------------------------------------- sync graphs
def test_interrupt_then_command_resume_from_another_saver(dsn: str) -> None:
    runs: Counter[str] = Counter()
    builder = approval_graph(runs)
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        out = builder.compile(checkpointer=saver).invoke({"log": []}, cfg("approve-1"))
    assert out["log"] == ["plan"]
    (intr,) = out["__interrupt__"]
    assert intr.value == {"question": "go ahead?", "log": ["plan"]}
    # The run ended waiting for a human: lease released, status recorded.
    assert thread_row(dsn, "approve-1") == ("waiting", None)

    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        graph = builder.compile(checkpointer=saver)
        snap = graph.get_state(cfg("approve-1"))
        assert snap.next == ("approve",) and snap.interrupts[0].value["question"] == "go ahead?"
        out = graph.invoke(Command(resume="yes"), cfg("approve-1"))
    assert out == {"log": ["plan", "approve", "act:yes"], "answer": "yes"}
    # plan is not re-run; the interrupted node restarts from its beginning (LangGraph
    # semantics) and gets the resume value from interrupt().
    assert runs == Counter(plan=1, approve=2, act=1)
    assert thread_row(dsn, "approve-1") == ("done", None)
    # Resuming a finished thread is a harmless no-op: the way to "resume if needed".
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        assert builder.compile(checkpointer=saver).invoke(None, cfg("approve-1")) == out
    assert runs == Counter(plan=1, approve=2, act=1)
    assert thread_row(dsn, "approve-1") == ("done", None)


def test_subgraph_checkpoints_in_its_namespace_and_resumes_inside(dsn: str) -> None:
    runs: Counter[str] = Counter()
    builder = subgraph_graph(runs, ask=True)
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        out = builder.compile(checkpointer=saver).invoke({"log": [], "sub_log": []}, cfg("sub-1"))
    assert "__interrupt__" in out and out["log"] == ["prep"]
    with psycopg.connect(dsn) as conn:
        namespaces = {
            r[0] for r in conn.execute("SELECT DISTINCT checkpoint_ns FROM checkpoints WHERE thread_id = 'sub-1'")
        }
    inner_ns = {ns for ns in namespaces if ns}
    assert len(inner_ns) == 1 and next(iter(inner_ns)).startswith("inner:")
    assert checkpoint_count(dsn, "sub-1", next(iter(inner_ns))) >= 2

    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        graph = builder.compile(checkpointer=saver)
        snap = graph.get_state(cfg("sub-1"), subgraphs=True)
        (task,) = snap.tasks
        assert task.name == "inner"
        inner = task.state
        assert not isinstance(inner, dict) and inner is not None
        assert inner.next == ("ask",) and inner.values == {"sub_log": ["s1"]}
        # Reading one namespace directly works as for the stock saver.
        tup = saver.get_tuple({"configurable": {"thread_id": "sub-1", "checkpoint_ns": next(iter(inner_ns))}})
        assert tup is not None and tup.checkpoint["channel_values"]["sub_log"] == ["s1"]
        out = graph.invoke(Command(resume="ok"), cfg("sub-1"))
    assert out == {"log": ["prep", "finish"], "sub_log": ["s1", "ask:ok", "s2"]}
    assert runs == Counter(prep=1, s1=1, ask=2, s2=1, finish=1)
    assert thread_row(dsn, "sub-1") == ("done", None)


def test_durability_modes_complete_and_resume(dsn: str) -> None:
    counts: dict[str, int] = {}
    for mode in MODES:
        runs: Counter[str] = Counter()
        thread = f"dur-{mode}"
        with DurablePostgresSaver.from_conn_string(dsn) as saver:
            out = approval_graph(runs).compile(checkpointer=saver).invoke(
                {"log": []}, cfg(thread), durability=mode
            )
        assert "__interrupt__" in out, mode
        assert thread_row(dsn, thread) == ("waiting", None), mode
        with DurablePostgresSaver.from_conn_string(dsn) as saver:
            graph = approval_graph(runs).compile(checkpointer=saver)
            out = graph.invoke(Command(resume=mode), cfg(thread), durability=mode)
            assert out == {"log": ["plan", "approve", f"act:{mode}"], "answer": mode}, mode
            # Every mode has saved the final state by the time invoke returns.
            assert graph.get_state(cfg(thread)).values == out, mode
        assert runs == Counter(plan=1, approve=2, act=1), (mode, runs)
        assert thread_row(dsn, thread) == ("done", None), mode
        counts[mode] = checkpoint_count(dsn, thread)
    # "exit" writes only when a run stops (the interrupt, the end); the others each step.
    assert counts["sync"] == counts["async"] > counts["exit"] >= 2, counts


def test_subgraph_durability_modes(dsn: str) -> None:
    for mode in MODES:
        runs: Counter[str] = Counter()
        with DurablePostgresSaver.from_conn_string(dsn) as saver:
            out = subgraph_graph(runs, ask=False).compile(checkpointer=saver).invoke(
                {"log": [], "sub_log": []}, cfg(f"subdur-{mode}"), durability=mode
            )
        assert out == {"log": ["prep", "finish"], "sub_log": ["s1", "s2"]}, mode
        assert runs == Counter(prep=1, s1=1, s2=1, finish=1), mode


def test_nul_in_state_survives_a_graph_where_stock_fails(dsn: str) -> None:
    runs: Counter[str] = Counter()
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        out = approval_graph(runs).compile(checkpointer=saver).invoke({"log": [], "answer": "a\x00b"}, cfg("nul-graph"))
        assert "__interrupt__" in out
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        out = approval_graph(runs).compile(checkpointer=saver).invoke(Command(resume="c\x00d"), cfg("nul-graph"))
    assert out == {"log": ["plan", "approve", "act:c\x00d"], "answer": "c\x00d"}
    with PostgresSaver.from_conn_string(dsn) as stock:
        with pytest.raises(psycopg.errors.UntranslatableCharacter):
            approval_graph(runs).compile(checkpointer=stock).invoke({"log": [], "answer": "a\x00b"}, cfg("nul-stock"))


def test_unserializable_node_output_fails_typed_and_keeps_last_checkpoint(dsn: str) -> None:
    class Bad(TypedDict):
        log: Annotated[list[str], operator.add]
        handle: Any

    def ok(state: Bad) -> dict[str, Any]:
        return {"log": ["ok"]}

    def bad(state: Bad) -> dict[str, Any]:
        return {"log": ["bad"], "handle": threading.Lock()}

    g: StateGraph[Any] = StateGraph(Bad)
    g.add_node("ok", ok)
    g.add_node("bad", bad)
    g.add_edge(START, "ok")
    g.add_edge("ok", "bad")
    g.add_edge("bad", END)
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        graph = g.compile(checkpointer=saver)
        with pytest.raises(SerializationError) as info:
            graph.invoke({"log": []}, cfg("unser"), durability="sync")
        assert info.value.fields["value_type"] == "lock"
        snap = graph.get_state(cfg("unser"))
        # The state after "ok" is intact and "bad" is still to run.
        assert snap.values == {"log": ["ok"]} and snap.next == ("bad",)
    status, owner = thread_row(dsn, "unser")
    assert status == "error" and owner is None


def test_second_concurrent_invoke_on_a_thread_is_refused(dsn: str) -> None:
    started, release = threading.Event(), threading.Event()

    def slow(state: State) -> dict[str, Any]:
        started.set()
        release.wait(30)
        return {"log": ["slow"]}

    g: StateGraph[Any] = StateGraph(State)
    g.add_node("slow", slow)
    g.add_edge(START, "slow")
    g.add_edge("slow", END)
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        graph = g.compile(checkpointer=saver)
        result: dict[str, Any] = {}
        worker = threading.Thread(target=lambda: result.update(graph.invoke({"log": []}, cfg("busy"))))
        worker.start()
        try:
            assert started.wait(30)
            with pytest.raises(ThreadBusyError) as info:
                graph.invoke(None, cfg("busy"))
            assert info.value.fields["thread_id"] == "busy"
        finally:
            release.set()
            worker.join()
        assert result["log"] == ["slow"]


# --------------------------------------------------------------------------- async graphs
async def test_async_graph_interrupt_resume_and_subgraph(dsn: str) -> None:
    runs: Counter[str] = Counter()
    async with AsyncDurablePostgresSaver.from_conn_string(dsn) as saver:
        graph = approval_graph(runs, use_async=True).compile(checkpointer=saver)
        out = await graph.ainvoke({"log": []}, cfg("async-1"))
        assert out["__interrupt__"][0].value["question"] == "go ahead?"
    assert thread_row(dsn, "async-1") == ("waiting", None)
    async with AsyncDurablePostgresSaver.from_conn_string(dsn) as saver:
        graph = approval_graph(runs, use_async=True).compile(checkpointer=saver)
        updates = [u async for u in graph.astream(Command(resume="y"), cfg("async-1"), stream_mode="updates")]
        assert [next(iter(u)) for u in updates] == ["approve", "act"]
        assert (await graph.aget_state(cfg("async-1"))).values == {
            "log": ["plan", "approve", "act:y"], "answer": "y",
        }
    assert runs == Counter(plan=1, approve=2, act=1)
    assert thread_row(dsn, "async-1") == ("done", None)

    sub_runs: Counter[str] = Counter()
    async with AsyncDurablePostgresSaver.from_conn_string(dsn) as saver:
        sub = subgraph_graph(sub_runs, ask=True).compile(checkpointer=saver)
        out = await sub.ainvoke({"log": [], "sub_log": []}, cfg("async-sub"))
        assert "__interrupt__" in out
        out = await sub.ainvoke(Command(resume="z"), cfg("async-sub"))
    assert out == {"log": ["prep", "finish"], "sub_log": ["s1", "ask:z", "s2"]}
    assert sub_runs == Counter(prep=1, s1=1, ask=2, s2=1, finish=1)


@pytest.mark.parametrize("mode", ["sync", "async", "exit"])
async def test_async_graph_durability_modes(dsn: str, mode: Durability) -> None:
    runs: Counter[str] = Counter()
    async with AsyncDurablePostgresSaver.from_conn_string(dsn) as saver:
        graph = approval_graph(runs, use_async=True).compile(checkpointer=saver)
        assert "__interrupt__" in await graph.ainvoke({"log": []}, cfg(f"adur-{mode}"), durability=mode)
        out = await graph.ainvoke(Command(resume=mode), cfg(f"adur-{mode}"), durability=mode)
    assert out == {"log": ["plan", "approve", f"act:{mode}"], "answer": mode}
    assert runs == Counter(plan=1, approve=2, act=1)


async def test_sync_graph_on_async_saver_from_a_worker_thread(dsn: str) -> None:
    """A sync graph invoked off the event loop with the async saver (as LangGraph's
    own executor threads do)."""
    runs: Counter[str] = Counter()
    async with AsyncDurablePostgresSaver.from_conn_string(dsn) as saver:
        graph = approval_graph(runs).compile(checkpointer=saver)
        out = await asyncio.to_thread(graph.invoke, {"log": []}, cfg("mixed"))
        assert "__interrupt__" in out
        out = await asyncio.to_thread(graph.invoke, Command(resume="m"), cfg("mixed"))
    assert out == {"log": ["plan", "approve", "act:m"], "answer": "m"}
    assert thread_row(dsn, "mixed") == ("done", None)


@pytest.fixture(autouse=True)
def _no_leaked_leases(dsn: str) -> Iterator[None]:
    yield
    with psycopg.connect(dsn) as conn:
        live = conn.execute(
            "SELECT thread_id FROM durable_threads WHERE lease_owner IS NOT NULL"
        ).fetchall()
    assert live == [], f"leases left held: {live}"
