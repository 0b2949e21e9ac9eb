"""read_dsn, adversarial review (issue 26): a read_dsn that is not a replica of the
saver's primary, a standby whose clock is behind, a standby promoted mid-session, a
pooler in front of the standby.

* ``test_read_dsn_on_another_database_is_not_caught_up``: read_dsn names another
  database (here: on the same server; in production a stale restored copy, a dev
  clone). On main it was reported "not a standby: a primary", ``over`` False, 0 s, and
  ``read_fallback`` kept reading the copy: every listing showed the other database's
  threads as current. Now the reader compares the two servers (system identifier,
  database, postmaster start) and says the lag is unknown: ``over``, fallback reads the
  primary.
* ``test_lag_is_measured_on_the_primarys_clock``: the standby's host clock is 5 s
  behind (libfaketime on the standby's postmaster). The lag was the standby's
  ``clock_timestamp()`` minus the primary's commit time: 5 s short, a 3 s lag shown as
  0.0 s, never ``over``. Now the primary's clock, read with its WAL position, is used.
* ``test_standby_of_another_cluster_is_not_caught_up``: read_dsn is a standby, but of
  another cluster: its replay position against this primary's WAL means nothing.
* ``test_standby_behind_a_pooler_reads_the_savers_schema``: pgbouncer in front of the
  standby, the saver on ``schema=``: the read pool set no search_path behind a pooler,
  so the reader read the role's default schema (public: another tenant's threads).
  Now it is refused as for the primary (the ALTER ROLE to run).
* ``test_promoted_standby_is_not_caught_up``: the standby is promoted while the saver
  still writes the old primary: reads would show a fork frozen at the promotion.
"""

from __future__ import annotations

import operator
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from conftest import drop_database, make_database, needs
from langgraph.graph import START, StateGraph
from psycopg import conninfo as ci

from langgraph_durable import DurablePostgresSaver
from langgraph_durable.errors import ConfigurationError, ReadOnlyViewError
from langgraph_durable.ops import inspection as lgi

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _cluster  # noqa: E402
from _pgbouncer import pgbouncer  # noqa: E402

_reason = _cluster.missing_reason()
cluster = needs(None if _reason is None else f"standby cluster: {_reason}")
FAKETIME = next(
    (p for p in ("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
                 "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
                 "/usr/lib/faketime/libfaketime.so.1") if os.path.exists(p)),
    None,
)
faketime = needs(None if FAKETIME else "libfaketime (apt-get install faketime; CI installs it)")
DB = "lgd_revread"
SKEW = 5.0


class State(TypedDict, total=False):
    items: Annotated[list[str], operator.add]


def _graph(saver: Any) -> Any:
    g = StateGraph(State)
    g.add_node("a", lambda s: {"items": ["a"]})
    g.add_edge(START, "a")
    return g.compile(checkpointer=saver)


def _run(saver: Any, tid: str) -> None:
    _graph(saver).invoke({"items": ["x"]}, {"configurable": {"thread_id": tid}})


def _ids(reader: Any) -> set[str]:
    return {r["thread_id"] for r in lgi.list_threads(reader, limit=10_000)}


def _db(dsn: str, name: str = DB) -> str:
    params = ci.conninfo_to_dict(dsn)
    params["dbname"] = name
    return ci.make_conninfo(**params)


def _one(dsn: str, sql: str) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(sql)
        row = cur.fetchone() if cur.description else None
        return None if row is None else row[0]


