"""Refuse what is incompatible, not what is merely different (issue 12).

A version mismatch between fingerprints is classified against the stored graph's
topology (``durable_graph_versions``) and the checkpoint's pending work. The first three
tests reproduce the LangGraph extended-suite cases that the old check refused
(``test_delta_channel_to_plain.py`` sync and async, ``test_large_cases.py::test_root_graph``);
the others pin each rule of the classification. Real PostgreSQL, no mocks.
"""

# No `from __future__ import annotations`: the state schemas below are local classes
# whose annotations LangGraph evaluates (get_type_hints) outside this scope.

import operator
import pickle
from copy import deepcopy
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableConfig, RunnableMap, RunnablePick
from langchain_core.tools import tool
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.serde.types import _DeltaSnapshot
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import _messages_delta_reducer, add_messages
from langgraph.prebuilt.tool_node import ToolNode
from langgraph.types import Command, Send, interrupt

from langgraph_durable import (
    AsyncDurablePostgresSaver,
    DurablePostgresSaver,
    GraphVersionMismatchError,
)
from langgraph_durable.compat import classify, graph_topology
from langgraph_durable.core import rewrite as saver_module  # where the saver records versions
from langgraph_durable.versioning import graph_fingerprint


def cfg(thread_id: str, **configurable: Any) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, **configurable}}


# --- LangGraph: test_delta_channel_to_plain.py ------------------------------------------


class DeltaState(TypedDict):
    messages: Annotated[list, DeltaChannel(_messages_delta_reducer, snapshot_frequency=3)]


class PlainState(TypedDict):
    messages: Annotated[list, add_messages]


def _chat_app(schema: type, checkpointer: Any) -> Any:
    builder = StateGraph(schema)
    builder.add_node(
        "chat", lambda state: {"messages": [AIMessage(f"reply {len(state['messages'])}")]}
    )
    builder.add_edge(START, "chat")
    builder.add_edge("chat", END)
    return builder.compile(checkpointer=checkpointer)


def test_plain_reducer_continues_delta_written_thread(dsn: str) -> None:
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        config = cfg("delta-to-plain-1")
        delta = _chat_app(DeltaState, saver)
        for i in range(4):
            delta.invoke({"messages": [HumanMessage(f"q{i}")]}, config)
        assert any(
            isinstance(t.checkpoint["channel_values"].get("messages"), _DeltaSnapshot)
            for t in saver.list(config)
        )
        plain = _chat_app(PlainState, saver)
        assert graph_fingerprint(plain) != graph_fingerprint(delta)
        assert [s.values for s in plain.get_state_history(config)] == [
            s.values for s in delta.get_state_history(config)
        ]
        before = delta.get_state(config).values["messages"]
        # The old check raised GraphVersionMismatchError here.
        after = plain.invoke({"messages": [HumanMessage("q4")]}, config)["messages"]
        assert after[:-2] == before
        assert [m.content for m in after[-2:]] == ["q4", f"reply {len(before) + 1}"]
        head = saver.get_tuple(config)
        assert head is not None
        assert head.checkpoint["channel_values"]["messages"] == after
        assert head.metadata["graph_version"] == graph_fingerprint(plain)
        assert delta.get_state(config).values["messages"] == after


async def test_plain_reducer_reads_and_continues_delta_written_thread_async(dsn: str) -> None:
    async with AsyncDurablePostgresSaver.from_conn_string(dsn) as saver:
        config = cfg("delta-to-plain-async-1")
        delta = _chat_app(DeltaState, saver)
        for i in range(4):
            await delta.ainvoke({"messages": [HumanMessage(f"q{i}")]}, config)
        plain = _chat_app(PlainState, saver)
        expected = [s.values async for s in delta.aget_state_history(config)]
        assert [s.values async for s in plain.aget_state_history(config)] == expected
        after = (await plain.ainvoke({"messages": [HumanMessage("q4")]}, config))["messages"]
        assert after[:-2] == expected[0]["messages"]
        # And back: plain -> DeltaChannel on the same key is compatible too.
        again = (await delta.ainvoke({"messages": [HumanMessage("q5")]}, config))["messages"]
        assert again[:-2] == after


# --- LangGraph: test_large_cases.py::test_root_graph (the version-relevant part) --------


