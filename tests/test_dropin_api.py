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
)
from langgraph_durable.config import SaverOptions
from langgraph_durable.sql import schema as _sql


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
    # The one list of the package's options: config.SaverOptions.from_keywords.
    own = _keyword_options(SaverOptions.from_keywords)
    assert "on_unrecognised_run" in own and "serde" not in own
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
            with psycopg.Connection.connect(dsn, autocommit=True) as third:
                with pytest.raises(ConfigurationError, match="not a pipeline of conn"):
                    DurablePostgresSaver(third, pipe=pipe)


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


# --------------------------------------------------------------------------- fail closed
class Leases:
    """Records, from inside nodes, whether the running thread's lease is held."""

    def __init__(self, saver: Any) -> None:
        self.saver = saver
        self.seen: list[tuple[str, bool]] = []

    def node(self, name: str) -> Any:
        def run(state: S) -> dict[str, list[str]]:
            self.record(name)
            return {"log": [name]}

        return run

    def record(self, name: str) -> None:
        from langgraph.config import get_config

        thread_id = str(get_config()["configurable"]["thread_id"])
        self.seen.append((name, self.saver.lease_for(thread_id) is not None))


def chain(leases: Leases, checkpointer: Any = None, *, sub: Any = None) -> Any:
    g = StateGraph(S)
    g.add_node("a", leases.node("a"))
    g.add_node("b", sub if sub is not None else leases.node("b"))
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", END)
    return g.compile(checkpointer=checkpointer)


def cfg(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id}}


@pytest.fixture
def drift(monkeypatch: pytest.MonkeyPatch) -> None:
    """A LangGraph release whose run starts the saver no longer recognises."""
    import langgraph_durable.lifecycle as saver_module  # the saver's run-start recognition

    monkeypatch.setattr(saver_module, "_find_run_context", lambda: None)


