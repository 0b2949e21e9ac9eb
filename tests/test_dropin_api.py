"""Drop-in for real (issue 12): every stock call pattern works unchanged, checkpoints in
the pre-v4 format are read as the stock saver reads them, and a LangGraph whose run
starts the saver does not recognise is refused instead of running unprotected."""

from __future__ import annotations

import inspect
import operator
from collections.abc import Iterator
from typing import Annotated, Any, TypedDict

import asyncpg
import psycopg
import pytest
from conftest import drop_database, make_database
from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.postgres.base import MIGRATIONS as STOCK_MIGRATIONS
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.serde.types import TASKS
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_durable import (
    AsyncDurablePostgresSaver,
    ConfigurationError,
    DurablePostgresSaver,
    UnsupportedConnectionError,
    _sql,
)
from langgraph_durable.saver import _DurableBase


@pytest.fixture
def fresh_db(admin_dsn: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """An empty database (no setup yet)."""
    url = make_database(admin_dsn, "dropin_" + request.node.name[:14])
    yield url
    drop_database(admin_dsn, url)


def migrated(dsn: str) -> tuple[list[int], list[int]]:
    with psycopg.connect(dsn) as conn:
        stock = [r[0] for r in conn.execute("SELECT v FROM checkpoint_migrations ORDER BY v")]
        ours = [r[0] for r in conn.execute("SELECT v FROM durable_migrations ORDER BY v")]
    return stock, ours


FULL = (list(range(len(STOCK_MIGRATIONS))), list(range(len(_sql.MIGRATIONS))))


class S(TypedDict):
    log: Annotated[list[str], operator.add]


def ask_graph(checkpointer: Any) -> Any:
    """a -> ask (interrupts) -> b: a run, a pause and a resume."""

    def ask(state: S) -> dict[str, list[str]]:
        return {"log": [f"ask:{interrupt('ok?')}"]}

    g = StateGraph(S)
    g.add_node("a", lambda s: {"log": ["a"]})
    g.add_node("ask", ask)
    g.add_node("b", lambda s: {"log": ["b"]})
    g.add_edge(START, "a")
    g.add_edge("a", "ask")
    g.add_edge("ask", "b")
    g.add_edge("b", END)
    return g.compile(checkpointer=checkpointer)


# --------------------------------------------------------------------------- setup
async def test_async_setup_is_awaited_like_the_stock_saver(fresh_db: str) -> None:
    """``await checkpointer.setup()`` (LangGraph's docs) on the async saver; ``asetup``
    stays an alias. It raised asyncio.InvalidStateError before."""
    async with AsyncDurablePostgresSaver.from_conn_string(fresh_db) as saver:
        assert inspect.iscoroutinefunction(AsyncDurablePostgresSaver.setup)
        await saver.setup()
        await saver.setup()
        await saver.asetup()
    assert migrated(fresh_db) == FULL
    with DurablePostgresSaver.from_conn_string(fresh_db) as ssaver:
        assert not inspect.iscoroutinefunction(DurablePostgresSaver.setup)
        assert ssaver.setup() is None
        await ssaver.asetup()
    assert migrated(fresh_db) == FULL


# --------------------------------------------------------------------------- signatures
def _keyword_options(fn: Any) -> dict[str, Any]:
    sig = inspect.signature(fn)
    assert not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()), fn
    return {n: p.default for n, p in sig.parameters.items() if p.kind is p.KEYWORD_ONLY}


def test_signatures_are_stock_and_explicit() -> None:
    """Stock positional order ``(conn, pipe, serde)``; every package option keyword-only
    and spelled out (no ``**options``), the same set with the same defaults everywhere."""
    base = _keyword_options(_DurableBase.__init__)
    assert "serde" in base and "on_unrecognised_run" in base
    own = {k: v for k, v in base.items() if k != "serde"}
    for cls in (DurablePostgresSaver, AsyncDurablePostgresSaver):
        params = list(inspect.signature(cls.__init__).parameters.values())
        assert [p.name for p in params[:4]] == ["self", "conn", "pipe", "serde"]
        assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params[1:4])
        assert params[2].default is None and params[3].default is None
        assert _keyword_options(cls.__init__) == own
        fcs = _keyword_options(cls.from_conn_string)
        assert fcs.pop("pipeline") is False and fcs.pop("pool_size") == 10
        assert fcs.pop("serde") is None
        assert fcs == own
        first = next(iter(inspect.signature(cls.from_conn_string).parameters.values()))
        assert first.name == "conn_string" and first.kind is first.POSITIONAL_OR_KEYWORD