class _FakeFunctionChatModel(FakeMessagesListChatModel):
    def bind_functions(self, functions: list[Any]) -> Any:
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        response = deepcopy(self.responses[self.i])
        self.i = self.i + 1 if self.i < len(self.responses) - 1 else 0
        return ChatResult(generations=[ChatGeneration(message=response)])


@tool()
def search_api(query: str) -> str:
    """Searches the API for the query."""
    return f"result for {query}"


def _should_continue(messages: list[BaseMessage]) -> str:
    return "continue" if getattr(messages[-1], "tool_calls", None) else "end"


def test_root_graph_with_one_more_state_key_continues_the_old_thread(dsn: str) -> None:
    model = _FakeFunctionChatModel(
        responses=[
            AIMessage(
                content="",
                tool_calls=[{"id": "tc1", "name": "search_api", "args": {"query": "q"}}],
                id="ai1",
            ),
            AIMessage(content="answer", id="ai2"),
        ]
    )

    class State(TypedDict):
        __root__: Annotated[list[BaseMessage], add_messages]

    workflow = StateGraph(State)
    workflow.add_node("agent", model)
    workflow.add_node("tools", ToolNode([search_api]))
    workflow.set_entry_point("agent")
    workflow.add_conditional_edges("agent", _should_continue, {"continue": "tools", "end": END})
    workflow.add_edge("tools", "agent")

    def simple_add(left: Any, right: Any) -> Any:
        if not isinstance(right, list):
            right = [right]
        return left + right

    class MoreState(TypedDict):
        __root__: Annotated[list[BaseMessage], simple_add]
        something_else: str

    new_workflow = StateGraph(MoreState)
    new_workflow.add_node("agent", RunnableMap(__root__=RunnablePick("__root__") | model))
    new_workflow.add_node(
        "tools", RunnableMap(__root__=RunnablePick("__root__") | ToolNode([search_api]))
    )
    new_workflow.set_entry_point("agent")
    new_workflow.add_conditional_edges(
        "agent", RunnablePick("__root__") | _should_continue, {"continue": "tools", "end": END}
    )
    new_workflow.add_edge("tools", "agent")

    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        config = cfg("root-graph-2")
        app = workflow.compile(checkpointer=saver, interrupt_before=["tools"])
        list(app.stream("what is weather in sf", config))
        assert app.get_state(config).next == ("tools",)
        list(app.stream(None, config))
        assert app.get_state(config).next == ()
        app.update_state(config, ("ai", "an extra message"), as_node="tools")
        old_state = app.get_state(config)
        assert old_state.next == ("agent",)

        new_app = new_workflow.compile(checkpointer=saver)
        assert graph_fingerprint(new_app) != graph_fingerprint(app)
        model.i = 0
        state = new_app.get_state(config)
        assert state.values == {"__root__": old_state.values}
        assert state.next == ("agent",)
        # The old check raised GraphVersionMismatchError: a new state key, and a new
        # reducer of the same declared type, on a thread that holds no write to fold.
        out = new_app.invoke(
            {
                "__root__": [HumanMessage(content="what is weather in la")],
                "something_else": "value",
            },
            config,
            interrupt_before=["agent"],
        )
        assert out["something_else"] == "value"
        assert out["__root__"] == [
            *old_state.values,
            HumanMessage(content="what is weather in la", id=out["__root__"][-1].id),
        ]


# --- the rules, one by one ---------------------------------------------------------------


