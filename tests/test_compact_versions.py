"""Compact channel versions (issue 26, storage at the payload floor; ``_chanver``).

The saver writes ``v`` + a length letter + the counter + 8 random characters instead of the stock
51-character version. What must hold, on real PostgreSQL with the real stock saver:
the order LangGraph compares (``>``) within the compact form and against stock versions
(a stock-written thread continued here, then exported and continued by the stock saver
again, triggers every node it should), loud failure instead of a misordered version when
the stock saver meets a compact one without the export, and ``compact_versions=False``
writing the stock form exactly.
"""

# No `from __future__ import annotations`: LangGraph evaluates the local state schemas.

import operator
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph
from psycopg.rows import dict_row

from langgraph_durable import DurablePostgresSaver, _chanver
from langgraph_durable.export import export_stock


def cfg(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id}}


class Loop(TypedDict, total=False):
    turn: int
    log: Annotated[list[str], operator.add]
    seen: int


def loop_graph() -> StateGraph:
    """Two nodes: ``a`` runs on every input, ``b`` only when ``a`` wrote ``log`` (a
    version LangGraph must see as newer than what ``b`` saw last)."""

    def a(s: Loop) -> dict[str, Any]:
        return {"log": [f"a{s.get('turn', 0)}"]}

    def b(s: Loop) -> dict[str, Any]:
        return {"seen": len(s.get("log", []))}

    g = StateGraph(Loop)
    g.add_node("a", a)
    g.add_node("b", b)
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", END)
    return g


def versions(dsn: str, thread_id: str) -> tuple[list[Any], list[str]]:
    """Every version in the thread's checkpoints and blob keys."""
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        cps = conn.execute(
            "SELECT checkpoint FROM checkpoints WHERE thread_id = %s", (thread_id,)
        ).fetchall()
        blobs = conn.execute(
            "SELECT version FROM checkpoint_blobs WHERE thread_id = %s", (thread_id,)
        ).fetchall()
    out: list[Any] = []
    for r in cps:
        out += list(r["checkpoint"]["channel_versions"].values())
        for s in r["checkpoint"]["versions_seen"].values():
            out += list(s.values())
    return out, [r["version"] for r in blobs]


@pytest.fixture
def stock(dsn: str) -> Any:
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row) as conn:
        yield PostgresSaver(conn)


def test_the_saver_writes_compact_versions_and_reads_them_back(dsn: str) -> None:
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        g = loop_graph().compile(checkpointer=saver)
        for i in range(4):
            out = g.invoke({"turn": i}, cfg("cv-own"))
        assert out["log"] == ["a0", "a1", "a2", "a3"] and out["seen"] == 4
        head = saver.get_tuple(cfg("cv-own"))
        assert head is not None
    in_cps, in_blobs = versions(dsn, "cv-own")
    assert in_cps and in_blobs
    # Fails on main: the stock form ("000...0012.0.5837...", 51 characters).
    assert all(_chanver.is_compact(v) for v in in_cps + in_blobs), in_cps[:3]
    assert max(len(v) for v in in_cps) <= 14  # "vb16.xxxxxxxx": 13


def test_compact_versions_off_writes_the_stock_form(dsn: str) -> None:
    with DurablePostgresSaver.from_conn_string(dsn, compact_versions=False) as saver:
        g = loop_graph().compile(checkpointer=saver)
        g.invoke({"turn": 0}, cfg("cv-off"))
    in_cps, in_blobs = versions(dsn, "cv-off")
    assert in_cps and not any(_chanver.is_compact(v) for v in in_cps + in_blobs)
    assert all(len(v.split(".")[0]) == 32 for v in in_cps)


def test_stock_thread_continues_compact_then_exports_back_to_stock(dsn: str, stock: PostgresSaver) -> None:
    """Adoption and the way back: stock versions, then compact ones above them, then
    export-stock, then the stock saver again; every turn runs both nodes."""
    stock.setup()
    sg = loop_graph().compile(checkpointer=stock)
    for i in range(3):
        sg.invoke({"turn": i}, cfg("cv-mixed"))
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        g = loop_graph().compile(checkpointer=saver)
        for i in range(3, 6):
            out = g.invoke({"turn": i}, cfg("cv-mixed"))
        assert out["seen"] == 6 and out["log"][-1] == "a5"
        in_cps, _ = versions(dsn, "cv-mixed")
        assert any(_chanver.is_compact(v) for v in in_cps) and not all(_chanver.is_compact(v) for v in in_cps)

        # The stock saver cannot continue from a compact version: it fails loudly (it
        # would otherwise write versions that sort below the compact ones).
        with pytest.raises(ValueError):
            sg.invoke({"turn": 99}, cfg("cv-mixed"))
        assert stock.get_tuple(cfg("cv-mixed")).checkpoint["channel_values"]["turn"] == 5  # type: ignore[union-attr]

        report = export_stock(saver, thread_ids=["cv-mixed"])
        assert report.ok and report.threads[0].versions > 0
        again = export_stock(saver, thread_ids=["cv-mixed"])
        assert not again.threads[0].changed
    in_cps, in_blobs = versions(dsn, "cv-mixed")
    assert not any(_chanver.is_compact(v) for v in in_cps + in_blobs)
    for i in range(6, 8):
        out = sg.invoke({"turn": i}, cfg("cv-mixed"))
    assert out["log"] == [f"a{i}" for i in range(8)] and out["seen"] == 8
    hist = list(sg.get_state_history(cfg("cv-mixed")))
    assert len(hist) == 8 * 4


_stock_version = st.integers(min_value=0, max_value=10**20).map(lambda n: f"{n:032}.0.{n % 97}")


# Counters of every size, and the ones where the digit count (the length letter) changes.
_counter = st.one_of(
    st.integers(min_value=0, max_value=10**25 - 2),
    st.sampled_from([10**k + d for k in range(1, 25) for d in (-2, -1, 0)]),
)


@settings(max_examples=400, deadline=None)
@given(_counter, _counter, _stock_version)
def test_compact_order(n: int, m: int, stock_v: str) -> None:
    vn, vm = _chanver.next_compact(n), _chanver.next_compact(m)
    assert _chanver.is_compact(vn) and _chanver.counter(vn) == n + 1
    after = _chanver.next_compact(vn)
    assert after > vn and _chanver.counter(after) == n + 2
    if n != m:
        assert (vn < vm) == (n < m)
        # The stock form export writes keeps the order, and the counter.
        assert (_chanver.to_stock(vn) < _chanver.to_stock(vm)) == (n < m)
    assert _chanver.counter(_chanver.to_stock(vn)) == n + 1
    # Any compact version sorts after any stock one; the next after a stock one too.
    assert vn > stock_v and _chanver.next_compact(stock_v) > stock_v
    assert _chanver.counter(_chanver.next_compact(stock_v)) == _chanver.counter(stock_v) + 1
    assert _chanver.to_stock(stock_v) == stock_v