def test_stock_constructor_calls_sync(dsn: str) -> None:
    """Each call the stock docs and tests make, with the durable class substituted."""
    serde = JsonPlusSerializer()
    with DurablePostgresSaver.from_conn_string(dsn, pipeline=True, serde=serde) as saver:
        assert saver.serde is serde
        out = ask_graph(saver).invoke({"log": []}, {"configurable": {"thread_id": "fcs-pipe"}})
        assert out["log"] == ["a"]
    with DurablePostgresSaver.from_conn_string(dsn, pipeline=False) as saver:
        out = ask_graph(saver).invoke(Command(resume="y"), {"configurable": {"thread_id": "fcs-pipe"}})
        assert out["log"] == ["a", "ask:y", "b"]
    with psycopg.Connection.connect(dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row) as conn:
        positional = DurablePostgresSaver(conn, None, serde)
        assert positional.serde is serde and positional.pipe is None
        with conn.pipeline() as pipe:
            saver = DurablePostgresSaver(conn, pipe=pipe)
            assert saver.pipe is pipe
            saver.setup()  # in pipeline mode (the stock setup fails there)
            cfg = {"configurable": {"thread_id": "pipe-run"}}
            graph = ask_graph(saver)
            assert graph.invoke({"log": []}, cfg)["log"] == ["a"]
            assert graph.invoke(Command(resume="z"), cfg)["log"] == ["a", "ask:z", "b"]
            assert graph.get_state(cfg).next == ()
            history = list(graph.get_state_history(cfg))
    # Everything the pipe saver wrote was synced and committed: the stock saver sees it.
    with PostgresSaver.from_conn_string(dsn) as stock:
        cfg = {"configurable": {"thread_id": "pipe-run"}}
        assert ask_graph(stock).get_state(cfg).values == {"log": ["a", "ask:z", "b"]}
        assert len(list(stock.list(cfg))) == len(history)
    # As in the stock saver, a pipe goes with a single connection only.
    with ConnectionPool(dsn, min_size=1, max_size=1, kwargs={"autocommit": True}, open=True) as pool:
        with psycopg.Connection.connect(dsn, autocommit=True) as other, other.pipeline() as pipe:
            with pytest.raises(ConfigurationError, match="single connection"):
                DurablePostgresSaver(pool, pipe=pipe)


async def test_stock_constructor_calls_async(dsn: str) -> None:
    serde = JsonPlusSerializer()
    async with AsyncDurablePostgresSaver.from_conn_string(dsn, pipeline=True, serde=serde) as saver:
        assert saver.serde is serde
        out = await ask_graph(saver).ainvoke({"log": []}, {"configurable": {"thread_id": "afcs"}})
        assert out["log"] == ["a"]
    aconn = await psycopg.AsyncConnection.connect(dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row)
    async with aconn:
        positional = AsyncDurablePostgresSaver(aconn, None, serde)
        assert positional.serde is serde
        async with aconn.pipeline() as pipe:
            saver = AsyncDurablePostgresSaver(aconn, pipe=pipe)
            await saver.setup()
            cfg = {"configurable": {"thread_id": "apipe-run"}}
            graph = ask_graph(saver)
            assert (await graph.ainvoke({"log": []}, cfg))["log"] == ["a"]
            assert (await graph.ainvoke(Command(resume="q"), cfg))["log"] == ["a", "ask:q", "b"]
    async with AsyncPostgresSaver.from_conn_string(dsn) as stock:
        state = await ask_graph(stock).aget_state({"configurable": {"thread_id": "apipe-run"}})
        assert state.values == {"log": ["a", "ask:q", "b"]}
    async with AsyncConnectionPool(dsn, min_size=1, max_size=1, kwargs={"autocommit": True}, open=False) as apool:
        aother = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        async with aother, aother.pipeline() as apipe:
            with pytest.raises(ConfigurationError, match="single connection"):
                AsyncDurablePostgresSaver(apool, pipe=apipe)


async def test_asyncpg_pool_is_refused_with_what_to_pass(dsn: str) -> None:
    """Some tutorials hand an asyncpg pool to the saver: a typed error naming the fix."""
    p = psycopg.conninfo.conninfo_to_dict(dsn)
    pool = await asyncpg.create_pool(
        host=p.get("host"), port=int(p.get("port") or 5432), user=p.get("user"),
        password=p.get("password"), database=p.get("dbname"), min_size=1, max_size=1,
    )
    try:
        with pytest.raises(UnsupportedConnectionError) as info:
            AsyncDurablePostgresSaver(pool)  # type: ignore[arg-type]
        err = info.value
        assert isinstance(err, ConfigurationError) and isinstance(err, TypeError)
        assert err.got.startswith("asyncpg.")
        assert "AsyncConnectionPool" in err.expected
        assert "from_conn_string" in str(err) and "psycopg_pool" in str(err)
        # Survives pickling with its fields, like every DurableError.
        import pickle

        again = pickle.loads(pickle.dumps(err))
        assert again.fields == err.fields
    finally:
        await pool.close()
    with pytest.raises(UnsupportedConnectionError, match="from_conn_string"):
        DurablePostgresSaver(dsn)  # type: ignore[arg-type]
    aconn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    async with aconn:
        with pytest.raises(UnsupportedConnectionError, match="AsyncDurablePostgresSaver"):
            DurablePostgresSaver(aconn)  # type: ignore[arg-type]
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(UnsupportedConnectionError, match="use DurablePostgresSaver"):
            AsyncDurablePostgresSaver(conn)  # type: ignore[arg-type]