class S(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    note: str
    extra: str
    count: int


def _rec(name: str, ran: list[str], *, asks: bool = False) -> Any:
    def run(state: S) -> dict[str, Any]:
        ran.append(name)
        if asks:
            interrupt(f"{name}?")
        return {"log": [name]}

    return run


def _pipeline(
    ran: list[str],
    *,
    asks: str | None = "review",
    extra_node: bool = False,
    drop_review: bool = False,
    note_reducer: bool = False,
    count_kind: str = "int",
    review_to: str = "finish",
) -> StateGraph:
    """START -> fetch -> review (interrupt) -> finish -> END, with variations."""
    state: Any = S
    if note_reducer or count_kind != "int":

        class S2(TypedDict, total=False):
            log: Annotated[list[str], operator.add]
            note: Annotated[str, operator.add] if note_reducer else str  # type: ignore[valid-type]
            extra: str
            count: Annotated[list[int], operator.add] if count_kind == "list" else int  # type: ignore[valid-type]

        state = S2
    b = StateGraph(state)
    b.add_node("fetch", _rec("fetch", ran))
    b.add_node("finish", _rec("finish", ran))
    b.add_edge(START, "fetch")
    if drop_review:
        b.add_edge("fetch", "finish")
    else:
        b.add_node("review", _rec("review", ran, asks=asks == "review"))
        b.add_edge("fetch", "review")
        b.add_edge("review", review_to)
    if extra_node:
        b.add_node("audit", _rec("audit", ran))
        b.add_edge("audit", END)
        if review_to != "audit":
            b.add_edge("finish", END)
    else:
        b.add_edge("finish", END)
    return b


def _pause(saver: Any, tid: str, ran: list[str], **inputs: Any) -> Any:
    g = _pipeline(ran).compile(checkpointer=saver)
    out = g.invoke({"log": [], "note": "n", "count": 1, **inputs}, cfg(tid))
    assert "__interrupt__" in out
    return g


def test_node_added_where_nothing_needs_it_is_compatible(dsn: str) -> None:
    ran: list[str] = []
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        _pause(saver, "added-node-1", ran)
        g2 = _pipeline(ran, extra_node=True).compile(checkpointer=saver)
        g2.invoke(Command(resume="ok"), cfg("added-node-1"))
        assert ran == ["fetch", "review", "review", "finish"]


def test_removed_node_with_an_interrupt_is_refused(dsn: str) -> None:
    ran: list[str] = []
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        _pause(saver, "removed-node-1", ran)
        g2 = _pipeline(ran, drop_review=True).compile(checkpointer=saver)
        with pytest.raises(GraphVersionMismatchError) as err:
            g2.invoke(Command(resume="ok"), cfg("removed-node-1"))
        assert ran == ["fetch", "review"]  # nothing ran
        compat = err.value.compatibility
        assert compat["verdict"] == "incompatible"
        assert any("'review'" in r and "interrupt" in r for r in compat["reasons"]), compat
        assert "incompatible" in str(err.value)
        again = pickle.loads(pickle.dumps(err.value))
        assert again.compatibility == compat and again.thread_id == "removed-node-1"


def test_removed_node_without_pending_work_is_compatible(dsn: str) -> None:
    ran: list[str] = []
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        g1 = _pipeline(ran, asks=None).compile(checkpointer=saver)
        g1.invoke({"log": []}, cfg("removed-done-1"))
        g2 = _pipeline(ran, drop_review=True).compile(checkpointer=saver)
        out = g2.invoke({"log": ["again"]}, cfg("removed-done-1"))
        assert out["log"][-2:] == ["fetch", "finish"]


def test_changed_edge_out_of_an_interrupted_node_routes_by_the_new_edge(dsn: str) -> None:
    """Issue 24 item 7 (this test asserted a refusal before): review has not finished,
    so it has made no routing decision; it re-runs and takes the new edge, as stock
    LangGraph does. tests/test_graph_edits.py compares each edit kind with stock."""
    ran: list[str] = []
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        _pause(saver, "edge-1", ran)
        g2 = _pipeline(ran, extra_node=True, review_to="audit").compile(checkpointer=saver)
        g2.invoke(Command(resume="ok"), cfg("edge-1"))
        assert ran == ["fetch", "review", "review", "audit"]


def test_changed_channel_type_of_a_key_with_data_is_refused(dsn: str) -> None:
    ran: list[str] = []
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        _pause(saver, "chan-1", ran)
        g2 = _pipeline(ran, note_reducer=True).compile(checkpointer=saver)
        with pytest.raises(GraphVersionMismatchError) as err:
            g2.invoke(Command(resume="ok"), cfg("chan-1"))
        assert any(
            "'note'" in r and "LastValue -> BinaryOperatorAggregate" in r
            for r in err.value.compatibility["reasons"]
        )
        assert ran == ["fetch", "review"]
        # The same change on a key without data is compatible (note never written).
        _pipeline(ran).compile(checkpointer=saver).invoke({"log": []}, cfg("chan-2"))
        ran.clear()
        _pipeline(ran, note_reducer=True).compile(checkpointer=saver).invoke(
            Command(resume="ok"), cfg("chan-2")
        )
        assert ran == ["review", "finish"]


def test_changed_reducer_and_type_of_a_key_with_data_is_refused(dsn: str) -> None:
    ran: list[str] = []
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        _pause(saver, "type-1", ran)
        g2 = _pipeline(ran, count_kind="list").compile(checkpointer=saver)
        with pytest.raises(GraphVersionMismatchError) as err:
            g2.invoke(Command(resume="ok"), cfg("type-1"))
        assert any("'count'" in r for r in err.value.compatibility["reasons"]), (
            err.value.compatibility
        )


def test_strict_policy_refuses_an_added_state_key(dsn: str) -> None:
    class Wider(TypedDict, total=False):
        log: Annotated[list[str], operator.add]
        note: str
        extra: str
        count: int
        brand_new: str

    def build(state: Any, ran: list[str]) -> Any:
        b = StateGraph(state)
        b.add_node("only", _rec("only", ran))
        b.add_edge(START, "only")
        b.add_edge("only", END)
        return b

    ran: list[str] = []
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        build(S, ran).compile(checkpointer=saver).invoke({"log": []}, cfg("strict-1"))
        strict = build(Wider, ran).compile(checkpointer=saver.bind(version_policy="strict"))
        with pytest.raises(GraphVersionMismatchError):
            strict.invoke({"log": []}, cfg("strict-1"))
        default = build(Wider, ran).compile(checkpointer=saver)
        assert default.invoke({"log": [], "brand_new": "x"}, cfg("strict-1"))["brand_new"] == "x"
        assert ran == ["only", "only"]


def test_version_without_a_stored_topology_falls_back_to_refusing(dsn: str) -> None:
    ran: list[str] = []
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        g1 = _pause(saver, "unknown-1", ran)
        # As if written by a langgraph-durable without the table (or another store).
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "DELETE FROM durable_graph_versions WHERE version = %s", (graph_fingerprint(g1),)
            )
        g2 = _pipeline(ran, extra_node=True).compile(checkpointer=saver)
        with pytest.raises(GraphVersionMismatchError) as err:
            g2.invoke(Command(resume="ok"), cfg("unknown-1"))
        assert err.value.compatibility["verdict"] == "unknown"
        assert "no stored topology" in err.value.compatibility["reasons"][0]


