"""No lock-in: ``export_stock`` rewrites threads so the stock ``PostgresSaver`` reads them
exactly as the durable saver did (issue 12).

Threads are written by the durable saver with values large enough to be stored by
reference (artifacts), chunked lists, a ``DeltaChannel``, large pending writes of a
paused parallel step, a large interrupt payload and a subgraph. Each is read before the
export with the durable saver and after it with the stock saver: ``get_state`` (values,
next, tasks, interrupts), the full ``get_state_history`` and ``list`` checkpoint by
checkpoint must be equal. Real PostgreSQL, the real stock saver.
"""

# No `from __future__ import annotations`: LangGraph evaluates the local state schemas.

import json
import operator
from collections.abc import Iterator
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import _messages_delta_reducer, add_messages
from langgraph.types import Command, interrupt
from psycopg.rows import dict_row

from langgraph_durable import AsyncDurablePostgresSaver, DurablePostgresSaver
from langgraph_durable.export import (
    aexport_stock,
    compare_snapshots,
    export_stock,
    snapshot_thread,
)

BIG = "x" * 3000


def cfg(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id}}


class State(TypedDict, total=False):
    messages: Annotated[list, add_messages]
    docs: Annotated[list[str], operator.add]
    report: dict[str, Any]
    answer: str
    left: str
    right: str


class DeltaState(TypedDict, total=False):
    messages: Annotated[list, DeltaChannel(_messages_delta_reducer, snapshot_frequency=3)]


def chat_graph() -> StateGraph:
    """A growing message list (chunked), large documents, a nested dict, an interrupt
    with a large payload."""

    def research(state: State) -> dict[str, Any]:
        n = len(state.get("messages", []))
        return {
            "messages": [AIMessage(f"{BIG} reply {n}"), HumanMessage(f"{BIG} follow-up {n}")],
            "docs": [f"doc {n} " + BIG],
            "report": {"summary": BIG, "n": n, "sections": [BIG + str(i) for i in range(3)]},
        }

    def ask(state: State) -> dict[str, Any]:
        return {"answer": interrupt({"question": "approve?", "context": BIG})}

    b = StateGraph(State)
    b.add_node("research", research)
    b.add_node("ask", ask)
    b.add_edge(START, "research")
    b.add_edge("research", "ask")
    b.add_edge("ask", END)
    return b


def parallel_graph() -> StateGraph:
    """``left`` finishes with a large write while ``right`` interrupts: the paused step
    keeps left's large pending write."""

    def left(state: State) -> dict[str, Any]:
        return {"left": BIG + " left", "docs": [BIG + " from left"]}

    def right(state: State) -> dict[str, Any]:
        return {"right": interrupt("right?")}

    inner = StateGraph(State)
    inner.add_node("inner_step", lambda s: {"docs": [BIG + " from the subgraph"]})
    inner.add_edge(START, "inner_step")
    inner.add_edge("inner_step", END)

    b = StateGraph(State)
    b.add_node("sub", inner.compile())
    b.add_node("left", left)
    b.add_node("right", right)
    b.add_edge(START, "sub")
    b.add_edge("sub", "left")
    b.add_edge("sub", "right")
    b.add_edge("left", END)
    b.add_edge("right", END)
    return b


def delta_graph() -> StateGraph:
    b = StateGraph(DeltaState)
    b.add_node("chat", lambda s: {"messages": [AIMessage(f"{BIG} {len(s['messages'])}")]})
    b.add_edge(START, "chat")
    b.add_edge("chat", END)
    return b


@pytest.fixture
def stock(dsn: str) -> Iterator[PostgresSaver]:
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row) as conn:
        yield PostgresSaver(conn)


def ref_rows(dsn: str, thread_id: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM checkpoint_blobs WHERE thread_id = %s AND type = 'durable+ref')"
            " + (SELECT count(*) FROM checkpoint_writes WHERE thread_id = %s AND type = 'durable+ref')",
            (thread_id, thread_id),
        ).fetchone()
    assert row is not None
    return int(row[0])