def _wait_caught_up(pair: _cluster.Pair, timeout: float = 20.0) -> None:
    lsn = _one(pair.primary.dsn, "SELECT pg_current_wal_lsn()::text")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _one(pair.standby.dsn, f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn"):
            return
        time.sleep(0.05)
    raise AssertionError(f"standby not caught up after {timeout}s: {pair.standby.log()}")


def _pause(pair: _cluster.Pair) -> None:
    """Pause replay on the standby and wait until it is paused (the request alone lets
    replay go on for a moment)."""
    _one(pair.standby.dsn, "SELECT pg_wal_replay_pause()")
    deadline = time.monotonic() + 20
    while _one(pair.standby.dsn, "SELECT pg_get_wal_replay_pause_state()") != "paused":
        assert time.monotonic() < deadline, "replay did not pause"
        time.sleep(0.02)


def _restart_skewed(node: _cluster.Node, seconds: float) -> None:
    """Restart ``node`` with its clock ``seconds`` behind (libfaketime preloaded into the
    postmaster and so every backend): what a standby host with a drifting clock shows."""
    log = node.datadir.parent / f"{node.name}.log"
    env = ["env", f"LD_PRELOAD={FAKETIME}", f"FAKETIME=-{seconds:g}s", "FAKETIME_DONT_FAKE_MONOTONIC=1",
           "FAKETIME_DONT_RESET=1"]
    cmd = [*env, str(node.bindir / "pg_ctl"), "-D", str(node.datadir), "-l", str(log), "-w", "-t", "30",
           "-o", f"-p {node.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={node.datadir.parent}",
           "restart", "-m", "fast"]
    if os.geteuid() == 0:
        cmd = ["runuser", "-u", "postgres", "--", *cmd]
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def skewed() -> Iterator[_cluster.Pair]:
    """A primary and a streaming standby whose clock is SKEW seconds behind."""
    if FAKETIME is None or _reason is not None:
        pytest.skip("needs the cluster binaries and libfaketime")  # the tests' marks fail in CI
    pair = _cluster.make_pair(synchronous=False)
    try:
        _one(pair.primary.dsn, f"CREATE DATABASE {DB}")
        with DurablePostgresSaver.from_conn_string(_db(pair.primary.dsn)) as saver:
            saver.setup()
        _restart_skewed(pair.standby, SKEW)
        pair.wait_streaming()
        _wait_caught_up(pair)
        behind = time.time() - _one(pair.standby.dsn, "SELECT extract(epoch FROM clock_timestamp())::float8")
        assert SKEW - 1 < behind < SKEW + 1, f"the standby's clock is {behind:.2f} s behind"
        yield pair
    finally:
        pair.destroy()


# ------------------------------------------------------------------ not a replica of the primary
def test_read_dsn_on_another_database_is_not_caught_up(admin_dsn: str, dsn: str) -> None:
    other = make_database(admin_dsn, "revread_copy")
    stale, live = f"stale-{uuid.uuid4().hex[:6]}", f"live-{uuid.uuid4().hex[:6]}"
    try:
        with DurablePostgresSaver.from_conn_string(other) as copy:
            copy.setup()
            _run(copy, stale)
        with DurablePostgresSaver.from_conn_string(dsn, read_dsn=other) as saver:
            _run(saver, live)
            lag = saver.reader().read_lag
            # main: (False, 0.0): "reading from ... (read_dsn), which is not a standby: a primary"
            assert lag.over and lag.seconds is None, lag
            assert "not a replica" in lag.describe(), lag.describe()
        with DurablePostgresSaver.from_conn_string(dsn, read_dsn=other, read_fallback=True) as saver:
            reader = saver.reader()
            assert (reader.read_lag.source, reader.read_lag.fell_back) == ("primary", True), reader.read_lag
            ids = _ids(reader)
            assert live in ids and stale not in ids  # main: the copy's threads, as current
        # The primary itself as read_dsn stays what it was: caught up, not over.
        with DurablePostgresSaver.from_conn_string(dsn, read_dsn=dsn) as saver:
            assert (saver.reader().read_lag.over, saver.reader().read_lag.seconds) == (False, 0.0)
    finally:
        drop_database(admin_dsn, other)


# ------------------------------------------------------------------ a standby host clock behind
@cluster
@faketime
def test_lag_is_measured_on_the_primarys_clock(skewed: _cluster.Pair) -> None:
    pair = skewed
    primary, standby = _db(pair.primary.dsn), _db(pair.standby.dsn)
    with DurablePostgresSaver.from_conn_string(primary, read_dsn=standby, read_max_lag=1.0) as saver:
        _run(saver, f"warm-{uuid.uuid4().hex[:6]}")
        _wait_caught_up(pair)
        _pause(pair)
        try:
            # One commit the standby does not replay: the data it shows is now older
            # and older; the last it replayed was committed before ``since``.
            since = time.time()
            _run(saver, f"unseen-{uuid.uuid4().hex[:6]}")
            time.sleep(3.0)
            waited = time.time() - since  # the data shown is at least this old
            lag = saver.reader().read_lag
            assert lag.behind_bytes and lag.paused, lag
            # main: seconds = waited - 5 s, clamped to 0.0: "0.0 s behind", never over
            assert lag.seconds is not None and lag.seconds >= waited - 0.1, (lag, waited)
            assert lag.over, lag
        finally:
            _one(pair.standby.dsn, "SELECT pg_wal_replay_resume()")
            _wait_caught_up(pair)
        lag = saver.reader().read_lag
        assert (lag.seconds, lag.over) == (0.0, False), lag


@cluster
@faketime
def test_standby_of_another_cluster_is_not_caught_up(skewed: _cluster.Pair, dsn: str) -> None:
    """The saver on the machine's server; read_dsn a standby of the test cluster."""
    with DurablePostgresSaver.from_conn_string(
        dsn, read_dsn=_db(skewed.standby.dsn), read_max_lag=3600, read_fallback=True
    ) as saver:
        lag = saver.reader().read_lag
        # main: a replay position compared with another cluster's WAL: a number of
        # seconds (the age of its own last commit) under read_max_lag, read as current
        assert lag.over and lag.seconds is None and lag.fell_back, lag
        assert "not a replica" in lag.describe(), lag.describe()


# ------------------------------------------------------------------ a pooler in front of the standby
@cluster
@faketime
def test_standby_behind_a_pooler_reads_the_savers_schema(skewed: _cluster.Pair) -> None:
    pair = skewed
    primary, standby = _db(pair.primary.dsn), _db(pair.standby.dsn)
    tenant_a, tenant_b = f"tenant-a-{uuid.uuid4().hex[:6]}", f"tenant-b-{uuid.uuid4().hex[:6]}"
    with DurablePostgresSaver.from_conn_string(primary) as public:  # the default schema
        _run(public, tenant_a)
    with DurablePostgresSaver.from_conn_string(primary, schema="rv_b") as saver:
        saver.setup()
        _run(saver, tenant_b)
    _wait_caught_up(pair)
    with pgbouncer(standby) as through:
        # main: no error, and the reader listed the public schema's threads (another
        # tenant's: tenant_a), not rv_b's, through the standby
        with pytest.raises(ConfigurationError) as err:
            with DurablePostgresSaver.from_conn_string(primary, schema="rv_b", read_dsn=through) as saver:
                leaked = _ids(saver.reader())
                assert tenant_b in leaked and tenant_a not in leaked, sorted(leaked)
        assert "ALTER ROLE" in err.value.message and err.value.fields["setting"] == "read_dsn", err.value
    # The documented way: the role's default search_path, set on the primary, replayed.
    _one(pair.primary.dsn.replace("dbname=postgres", f"dbname={DB}"),
         f"ALTER ROLE postgres IN DATABASE {DB} SET search_path = rv_b, public")
    try:
        _wait_caught_up(pair)
        with pgbouncer(standby) as through:
            with DurablePostgresSaver.from_conn_string(primary, schema="rv_b", read_dsn=through) as saver:
                reader = saver.reader()
                assert reader.read_lag.source == "standby", reader.read_lag
                ids = _ids(reader)
                assert tenant_b in ids and tenant_a not in ids, sorted(ids)
    finally:
        _one(pair.primary.dsn, f"ALTER ROLE postgres IN DATABASE {DB} RESET search_path")
        _wait_caught_up(pair)


# ------------------------------------------------------------------ promoted mid-session
@cluster
def test_promoted_standby_is_not_caught_up() -> None:
    pair = _cluster.make_pair(synchronous=False)
    try:
        _one(pair.primary.dsn, f"CREATE DATABASE {DB}")
        primary, standby = _db(pair.primary.dsn), _db(pair.standby.dsn)
        with DurablePostgresSaver.from_conn_string(primary) as saver:
            saver.setup()
        _wait_caught_up(pair)
        with DurablePostgresSaver.from_conn_string(primary, read_dsn=standby, read_fallback=True) as saver:
            assert saver.reader().read_lag.source == "standby"
            pair.promote()
            deadline = time.monotonic() + 30
            while _one(pair.standby.dsn, "SELECT pg_is_in_recovery()"):
                assert time.monotonic() < deadline
                time.sleep(0.1)
            after = f"after-{uuid.uuid4().hex[:6]}"
            _run(saver, after)  # the saver still writes its primary
            reader = saver.reader()
            # main: "which is not a standby: a primary", not over: the fork read as current
            assert reader.read_lag.over and reader.read_lag.source == "primary", reader.read_lag
            assert after in _ids(reader)
    finally:
        pair.destroy()


# ------------------------------------------------------------------ a reader never writes, pooled
def test_reader_behind_a_pooler_cannot_write(dsn: str) -> None:
    """read_dsn through a transaction pooler to a server that accepts writes (a primary:
    the saver's own, or a standby promoted behind the pooler). The read pool cannot set
    ``default_transaction_read_only`` per session there (it would leak to the pooler's
    other clients); on main it set nothing, so a write through the reader (an op, or
    ``reader.connection()``) was committed. Now each read runs in a READ ONLY
    transaction."""
    from langgraph_durable._io import Batch, Stmt

    def create(name: str) -> Any:
        def op() -> Any:
            yield Batch([Stmt(f"CREATE TABLE {name} (x int)")], final=True)
        return op

    with pgbouncer(dsn) as through:
        with DurablePostgresSaver.from_conn_string(dsn, read_dsn=through) as saver:
            tid = f"pooled-{uuid.uuid4().hex[:6]}"
            _run(saver, tid)
            reader = saver.reader()
            assert reader.read_lag.source == "standby" and reader.pooler, reader.read_lag
            assert tid in _ids(reader)  # reads work there
            assert reader.get_tuple({"configurable": {"thread_id": tid}}) is not None
            # The server refuses (the cause), said as the view's refusal (review32b).
            with pytest.raises(ReadOnlyViewError) as refused:
                reader.run_op(create("rv_probe_op"), transaction=False)  # main: created
            assert isinstance(refused.value.__cause__, psycopg.errors.ReadOnlySqlTransaction)
            with pytest.raises(ReadOnlyViewError) as refused:
                reader.run_op(create("rv_probe_tx"))
            assert isinstance(refused.value.__cause__, psycopg.errors.ReadOnlySqlTransaction)
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                with reader.connection() as conn:
                    conn.execute("CREATE TABLE rv_probe_conn (x int)")
    for name in ("rv_probe_op", "rv_probe_tx", "rv_probe_conn"):
        assert _one(dsn, f"SELECT to_regclass('{name}')::text") is None, f"{name} was created"


# ------------------------------------------------------------------ the console after an action
@cluster
@faketime
def test_console_shows_its_own_action_not_the_lagging_standby(skewed: _cluster.Pair) -> None:
    """An operator forgets an unknown-outcome ledger key; the console redirects to the
    ledger page. On main that page read the standby, which had not replayed the forget:
    the key was still listed as "outcome unknown" (no warning, the lag under
    read_max_lag), inviting the operator to act again. Now, after an action, the
    console's pages read the primary until the standby has replayed it."""
    from starlette.testclient import TestClient

    from langgraph_durable.console import create_app
    from langgraph_durable.idempotency import idempotent

    pair = skewed
    primary, standby = _db(pair.primary.dsn), _db(pair.standby.dsn)
    key = f"rv-key-{uuid.uuid4().hex[:8]}"
    token = "revread-token"
    with DurablePostgresSaver.from_conn_string(primary, read_dsn=standby, read_max_lag=3600) as saver:

        @idempotent(ledger=saver, key=lambda order: key, name="charge_card")
        def charge(order: str) -> None:
            raise KeyboardInterrupt  # died right after the effect: outcome unknown

        with pytest.raises(KeyboardInterrupt):
            charge("o-1")
        _wait_caught_up(pair)
        with TestClient(create_app(saver, allow_actions=True, token=token, sample_interval=0)) as client:
            assert client.post("/login", data={"token": token, "name": "rv"},
                               follow_redirects=False).status_code == 303
            assert key in client.get("/ledger?show=all").text  # the standby, caught up
            _pause(pair)
            try:
                page = client.get("/confirm/forget", params={"key": key}).text
                # The plan is read on the primary; main put the standby's line above it.
                assert key in page and "reading from standby" not in page, page[-1500:]
                marker = 'name="csrf" value="'
                csrf = page[page.index(marker) + len(marker):].split('"', 1)[0]
                r = client.post("/act/forget", data={"key": key, "confirmed": "yes", "csrf": csrf},
                                follow_redirects=False)
                assert r.status_code == 303, r.text[-500:]
                assert "forgot" in client.get(r.headers["location"]).text  # the flash
                after = client.get("/ledger?show=all").text
                # main: the key still listed, "outcome unknown", no out-of-date warning
                assert key not in after, "the page after the action shows the standby's stale row"
                assert "reading from the primary" in after
            finally:
                _one(pair.standby.dsn, "SELECT pg_wal_replay_resume()")
                _wait_caught_up(pair)
            time.sleep(2.1)  # the console measures again (READ_REFRESH)
            page = client.get("/ledger?show=all").text
            assert key not in page and f"reading from standby 127.0.0.1:{pair.standby.port}" in page


def test_async_reader_behind_a_pooler_cannot_write(dsn: str) -> None:
    """``test_reader_behind_a_pooler_cannot_write`` for the async saver's read pool."""
    import asyncio

    from langgraph_durable import AsyncDurablePostgresSaver
    from langgraph_durable._io import Batch, Stmt

    def create() -> Any:
        yield Batch([Stmt("CREATE TABLE rv_probe_async (x int)")], final=True)

    async def main(through: str) -> None:
        async with AsyncDurablePostgresSaver.from_conn_string(dsn, read_dsn=through) as saver:
            reader = await saver.areader()
            assert reader.read_lag.source == "standby" and reader.pooler, reader.read_lag
            assert await reader.aget_tuple({"configurable": {"thread_id": "none"}}) is None
            with pytest.raises(ReadOnlyViewError) as refused:
                await reader.arun_op(create, transaction=False)
            assert isinstance(refused.value.__cause__, psycopg.errors.ReadOnlySqlTransaction)
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                async with reader.connection() as conn:
                    await conn.execute("CREATE TABLE rv_probe_async (x int)")

    with pgbouncer(dsn) as through:
        asyncio.run(main(through))
    assert _one(dsn, "SELECT to_regclass('rv_probe_async')::text") is None


# ------------------------------------------------------------------ restarted mid-session
@cluster
@faketime
def test_standby_restarted_mid_session_reads_again(skewed: _cluster.Pair) -> None:
    """The standby restarts (a minor-version upgrade, a config change) while a saver
    holds its read pool: the next ``reader()`` and its reads work on fresh connections,
    and a reader made before the restart reads again too (the driver's retry)."""
    pair = skewed
    primary, standby = _db(pair.primary.dsn), _db(pair.standby.dsn)
    tid = f"restart-{uuid.uuid4().hex[:6]}"
    with DurablePostgresSaver.from_conn_string(primary, read_dsn=standby) as saver:
        _run(saver, tid)
        _wait_caught_up(pair)
        before = saver.reader()
        assert tid in _ids(before)
        _restart_skewed(pair.standby, SKEW)
        pair.wait_streaming()
        _wait_caught_up(pair)
        after = saver.reader()
        assert after.read_lag.source == "standby" and after.read_lag.seconds == 0.0, after.read_lag
        assert tid in _ids(after) and tid in _ids(before)