def test_named_versions_keep_refusing_but_show_the_classification(dsn: str) -> None:
    """A version name you set is a declaration: changing it still needs a migration."""
    ran: list[str] = []
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        _pipeline(ran).compile(checkpointer=saver.bind(graph_version="n1")).invoke(
            {"log": []}, cfg("named-1")
        )
        g2 = _pipeline(ran, extra_node=True).compile(checkpointer=saver.bind(graph_version="n2"))
        with pytest.raises(GraphVersionMismatchError) as err:
            g2.invoke(Command(resume="ok"), cfg("named-1"))
        assert err.value.compatibility["verdict"] == "compatible"
        assert err.value.compatibility["automatic"] is False


def test_pending_send_to_a_removed_node_is_refused() -> None:
    """Pure classification: Sends in the checkpoint name the node they need."""

    def fan(ran: list[str], worker: str) -> Any:
        b = StateGraph(S)
        b.add_node("split", _rec("split", ran))
        b.add_node(worker, _rec(worker, ran))
        b.add_edge(START, "split")
        b.add_conditional_edges("split", lambda s: [Send(worker, {})], [worker])
        b.add_edge(worker, END)
        return b

    ran: list[str] = []
    old, new = (
        graph_topology(fan(ran, "worker").compile()),
        graph_topology(fan(ran, "helper").compile()),
    )
    cp = {
        "channel_values": {"__pregel_tasks": [Send("worker", {})]},
        "channel_versions": {"log": 1},
    }
    verdict = classify(old, new, cp, [])
    assert verdict.verdict == "incompatible"
    assert any("'worker'" in r for r in verdict.reasons)
    done = {"channel_values": {"log": ["x"]}, "channel_versions": {"log": 3}}
    assert classify(old, new, done, []).verdict == "compatible"


def test_reordered_definitions_are_identical() -> None:
    ran: list[str] = []

    def build(order: list[str]) -> Any:
        b = StateGraph(S)
        for n in order:
            b.add_node(n, _rec(n, ran))
        b.add_edge(START, "a")
        b.add_edge("a", "b")
        b.add_edge("b", END)
        return b.compile()

    one, two = graph_topology(build(["a", "b"])), graph_topology(build(["b", "a"]))
    assert (
        classify(one, two, {"channel_values": {}, "channel_versions": {}}, []).verdict
        == "identical"
    )