def raw(dsn: str, thread_id: str) -> list[Any]:
    with psycopg.connect(dsn) as conn:
        return [
            conn.execute(
                f"SELECT * FROM {table} WHERE thread_id = %s ORDER BY 1, 2, 3, 4",
                (thread_id,),
            ).fetchall()
            for table in ("checkpoints", "checkpoint_blobs", "checkpoint_writes")
        ]


def state_view(graph: Any, thread_id: str) -> dict[str, Any]:
    """What a user sees: get_state (values, next, tasks, interrupts) and the history."""
    return {
        "state": graph.get_state(cfg(thread_id), subgraphs=True),
        "history": list(graph.get_state_history(cfg(thread_id))),
    }


def write_threads(saver: Any) -> dict[str, Any]:
    """The threads of the round trip, with their builders."""
    chat = chat_graph().compile(checkpointer=saver)
    for i in range(12):  # 24+ large messages: element artifacts and chunk artifacts
        out = chat.invoke({"messages": [HumanMessage(f"{BIG} q{i}")]}, cfg("exp-chat"))
        assert "__interrupt__" in out
        if i < 11:
            chat.invoke(Command(resume=f"yes {i}"), cfg("exp-chat"))
    par = parallel_graph().compile(checkpointer=saver)
    assert "__interrupt__" in par.invoke({"docs": []}, cfg("exp-parallel"))
    delta = delta_graph().compile(checkpointer=saver)
    for i in range(5):
        delta.invoke({"messages": [HumanMessage(f"{BIG} d{i}")]}, cfg("exp-delta"))
    return {"exp-chat": chat_graph, "exp-parallel": parallel_graph, "exp-delta": delta_graph}


def _export_audit(dsn: str) -> list[dict[str, object]]:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        return conn.execute(
            "SELECT thread_id, detail FROM durable_audit WHERE action = 'export.stock'"
        ).fetchall()


def test_stock_saver_reads_exported_threads_as_the_durable_saver_did(
    dsn: str, stock: PostgresSaver
) -> None:
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        builders = write_threads(saver)
        tids = sorted(builders)
        for tid in tids:
            assert ref_rows(dsn, tid) > 0, tid  # values really are stored by reference
        with pytest.raises(Exception):  # noqa: B017 - whatever the stock saver raises
            # Before the export the stock saver cannot read them (unknown type tag).
            [
                s.values
                for s in builders["exp-chat"]()
                .compile(checkpointer=stock)
                .get_state_history(cfg("exp-chat"))
            ]
        before = {tid: state_view(builders[tid]().compile(checkpointer=saver), tid) for tid in tids}
        tuples = {tid: snapshot_thread(saver, tid) for tid in tids}
        rows = {tid: raw(dsn, tid) for tid in tids}

        dry = export_stock(saver, thread_ids=tids, dry_run=True)
        assert {tid: raw(dsn, tid) for tid in tids} == rows  # nothing written
        assert _export_audit(dsn) == []  # a dry run is not an operator action
        report = export_stock(saver, thread_ids=tids)
        # One audit row per rewritten thread (issue 17: every operator action is audited).
        assert sorted(r["thread_id"] for r in _export_audit(dsn)) == tids

    assert report.ok and report.as_dict()["totals"] == dry.as_dict()["totals"]
    totals = report.totals()
    assert totals["threads"] == 3 and totals["threads_changed"] == 3
    assert totals["checkpoints"] == sum(len(t) for t in tuples.values())
    assert totals["blobs"] > 0 and totals["writes"] > 0
    by_thread = {t.thread_id: t for t in report.threads}
    assert by_thread["exp-parallel"].writes > 0  # left's large pending write, the interrupt
    mismatches = 0
    for tid in tids:
        assert ref_rows(dsn, tid) == 0
        mismatches += len(compare_snapshots(tuples[tid], snapshot_thread(stock, tid)))
        after = state_view(builders[tid]().compile(checkpointer=stock), tid)
        assert after["state"] == before[tid]["state"], tid
        assert after["history"] == before[tid]["history"], tid
    assert mismatches == 0
    # get_state shows the interrupt and the pending work the same way.
    st = before["exp-parallel"]["state"]
    assert st.next == ("right",) and st.interrupts and st.interrupts[0].value == "right?"
    # And the stock saver goes on with the threads.
    chat = chat_graph().compile(checkpointer=stock)
    assert chat.invoke(Command(resume="stock yes"), cfg("exp-chat"))["answer"] == "stock yes"
    par = parallel_graph().compile(checkpointer=stock)
    out = par.invoke(Command(resume="go"), cfg("exp-parallel"))
    assert out["right"] == "go" and out["left"] == BIG + " left"
    # Exporting again finds nothing to do.
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        again = export_stock(saver, thread_ids=tids)
    assert again.totals()["threads_changed"] == 0