def rows_of(dsn: str, thread_id: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM checkpoints WHERE thread_id = %s", (thread_id,)).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
def test_every_sync_entry_point_is_recognised(dsn: str, durability: str) -> None:
    """invoke, stream, batch, a subgraph and @entrypoint, with the real recognition:
    each holds the thread's lease in every node (none is refused)."""
    from langgraph.func import entrypoint, task

    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        leases = Leases(saver)
        graph = chain(leases, saver)
        d: Any = durability
        assert graph.invoke({"log": []}, cfg(f"inv-{d}"), durability=d)["log"] == ["a", "b"]
        chunks = list(graph.stream({"log": []}, cfg(f"str-{d}"), durability=d))
        assert [next(iter(c)) for c in chunks] == ["a", "b"]
        outs = graph.batch([{"log": []}, {"log": []}], [cfg(f"bat1-{d}"), cfg(f"bat2-{d}")], durability=d)
        assert [o["log"] for o in outs] == [["a", "b"], ["a", "b"]]
        parent = chain(leases, saver, sub=chain(leases))
        assert parent.invoke({"log": []}, cfg(f"sub-{d}"), durability=d)["log"] == ["a", "a", "a", "b"]

        @task
        def step(x: int) -> int:
            leases.record("task")
            return x + 1

        @entrypoint(checkpointer=saver)
        def workflow(x: int) -> int:
            leases.record("entrypoint")
            return step(x).result()

        assert workflow.invoke(1, cfg(f"ent-{d}"), durability=d) == 2
        assert len(leases.seen) == 2 + 2 + 4 + 3 + 2
        assert all(held for _, held in leases.seen), leases.seen
        # Time travel: a replay from an earlier checkpoint (LangGraph loads it, then the
        # latest one through checkpoint_superseded) is a recognised run start too.
        graph.invoke({"log": []}, cfg(f"tt-{d}"), durability="sync")
        before_b = next(s for s in graph.get_state_history(cfg(f"tt-{d}")) if s.next == ("b",))
        replayed = graph.invoke(None, before_b.config, durability=d)
        assert replayed["log"] == ["a", "b"]
        assert len(leases.seen) == 2 + 2 + 4 + 3 + 2 + 2 + 1 and all(h for _, h in leases.seen)
        # Not runs, never refused: update_state, copy_thread; state is intact.
        graph.update_state(cfg(f"inv-{d}"), {"log": ["u"]})
        saver.copy_thread(f"inv-{d}", f"inv-{d}-copy")
        assert graph.get_state(cfg(f"inv-{d}-copy")).values == {"log": ["a", "b", "u"]}


async def test_every_async_entry_point_is_recognised(dsn: str) -> None:
    """ainvoke, astream, astream_events, abatch, a subgraph, @entrypoint, and a sync
    graph run on the async saver from another thread (sync-on-async)."""
    import asyncio

    from langgraph.func import entrypoint, task

    async with AsyncDurablePostgresSaver.from_conn_string(dsn) as saver:
        leases = Leases(saver)
        graph = chain(leases, saver)
        assert (await graph.ainvoke({"log": []}, cfg("a-inv")))["log"] == ["a", "b"]
        assert [next(iter(c)) async for c in graph.astream({"log": []}, cfg("a-str"))] == ["a", "b"]
        events = [e["event"] async for e in graph.astream_events({"log": []}, cfg("a-ev"), version="v2")]
        assert "on_chain_end" in events
        outs = await graph.abatch([{"log": []}, {"log": []}], [cfg("a-bat1"), cfg("a-bat2")])
        assert [o["log"] for o in outs] == [["a", "b"], ["a", "b"]]
        parent = chain(leases, saver, sub=chain(leases))
        assert (await parent.ainvoke({"log": []}, cfg("a-sub")))["log"] == ["a", "a", "a", "b"]
        sync_out = await asyncio.to_thread(graph.invoke, {"log": []}, cfg("a-sync-on-async"))
        assert sync_out["log"] == ["a", "b"]

        @task
        async def step(x: int) -> int:
            leases.record("task")
            return x + 1

        @entrypoint(checkpointer=saver)
        async def workflow(x: int) -> int:
            leases.record("entrypoint")
            return await step(x)

        assert await workflow.ainvoke(1, cfg("a-ent")) == 2
        assert len(leases.seen) == 2 * 5 + 3 + 2 + 2
        assert all(held for _, held in leases.seen), leases.seen
        before_b = [s async for s in graph.aget_state_history(cfg("a-inv")) if s.next == ("b",)][0]
        assert (await graph.ainvoke(None, before_b.config))["log"] == ["a", "b"]
        assert leases.seen[-1] == ("b", True)
        await graph.aupdate_state(cfg("a-inv"), {"log": ["u"]})
        await saver.acopy_thread("a-inv", "a-inv-copy")
        assert (await graph.aget_state(cfg("a-inv-copy"))).values == {"log": ["a", "b", "u"]}


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
def test_unrecognised_run_start_is_refused_before_any_node(dsn: str, drift: None, durability: str) -> None:
    """LangGraph changed under the saver: the run is refused with a typed error naming
    the LangGraph version, before its first node runs and before anything is written."""
    from importlib.metadata import version

    from langgraph_durable import UnsupportedLangGraphError

    tid = f"drift-{durability}"
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        leases = Leases(saver)
        graph = chain(leases, saver)
        with pytest.raises(UnsupportedLangGraphError) as info:
            graph.invoke({"log": []}, cfg(tid), durability=durability)  # type: ignore[arg-type]
        assert leases.seen == []
        assert rows_of(dsn, tid) == 0
        err = info.value
        assert err.langgraph_version == version("langgraph") and err.thread_id == tid
        assert version("langgraph") in str(err) and "on_unrecognised_run" in str(err)
        with pytest.raises(UnsupportedLangGraphError):
            list(graph.stream({"log": []}, cfg(tid), durability=durability))  # type: ignore[arg-type]
        assert leases.seen == [] and rows_of(dsn, tid) == 0
        # What is not a run keeps working: update_state writes a checkpoint...
        graph.update_state(cfg(tid + "-upd"), {"log": ["u"]})
        assert graph.get_state(cfg(tid + "-upd")).values == {"log": ["u"]}
        saver.copy_thread(tid + "-upd", tid + "-upd-copy")
        assert rows_of(dsn, tid + "-upd-copy") == 1
    # ...and so does a saver without leases (protection deliberately off).
    with DurablePostgresSaver.from_conn_string(dsn, leases=False) as plain:
        out = chain(Leases(plain), plain).invoke({"log": []}, cfg(tid + "-plain"), durability=durability)  # type: ignore[arg-type]
        assert out["log"] == ["a", "b"]


async def test_unrecognised_async_run_start_is_refused(dsn: str, drift: None) -> None:
    from langgraph_durable import UnsupportedLangGraphError

    async with AsyncDurablePostgresSaver.from_conn_string(dsn) as saver:
        leases = Leases(saver)
        graph = chain(leases, saver)
        with pytest.raises(UnsupportedLangGraphError):
            await graph.ainvoke({"log": []}, cfg("adrift"))
        with pytest.raises(UnsupportedLangGraphError):
            [e async for e in graph.astream_events({"log": []}, cfg("adrift"), version="v2")]
        import asyncio

        with pytest.raises(UnsupportedLangGraphError):
            await asyncio.to_thread(graph.invoke, {"log": []}, cfg("adrift"))
        assert leases.seen == [] and rows_of(dsn, "adrift") == 0


def test_put_backstop_refuses_an_unleased_root_run(dsn: str, drift: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Should a release load a run's state without the get_tuple the saver watches, the
    run's first checkpoint write (the input checkpoint, before the first node under
    durability="sync") is refused."""
    from langgraph_durable import UnsupportedLangGraphError

    monkeypatch.setattr(DurablePostgresSaver, "_check_unrecognised_start", lambda self, config: None)
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        leases = Leases(saver)
        with pytest.raises(UnsupportedLangGraphError, match="checkpoint write"):
            chain(leases, saver).invoke({"log": []}, cfg("backstop"), durability="sync")
        assert leases.seen == [] and rows_of(dsn, "backstop") == 0


def test_on_unrecognised_run_log_runs_unprotected_with_an_error(
    dsn: str, drift: None, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    with pytest.raises(ConfigurationError):
        DurablePostgresSaver.from_conn_string(dsn, on_unrecognised_run="ignore").__enter__()  # type: ignore[arg-type]
    with DurablePostgresSaver.from_conn_string(dsn, on_unrecognised_run="log") as saver:
        leases = Leases(saver)
        with caplog.at_level(logging.ERROR, logger="langgraph_durable"):
            out = chain(leases, saver).invoke({"log": []}, cfg("logged"))
        assert out["log"] == ["a", "b"]
        assert leases.seen == [("a", False), ("b", False)]  # ran, without a lease
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1 and "did not recognise" in errors[0] and "unprotected" in errors[0]


# --------------------------------------------------------------------------- private names
def test_private_names_are_checked_at_import(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every private LangGraph name the package relies on is listed and present; a
    release without one makes ``import langgraph_durable`` fail with a typed error
    naming it and the installed versions (not an ImportError deep in saver.py)."""
    import subprocess
    import sys

    from langgraph.checkpoint.postgres import base as pg_base

    from langgraph_durable import UnsupportedLangGraphError, _compat

    assert _compat.missing_names() == []
    listed = {f"{m}:{a}" for m, a in _compat.REQUIRED}
    assert {
        "langgraph.checkpoint.postgres.base:_keep_latest",
        "langgraph.checkpoint.serde.types:_DeltaSnapshot",
        "langgraph.pregel._loop:PregelLoop",
    } <= listed
    monkeypatch.delattr(pg_base, "_keep_latest")
    monkeypatch.delattr(pg_base.BasePostgresSaver, "_try_advance_walks")
    with pytest.raises(UnsupportedLangGraphError) as info:
        _compat.check()
    text = str(info.value)
    assert "langgraph.checkpoint.postgres.base:_keep_latest" in text
    assert "BasePostgresSaver._try_advance_walks" in text
    assert info.value.langgraph_version in text
    # In a fresh interpreter, at import time.
    code = (
        "import langgraph.pregel._loop as loop\n"
        "del loop.PregelLoop\n"
        "import langgraph_durable\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "UnsupportedLangGraphError" in proc.stderr and "langgraph.pregel._loop:PregelLoop" in proc.stderr