def test_topology_is_written_once_per_version_not_per_step(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hot path: one INSERT the first time a version runs in a saver, then none."""
    calls: list[str] = []
    real = saver_module.op_record_version

    def counting(version: str, topology: Any, graph_name: str | None = None) -> Any:
        calls.append(version)
        return real(version, topology, graph_name)

    monkeypatch.setattr(saver_module, "op_record_version", counting)
    ran: list[str] = []
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        g = _pipeline(ran, asks=None).compile(checkpointer=saver)
        for i in range(20):
            g.invoke({"log": []}, cfg(f"once-{i}"))
        view = saver.bind(version_policy="warn")  # views share what was recorded
        _pipeline(ran, asks=None).compile(checkpointer=view).invoke({"log": []}, cfg("once-view"))
    assert calls == [graph_fingerprint(g)]
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT fingerprint, topology -> 'description' = %s::jsonb FROM durable_graph_versions WHERE version = %s",
            (psycopg.types.json.Jsonb(graph_topology(g)["description"]), graph_fingerprint(g)),
        ).fetchone()
    assert row == (graph_fingerprint(g), True)


# --- the CLI shows the classification ----------------------------------------------------

_SINK: list[str] = []
GRAPH_WITH_AUDIT = _pipeline(_SINK, extra_node=True)  # for `versions list --graph`
GRAPH_WITHOUT_REVIEW = _pipeline(_SINK, drop_review=True)


def test_cli_versions_list_classifies_against_a_graph(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from typer.testing import CliRunner

    from langgraph_durable.cli import app
    from langgraph_durable.cli._common import console

    monkeypatch.setattr(console.resolve(), "width", 400)  # one line per row

    runner = CliRunner()
    here = __file__

    def run_json(*args: str) -> Any:
        result = runner.invoke(app, ["versions", "list", *args, "--dsn", dsn, "--json"])
        assert result.exit_code == 0, (result.output, result.exception)
        return json.loads(result.stdout)

    ran: list[str] = []
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        g1 = _pause(saver, "cli-paused", ran)
        _pipeline(ran, asks=None).compile(checkpointer=saver).invoke({"log": []}, cfg("cli-done"))
    v1 = graph_fingerprint(g1)
    rows = {
        r["thread_id"]: r["compatibility"]
        for r in run_json("--threads", "--graph", f"{here}:GRAPH_WITHOUT_REVIEW")
        if r["thread_id"].startswith("cli-")
    }
    assert rows["cli-paused"]["verdict"] == "incompatible"
    assert any("'review'" in r for r in rows["cli-paused"]["reasons"])
    assert rows["cli-done"]["verdict"] == "compatible"
    rows = {
        r["thread_id"]: r["compatibility"]
        for r in run_json("--threads", "--graph", f"{here}:GRAPH_WITH_AUDIT")
        if r["thread_id"].startswith("cli-")
    }
    assert rows["cli-paused"]["verdict"] == "compatible" and rows["cli-paused"]["automatic"]
    groups = {g["graph_version"]: g for g in run_json("--graph", f"{here}:GRAPH_WITHOUT_REVIEW")}
    assert groups[v1]["topology"] == "stored"
    assert groups[v1]["vs_graph"].get("incompatible", 0) >= 1
    table = runner.invoke(
        app,
        ["versions", "list", "--threads", "--graph", f"{here}:GRAPH_WITHOUT_REVIEW", "--dsn", dsn],
    )
    assert table.exit_code == 0 and "incompatible" in table.stdout


def test_saver_draws_no_uuid4_so_mocked_message_ids_stay_in_sequence(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LangGraph's suites number message ids by patching uuid.uuid4 (deterministic_uuids,
    used by test_root_graph): a run must draw from it exactly as with the stock saver."""
    import uuid

    from langgraph.checkpoint.memory import InMemorySaver

    real = uuid.uuid4
    draws: list[int] = []
    monkeypatch.setattr(uuid, "uuid4", lambda: draws.append(1) or real())

    def run(checkpointer: Any, tid: str) -> int:
        draws.clear()
        g = _chat_app(PlainState, checkpointer)
        g.invoke({"messages": [HumanMessage("hi")]}, cfg(tid))
        g.invoke({"messages": [HumanMessage("again")]}, cfg(tid))
        return len(draws)

    baseline = run(InMemorySaver(), "uuid-mem")
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        assert run(saver, "uuid-durable") == baseline


def test_changed_subgraph_with_a_thread_paused_inside_it_is_judged_inside(dsn: str) -> None:
    """The counterpart of test_versioning's subgraph test: here the pending work (an
    interrupt) is inside the changed subgraph, so the subgraph's own checkpoint is
    classified against the old subgraph's stored topology. A node added after the
    interrupted one is compatible there (issue 24 item 7; this test asserted a refusal
    before); test_graph_edits.py has the incompatible counterpart."""
    ran: list[str] = []

    def outer(extra: bool) -> Any:
        inner = StateGraph(S)
        inner.add_node("draft", _rec("draft", ran, asks=True))
        inner.add_edge(START, "draft")
        if extra:
            inner.add_node("polish", _rec("polish", ran))
            inner.add_edge("draft", "polish")
            inner.add_edge("polish", END)
        else:
            inner.add_edge("draft", END)
        b = StateGraph(S)
        b.add_node("write", inner.compile())
        b.add_edge(START, "write")
        b.add_edge("write", END)
        return b

    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        assert "__interrupt__" in outer(False).compile(checkpointer=saver).invoke(
            {"log": []}, cfg("sub-in")
        )
        out = outer(True).compile(checkpointer=saver).invoke(Command(resume="ok"), cfg("sub-in"))
        assert ran == ["draft", "draft", "polish"]
        assert out["log"] == ["draft", "polish"]


def test_cli_versions_record_backfills_an_old_version(dsn: str) -> None:
    """A version written before topologies were stored is 'unknown' (refused) until its
    topology is recorded from the old code; then it is classified like any other."""
    import json

    from typer.testing import CliRunner

    from langgraph_durable.cli import app

    ran: list[str] = []
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        g1 = _pause(saver, "backfill-1", ran)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "DELETE FROM durable_graph_versions WHERE version = %s", (graph_fingerprint(g1),)
            )
        g2 = _pipeline(ran, extra_node=True).compile(checkpointer=saver)
        with pytest.raises(GraphVersionMismatchError):
            g2.invoke(Command(resume="ok"), cfg("backfill-1"))
        result = CliRunner().invoke(
            app,
            ["versions", "record", "--graph", f"{__file__}:OLD_PIPELINE", "--dsn", dsn, "--json"],
        )
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["version"] == graph_fingerprint(g1)
        g2.invoke(Command(resume="ok"), cfg("backfill-1"))
        assert ran[-2:] == ["review", "finish"]