async def test_async_export_and_the_async_stock_saver(dsn: str) -> None:
    async with AsyncDurablePostgresSaver.from_conn_string(dsn) as saver:
        g = chat_graph().compile(checkpointer=saver)
        for i in range(3):
            await g.ainvoke({"messages": [HumanMessage(f"{BIG} a{i}")]}, cfg("exp-async"))
            await g.ainvoke(Command(resume="ok"), cfg("exp-async"))
        await g.ainvoke({"messages": [HumanMessage(BIG)]}, cfg("exp-async"))
        before = [s async for s in g.aget_state_history(cfg("exp-async"))]
        progress: list[tuple[str, str]] = []
        report = await aexport_stock(
            saver, thread_ids=["exp-async"], on_progress=lambda t, o: progress.append((t, o))
        )
    assert progress == [("exp-async", "exported")] and report.totals()["blobs"] > 0
    async with await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row
    ) as conn:
        stock = AsyncPostgresSaver(conn)
        sg = chat_graph().compile(checkpointer=stock)
        assert [s async for s in sg.aget_state_history(cfg("exp-async"))] == before


def test_busy_thread_is_left_alone(dsn: str) -> None:
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        g = chat_graph().compile(checkpointer=saver)
        g.invoke({"messages": [HumanMessage(BIG)]}, cfg("exp-busy"))
        with psycopg.connect(dsn, autocommit=True) as conn:  # a live run elsewhere
            conn.execute(
                "UPDATE durable_threads SET lease_owner = 'other-host:1', "
                "lease_expires_at = now() + interval '1 hour' WHERE thread_id = 'exp-busy'"
            )
        rows = raw(dsn, "exp-busy")
        report = export_stock(saver, thread_ids=["exp-busy"])
        assert report.busy == ["exp-busy"] and not report.ok
        assert raw(dsn, "exp-busy") == rows


def test_cli_export_stock_dry_run_then_verify(dsn: str) -> None:
    from typer.testing import CliRunner

    from langgraph_durable.cli import app

    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        g = chat_graph().compile(checkpointer=saver)
        for i in range(3):
            g.invoke({"messages": [HumanMessage(f"{BIG} c{i}")]}, cfg("exp-cli"))
            g.invoke(Command(resume="ok"), cfg("exp-cli"))
    runner = CliRunner()
    rows = raw(dsn, "exp-cli")
    dry = runner.invoke(
        app, ["export-stock", "--thread", "exp-cli", "--dry-run", "--json", "--dsn", dsn]
    )
    assert dry.exit_code == 0, dry.output
    plan = json.loads(dry.stdout)
    assert plan["dry_run"] and plan["totals"]["blobs"] > 0
    assert plan["threads"][0]["channels"]  # which channels change
    assert raw(dsn, "exp-cli") == rows
    text = runner.invoke(app, ["export-stock", "--thread", "exp-cli", "--dry-run", "--dsn", dsn])
    assert "would inline" in text.stdout and "dry run" in text.stdout
    done = runner.invoke(
        app, ["export-stock", "--thread", "exp-cli", "--verify", "--json", "--dsn", dsn]
    )
    assert done.exit_code == 0, done.output
    out = json.loads(done.stdout)
    assert out["verified"] == {"threads": 1, "mismatches": 0}
    assert out["totals"]["blobs"] == plan["totals"]["blobs"]
    assert ref_rows(dsn, "exp-cli") == 0