def test_pipeline_must_be_a_bool(dsn: str) -> None:
    with pytest.raises(ConfigurationError):
        with DurablePostgresSaver.from_conn_string(dsn, pipeline="yes"):  # type: ignore[arg-type]
            pass


# --------------------------------------------------------------------------- legacy formats
def _write_pre_v4(saver: Any, thread_id: str) -> Any:
    """The stock test_pending_sends_migration: a v2 checkpoint with pending sends
    written as TASKS writes, then a child checkpoint."""
    config: Any = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    checkpoint_0 = empty_checkpoint()
    assert checkpoint_0["v"] < 4
    config = saver.put(config, checkpoint_0, {}, {})
    saver.put_writes(config, [(TASKS, "send-1"), (TASKS, "send-2")], task_id="task-1")
    saver.put_writes(config, [(TASKS, "send-3")], task_id="task-2")
    return saver.put(config, create_checkpoint(checkpoint_0, {}, 1), {}, {})


async def _awrite_pre_v4(saver: Any, thread_id: str) -> Any:
    config: Any = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    checkpoint_0 = empty_checkpoint()
    config = await saver.aput(config, checkpoint_0, {}, {})
    await saver.aput_writes(config, [(TASKS, "send-1"), (TASKS, "send-2")], task_id="task-1")
    await saver.aput_writes(config, [(TASKS, "send-3")], task_id="task-2")
    return await saver.aput(config, create_checkpoint(checkpoint_0, {}, 1), {}, {})


def _view(t: Any) -> tuple[Any, ...]:
    cp = t.checkpoint
    # A first version (get_next_version(None, None), as the stock migration assigns when
    # the checkpoint has none) carries a random fraction: compare its counter part.
    versions = {k: str(v).split(".")[0] for k, v in cp["channel_versions"].items()}
    return (t.config, cp["channel_values"], versions, cp["v"], t.parent_config, t.pending_writes)


@pytest.mark.parametrize("threshold", [1024, 0], ids=["inline", "sends-offloaded"])
def test_pending_sends_migration_sync(dsn: str, threshold: int) -> None:
    """Pre-v4 pending sends move from the parent's TASKS writes into the child's TASKS
    channel on read, in get_tuple and list, exactly as the stock saver returns them."""
    tid = f"legacy-sync-{threshold}"
    with DurablePostgresSaver.from_conn_string(dsn, artifact_threshold=threshold) as saver:
        child = _write_pre_v4(saver, tid)
        parent_cfg = {"configurable": {"thread_id": tid, "checkpoint_ns": ""}}
        got = saver.get_tuple(child)
        assert got is not None
        assert got.checkpoint["channel_values"] == {TASKS: ["send-1", "send-2", "send-3"]}
        assert TASKS in got.checkpoint["channel_versions"]
        listed = list(saver.list(parent_cfg))
        assert len(listed) == 2
        assert listed[0].checkpoint["channel_values"] == {TASKS: ["send-1", "send-2", "send-3"]}
        assert listed[-1].checkpoint["channel_values"] == {}
        assert listed[-1].checkpoint["channel_versions"] == {}
        # list() of every thread (no config) migrates too.
        everything = [t for t in saver.list(None) if t.config["configurable"]["thread_id"] == tid]
        assert [_view(t) for t in everything] == [_view(t) for t in listed]
    if threshold:
        # What the stock saver returns for the same rows.
        with PostgresSaver.from_conn_string(dsn) as stock:
            want = stock.get_tuple(child)
            assert want is not None and _view(got) == _view(want)
            assert [_view(t) for t in listed] == [_view(t) for t in stock.list(parent_cfg)]
        # ...and for rows the stock saver wrote itself.
        with PostgresSaver.from_conn_string(dsn) as stock:
            stock_child = _write_pre_v4(stock, tid + "-by-stock")
            want = stock.get_tuple(stock_child)
        with DurablePostgresSaver.from_conn_string(dsn) as saver:
            assert _view(saver.get_tuple(stock_child)) == _view(want)


async def test_pending_sends_migration_async(dsn: str) -> None:
    tid = "legacy-async"
    async with AsyncDurablePostgresSaver.from_conn_string(dsn) as saver:
        child = await _awrite_pre_v4(saver, tid)
        got = await saver.aget_tuple(child)
        assert got is not None
        assert got.checkpoint["channel_values"] == {TASKS: ["send-1", "send-2", "send-3"]}
        listed = [t async for t in saver.alist({"configurable": {"thread_id": tid}})]
        assert listed[0].checkpoint["channel_values"] == {TASKS: ["send-1", "send-2", "send-3"]}
        assert listed[-1].checkpoint["channel_values"] == {}
    async with AsyncPostgresSaver.from_conn_string(dsn) as stock:
        want = await stock.aget_tuple(child)
        assert want is not None and _view(got) == _view(want)
        assert [_view(t) for t in listed] == [
            _view(t) async for t in stock.alist({"configurable": {"thread_id": tid}})
        ]