OLD_PIPELINE = _pipeline(_SINK)  # the "old code" for `versions record --graph`


def test_damaged_topology_row_is_refused_as_unknown(dsn: str) -> None:
    ran: list[str] = []
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        g1 = _pause(saver, "damaged-topo-1", ran)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "UPDATE durable_graph_versions SET topology = jsonb_set(topology, '{description}', "
                "'\"garbage\"') WHERE version = %s",
                (graph_fingerprint(g1),),
            )
        g2 = _pipeline(ran, extra_node=True).compile(checkpointer=saver)
        with pytest.raises(GraphVersionMismatchError) as err:
            g2.invoke(Command(resume="ok"), cfg("damaged-topo-1"))
        assert err.value.compatibility["verdict"] == "unknown"
        assert ran == ["fetch", "review"]
        strict = _pipeline(ran, extra_node=True).compile(
            checkpointer=saver.bind(version_policy="strict")
        )
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "DELETE FROM durable_graph_versions WHERE version = %s", (graph_fingerprint(g1),)
            )
        with pytest.raises(GraphVersionMismatchError) as err:
            strict.invoke(Command(resume="ok"), cfg("damaged-topo-1"))
        assert err.value.compatibility["verdict"] == "unknown"  # strict errors classify too


async def test_async_classify_threads(dsn: str) -> None:
    from langgraph_durable.compat import aclassify_threads

    ran: list[str] = []
    async with AsyncDurablePostgresSaver.from_conn_string(dsn) as saver:
        g1 = _pipeline(ran).compile(checkpointer=saver)
        assert "__interrupt__" in await g1.ainvoke({"log": [], "note": "n"}, cfg("aclassify-1"))
        found = await aclassify_threads(
            saver, _pipeline(ran, drop_review=True).compile(), ["aclassify-1"]
        )
        assert found["aclassify-1"].verdict == "incompatible"
        same = await aclassify_threads(saver, _pipeline(ran).compile(), ["aclassify-1"])
        assert same["aclassify-1"].verdict == "identical"