def test_uninstall_as_documented_keeps_every_thread(admin_dsn: str) -> None:
    """export-stock, then drop every durable_* object (the list the docs give): the
    stock saver, set up again, reads the thread exactly as the durable saver did."""
    from conftest import drop_database, make_database

    from langgraph_durable.export import (
        DURABLE_COLLATIONS,
        DURABLE_FUNCTIONS,
        DURABLE_INDEXES,
        DURABLE_TABLES,
        DURABLE_TRIGGERS,
    )

    url = make_database(admin_dsn, "uninstall")
    try:
        with DurablePostgresSaver.from_conn_string(url) as saver:
            saver.setup()
            g = chat_graph().compile(checkpointer=saver)
            for i in range(4):
                g.invoke({"messages": [HumanMessage(f"{BIG} u{i}")]}, cfg("exp-uninstall"))
                g.invoke(Command(resume="ok"), cfg("exp-uninstall"))
            before = state_view(g, "exp-uninstall")
            tuples = snapshot_thread(saver, "exp-uninstall")
            assert export_stock(saver).ok
        with psycopg.connect(url, autocommit=True) as conn:
            for trigger in DURABLE_TRIGGERS:
                conn.execute(f"DROP TRIGGER {trigger} ON checkpoints")
            conn.execute(f"DROP TABLE {', '.join(DURABLE_TABLES)}")
            conn.execute(f"DROP FUNCTION {', '.join(DURABLE_FUNCTIONS)}")
            conn.execute(f"DROP INDEX {', '.join(DURABLE_INDEXES)}")
            conn.execute(f"DROP COLLATION IF EXISTS {', '.join(DURABLE_COLLATIONS)}")
            left = conn.execute(
                "SELECT count(*) FROM pg_class WHERE relname LIKE 'durable%%' "
                "AND relnamespace = 'public'::regnamespace"
            ).fetchone()
            assert left == (0,)
            assert conn.execute(
                "SELECT count(*) FROM pg_collation WHERE collname LIKE 'durable%%'"
            ).fetchone() == (0,)
        with PostgresSaver.from_conn_string(url) as stock:
            stock.setup()
            assert compare_snapshots(tuples, snapshot_thread(stock, "exp-uninstall")) == []
            assert state_view(chat_graph().compile(checkpointer=stock), "exp-uninstall") == before
    finally:
        drop_database(admin_dsn, url)


def test_damaged_artifact_fails_the_thread_and_writes_nothing(dsn: str) -> None:
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        g = chat_graph().compile(checkpointer=saver)
        g.invoke({"messages": [HumanMessage(BIG + " damaged")]}, cfg("exp-damaged"))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE durable_artifacts SET data = '\\x28b52ffd00'::bytea WHERE digest = "
            "(SELECT r.digest FROM durable_artifact_refs r WHERE r.thread_id = 'exp-damaged' "
            "AND NOT EXISTS (SELECT 1 FROM durable_artifact_refs o WHERE o.digest = r.digest "
            "AND o.thread_id <> 'exp-damaged') LIMIT 1)"  # one no other thread shares
        )
    rows = raw(dsn, "exp-damaged")
    with DurablePostgresSaver.from_conn_string(dsn) as saver:  # a fresh cache
        report = export_stock(saver, thread_ids=["exp-damaged"])
    assert list(report.failed) == ["exp-damaged"] and not report.ok
    assert "corrupted" in report.failed["exp-damaged"]
    assert raw(dsn, "exp-damaged") == rows
