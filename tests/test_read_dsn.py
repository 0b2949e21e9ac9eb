"""read_dsn: operator reads off a streaming standby; the run path never reads from it.

A real primary and streaming standby (tests/_cluster.py: the local PostgreSQL binaries,
``pg_basebackup -R``), the standby logging every statement (``log_statement = 'all'``),
so "the run path sends the standby nothing" is read off the server itself.

* ``test_run_path_never_reads_the_standby`` (sync and async saver): with the standby's
  replay paused (``pg_wal_replay_pause()``), a thread runs twice, is edited
  (``update_state``) and listed through the saver: every run sees its own writes, and the
  standby's log gets no statement meanwhile. ``saver.reader()`` then reads the standby
  (the thread is not there yet: the positive control), refuses a graph run
  (``ReadOnlyViewError``), and once replay resumes lists the same history.
* ``test_operator_sees_the_lag``: while replay is paused the lag grows; ``threads list
  --read-dsn`` prints "reading from standby ..., N s behind (replay paused)" on stderr,
  a warning above ``--read-max-lag``, reads the primary with ``--read-fallback``; the
  console shows the same banner. Resumed: 0.0 s behind.
* Without the cluster: an unreachable read_dsn is ``ReadDsnUnreachableError`` in
  seconds (given: at start; from the variable: at the first ``reader()``, never for a
  process that only runs graphs); a read_dsn that is a primary is allowed and logged
  once; a reader refuses every write; its sessions are read-only.

On main (c87132e) every test here fails at its first ``from_conn_string(...,
read_dsn=...)`` (TypeError: unexpected keyword argument 'read_dsn'). Skipped with a reason
where the PostgreSQL server binaries are missing; with ``CI=true`` that is a failure.
"""

from __future__ import annotations

import asyncio
import json
import logging
import operator
import os
import pickle
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from conftest import needs
from langgraph.graph import START, StateGraph
from psycopg import conninfo as ci
from psycopg_pool import ConnectionPool

from langgraph_durable import AsyncDurablePostgresSaver, DurablePostgresSaver
from langgraph_durable.errors import (
    ConfigurationError,
    DatabaseUnreachableError,
    ReadDsnUnreachableError,
    ReadOnlyViewError,
)
from langgraph_durable.recovery import recover, submit

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _cluster  # noqa: E402

_reason = _cluster.missing_reason()
cluster = needs(None if _reason is None else f"standby cluster: {_reason}")
DB = "lgd_read"
_LOGGED = re.compile(r"LOG:\s+(statement|execute [^:]*):")
REFUSED = "host=127.0.0.1 port=1 user=postgres dbname=postgres"


class State(TypedDict, total=False):
    items: Annotated[list[str], operator.add]


def _builder() -> StateGraph:
    g = StateGraph(State)
    g.add_node("a", lambda s: {"items": ["a"]})
    g.add_node("b", lambda s: {"items": ["b"]})
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    return g


def _db(dsn: str, name: str = DB) -> str:
    params = ci.conninfo_to_dict(dsn)
    params["dbname"] = name
    return ci.make_conninfo(**params)


def _log(pair: _cluster.Pair) -> Path:
    return pair.standby.datadir.parent / "standby.log"


def _statements(pair: _cluster.Pair, since: int) -> list[str]:
    """The statements the standby logged after byte ``since`` of its log: simple
    protocol (``statement: ...``) and extended (``execute <unnamed>: ...``, prepared
    ``execute _pg3_0: ...``)."""
    with open(_log(pair), "rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    return [line for line in text.splitlines() if _LOGGED.search(line)]


def _mark(pair: _cluster.Pair) -> int:
    return _log(pair).stat().st_size


def _standby(pair: _cluster.Pair, sql: str) -> Any:
    with psycopg.connect(pair.standby.dsn, autocommit=True) as conn:
        return conn.execute(sql).fetchone()


def _wait_caught_up(pair: _cluster.Pair, timeout: float = 20.0) -> None:
    with psycopg.connect(pair.primary.dsn, autocommit=True) as conn:
        lsn = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]  # type: ignore[index]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _standby(pair, f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn")[0]:
            return
        time.sleep(0.05)
    raise AssertionError(f"standby not caught up after {timeout}s: {pair.standby.log()}")


@pytest.fixture(scope="module")
def pair() -> Iterator[_cluster.Pair]:
    pair = _cluster.make_pair(synchronous=False)
    try:
        with open(pair.standby.datadir / "postgresql.conf", "a") as f:
            f.write("log_statement = 'all'\nlog_line_prefix = '%m [%p] app=%a '\n")
        _standby(pair, "SELECT pg_reload_conf()")
        with psycopg.connect(pair.primary.dsn, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DB}")
        with DurablePostgresSaver.from_conn_string(_db(pair.primary.dsn)) as saver:
            saver.setup()
        _wait_caught_up(pair)
        yield pair
    finally:
        pair.destroy()


@pytest.fixture
def paused(pair: _cluster.Pair) -> Iterator[_cluster.Pair]:
    """Replay paused on the standby for the test; resumed (and caught up) after."""
    _standby(pair, "SELECT pg_wal_replay_pause()")
    try:
        yield pair
    finally:
        _standby(pair, "SELECT pg_wal_replay_resume()")
        _wait_caught_up(pair)


# ------------------------------------------------------------------ the run path
@cluster
def test_run_path_never_reads_the_standby(paused: _cluster.Pair) -> None:
    pair = paused
    primary, standby = _db(pair.primary.dsn), _db(pair.standby.dsn)
    cfg = {"configurable": {"thread_id": f"run-{uuid.uuid4().hex[:8]}"}}
    with DurablePostgresSaver.from_conn_string(primary, read_dsn=standby) as saver:
        graph = _builder().compile(checkpointer=saver)
        since = _mark(pair)
        assert graph.invoke({"items": ["in1"]}, cfg)["items"] == ["in1", "a", "b"]
        # The second run starts from the first's checkpoint: on the primary only.
        assert graph.invoke({"items": ["in2"]}, cfg)["items"] == ["in1", "a", "b", "in2", "a", "b"]
        graph.update_state(cfg, {"items": ["edit"]})
        assert graph.get_state(cfg).values["items"][-1] == "edit"
        history = list(graph.get_state_history(cfg))
        assert len(history) >= 7 and len(list(saver.list(cfg))) == len(history)
        # A queued thread, claimed and run by a recovery worker: the claim path too.
        queued = {"configurable": {"thread_id": f"queued-{uuid.uuid4().hex[:8]}"}}
        submit(graph, {"items": ["q"]}, queued)
        assert recover(graph).claimed >= 1
        assert graph.get_state(queued).values["items"] == ["q", "a", "b"]
        assert _statements(pair, since) == [], "a run-path statement went to the standby"

        # The reader reads the standby, which has not replayed any of it.
        reader = saver.reader()
        lag = reader.read_lag
        assert (lag.source, lag.in_recovery, lag.paused) == ("standby", True, True)
        assert lag.behind_bytes and lag.behind_bytes > 0, lag
        assert reader.get_tuple(cfg) is None
        listing = graph.copy(update={"checkpointer": reader})
        assert list(listing.get_state_history(cfg)) == []
        assert _statements(pair, since), "the reader's statements are logged (control)"
        with pytest.raises(ReadOnlyViewError) as err:
            listing.invoke({"items": ["x"]}, cfg)
        assert err.value.fields["thread_id"] == cfg["configurable"]["thread_id"]
        with pytest.raises(ReadOnlyViewError):
            listing.update_state(cfg, {"items": ["y"]})

        _standby(pair, "SELECT pg_wal_replay_resume()")
        _wait_caught_up(pair)
        fresh = saver.reader()
        assert fresh.read_lag.seconds == 0.0 and not fresh.read_lag.over, fresh.read_lag
        assert [s.config for s in graph.copy(update={"checkpointer": fresh}).get_state_history(cfg)] == [
            s.config for s in history
        ]


@cluster
def test_run_path_never_reads_the_standby_async(paused: _cluster.Pair) -> None:
    pair = paused
    primary, standby = _db(pair.primary.dsn), _db(pair.standby.dsn)
    cfg = {"configurable": {"thread_id": f"arun-{uuid.uuid4().hex[:8]}"}}

    async def main() -> None:
        async with AsyncDurablePostgresSaver.from_conn_string(primary, read_dsn=standby) as saver:
            graph = _builder().compile(checkpointer=saver)
            since = _mark(pair)
            await graph.ainvoke({"items": ["in1"]}, cfg)
            out = await graph.ainvoke({"items": ["in2"]}, cfg)
            assert out["items"] == ["in1", "a", "b", "in2", "a", "b"]
            history = [s async for s in graph.aget_state_history(cfg)]
            assert len(history) >= 6
            assert _statements(pair, since) == [], "a run-path statement went to the standby"
            reader = await saver.areader()
            assert reader.read_lag.paused and await reader.aget_tuple(cfg) is None
            with pytest.raises(ReadOnlyViewError):
                await graph.copy(update={"checkpointer": reader}).ainvoke({"items": ["x"]}, cfg)

    asyncio.run(main())


# ------------------------------------------------------------------ what an operator sees
# Several CLI commands in one child process (the CLI's import is paid once): each
# command's exit code, stdout and stderr, split on a marker line.
_MANY = """
import json, sys
from langgraph_durable.cli import app
for args in json.loads(sys.argv[1]):
    try:
        app(args, standalone_mode=False)
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    except Exception as exc:
        print(repr(exc), file=sys.stderr)
        code = 99
    sys.stdout.flush(); sys.stderr.flush()
    print("@@END", code, flush=True); print("@@END", code, file=sys.stderr, flush=True)
"""


def _cli(*commands: list[str]) -> list[subprocess.CompletedProcess[str]]:
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("LANGGRAPH_DURABLE_READ_DSN", None)
    proc = subprocess.run(
        [sys.executable, "-c", _MANY, json.dumps([list(c) for c in commands])],
        capture_output=True, text=True, timeout=120, env=env,
    )
    outs, errs = proc.stdout.split("@@END"), proc.stderr.split("@@END")
    assert len(outs) == len(commands) + 1, (proc.stdout[-2000:], proc.stderr[-2000:])
    done = []
    for i, args in enumerate(commands):
        code = int(outs[i + 1].split("\n", 1)[0]) if i + 1 < len(outs) else -1
        out = outs[i].split("\n", 1)[1] if i else outs[i]
        err = errs[i].split("\n", 1)[1] if i else errs[i]
        done.append(subprocess.CompletedProcess(args, code, out, err))
    return done


@cluster
def test_operator_sees_the_lag(paused: _cluster.Pair) -> None:
    pair = paused
    primary, standby = _db(pair.primary.dsn), _db(pair.standby.dsn)
    tid = f"lagged-{uuid.uuid4().hex[:8]}"
    with DurablePostgresSaver.from_conn_string(primary, read_dsn=standby, read_max_lag=1.0) as saver:
        _builder().compile(checkpointer=saver).invoke({"items": ["x"]}, {"configurable": {"thread_id": tid}})
        deadline = time.monotonic() + 20
        while not (lag := saver.reader().read_lag).over:
            assert time.monotonic() < deadline, lag
            time.sleep(0.2)
        assert lag.seconds is not None and lag.seconds > 1.0 and lag.paused
        assert "s behind" in lag.describe() and "replay paused" in lag.describe()

        from starlette.testclient import TestClient

        from langgraph_durable.console import create_app

        with TestClient(create_app(saver, sample_interval=0)) as client:
            page = client.get("/threads").text
        assert f"reading from standby 127.0.0.1:{pair.standby.port}/{DB}" in page
        assert "this page may be out of date" in page and tid not in page

    base = ["threads", "list", "--dsn", primary, "--read-dsn", standby]
    late, fine, fallback = _cli(
        [*base, "--read-max-lag", "1"],
        [*base, "--read-max-lag", "3600", "--json"],
        [*base, "--read-max-lag", "1", "--read-fallback"],
    )
    assert late.returncode == 0, late.stderr
    assert "warning:" in late.stderr and "s behind" in late.stderr and "replay paused" in late.stderr
    assert tid not in late.stdout
    assert fine.returncode == 0 and "warning:" not in fine.stderr and "reading from standby" in fine.stderr
    assert tid not in {r["thread_id"] for r in json.loads(fine.stdout)}
    assert fallback.returncode == 0, fallback.stderr
    assert "reading from the primary" in fallback.stderr and tid in fallback.stdout

    _standby(pair, "SELECT pg_wal_replay_resume()")
    _wait_caught_up(pair)
    (caught,) = _cli([*base, "--read-max-lag", "1"])
    assert "0.0 s behind" in caught.stderr and "warning:" not in caught.stderr and tid in caught.stdout


# ------------------------------------------------------------------ fail fast, typed
def test_unreachable_read_dsn_fails_fast_and_typed(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    t0 = time.monotonic()
    with pytest.raises(ReadDsnUnreachableError) as err:
        with DurablePostgresSaver.from_conn_string(dsn, read_dsn=REFUSED):
            pass
    assert time.monotonic() - t0 < 10
    exc = err.value
    assert isinstance(exc, DatabaseUnreachableError) and isinstance(exc.__cause__, psycopg.OperationalError)
    assert (exc.fields["kind"], exc.fields["setting"]) == ("refused", "read_dsn")
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is ReadDsnUnreachableError and again.fields == exc.fields

    # From the variable: a process that only runs graphs never connects to it ...
    monkeypatch.setenv("LANGGRAPH_DURABLE_READ_DSN", REFUSED)
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        graph = _builder().compile(checkpointer=saver)
        graph.invoke({"items": ["x"]}, {"configurable": {"thread_id": f"env-{uuid.uuid4().hex[:6]}"}})
        # ... and an operator read says what is wrong, in seconds.
        with pytest.raises(ReadDsnUnreachableError):
            saver.reader()
    with DurablePostgresSaver.from_conn_string(dsn, read_dsn="") as saver:  # "": ignore it
        assert saver.reader().read_lag.source == "primary"

    with ConnectionPool(dsn, kwargs={"autocommit": True}, open=True) as pool:
        saver = DurablePostgresSaver(pool, read_dsn=REFUSED)  # the constructor does no I/O
        with pytest.raises(ReadDsnUnreachableError):
            saver.reader()

    for bad in ({"read_max_lag": -1}, {"read_max_lag": "soon"}, {"read_fallback": "yes"}):
        with pytest.raises(ConfigurationError):
            with DurablePostgresSaver.from_conn_string(dsn, **bad):  # type: ignore[arg-type]
                pass


def test_read_dsn_that_is_a_primary_is_allowed_and_said_once(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="langgraph_durable")
    for _ in range(2):
        with DurablePostgresSaver.from_conn_string(dsn, read_dsn=dsn) as saver:
            for _ in range(2):
                reader = saver.reader()
                assert (reader.read_lag.in_recovery, reader.read_lag.over) == (False, False)
                assert "not a standby" in reader.read_lag.describe()
    said = [r for r in caplog.records if "is not a standby" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in caplog.records]


def test_reader_refuses_writes(dsn: str) -> None:
    cfg = {"configurable": {"thread_id": "ro", "checkpoint_ns": ""}}
    with DurablePostgresSaver.from_conn_string(dsn, read_dsn=dsn) as saver:
        reader = saver.reader()
        calls = [
            lambda: reader.put(cfg, {}, {}, {}), lambda: reader.put_writes(cfg, [], "t"),
            lambda: reader.delete_thread("ro"), lambda: reader.copy_thread("ro", "ro2"),
            lambda: reader.prune(["ro"]), lambda: reader.delete_for_runs(["r"]), reader.setup,
        ]
        for call in calls:
            with pytest.raises(ReadOnlyViewError):
                call()
        err = pickle.loads(pickle.dumps(ReadOnlyViewError("put", "ro")))
        assert err.fields == {"method": "put", "thread_id": "ro"}
        # Its sessions refuse writes even on a primary (default_transaction_read_only).
        with reader.connection() as conn, pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute("CREATE TABLE lgd_read_probe (x int)")
        reader.close()  # closes nothing: the saver still reads and writes
        assert saver.reader().get_tuple(cfg) is None


@cluster
def test_operator_reads_work_on_a_standby(pair: _cluster.Pair) -> None:
    """Every read API the CLI and the console use runs on a hot standby (read-only
    transactions, no lock a standby refuses), through ``saver.reader()``."""
    from langgraph_durable import audit
    from langgraph_durable.idempotency import Ledger
    from langgraph_durable.ops import inspection as lgi
    from langgraph_durable.ops import migrations, poison

    primary, standby = _db(pair.primary.dsn), _db(pair.standby.dsn)
    cfg = {"configurable": {"thread_id": f"ops-{uuid.uuid4().hex[:8]}"}}
    with DurablePostgresSaver.from_conn_string(primary, read_dsn=standby) as saver:
        _builder().compile(checkpointer=saver).invoke({"items": ["x"]}, cfg)
        _wait_caught_up(pair)
        reader = saver.reader()
        assert reader.read_lag.source == "standby" and reader.read_lag.seconds == 0.0
        tid = cfg["configurable"]["thread_id"]
        since = _mark(pair)
        assert tid in {r["thread_id"] for r in lgi.list_threads(reader, limit=1000)}
        assert lgi.show_thread(reader, tid)["checkpoint"]["step"] == 2
        assert len(lgi.thread_history(reader, tid)) == 4
        assert lgi.thread_status_counts(reader, untracked=True)["done"] >= 1
        assert lgi.diff_checkpoints(reader, tid, "latest~1", "latest")["channels"]
        assert lgi.storage_stats(reader)["tables"]
        assert lgi.takeover_pending(reader) == []
        assert poison.list_quarantined(reader) == [] and poison.show(reader, tid).thread_id == tid
        assert Ledger(reader).entries(limit=5) == []
        assert any(g["graph_version"] is None or g for g in migrations.version_summary(reader))
        assert migrations.migration_log(reader) == []
        assert audit.list_audit(reader, limit=5) == []
        assert _statements(pair, since), "they ran on the standby"
    commands = [["threads", "show", tid], ["threads", "status"], ["stats"], ["versions", "list"],
                ["ledger", "list"], ["quarantine", "list"], ["versions", "log"]]
    for out in _cli(*([*c, "--dsn", primary, "--read-dsn", standby] for c in commands)):
        assert out.returncode == 0 and "reading from standby" in out.stderr, (out.args, out.stderr)


def test_standby_gone_mid_session_is_typed_or_falls_back(
    admin_dsn: str, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a good start the read_dsn server stops answering (here: its database
    dropped): ``reader()`` is ``ReadDsnUnreachableError`` within the probe's timeout
    (3 s; 1 s here), or with ``read_fallback`` a reader on the primary that says why."""
    from conftest import drop_database, make_database

    import langgraph_durable.core.connections as connections

    monkeypatch.setattr(connections, "PROBE_TIMEOUT", 1.0)

    gone = make_database(admin_dsn, "read_gone")
    with DurablePostgresSaver.from_conn_string(gone) as tables:  # a read server needs them
        tables.setup()
    try:
        with DurablePostgresSaver.from_conn_string(dsn, read_dsn=gone) as saver, \
                DurablePostgresSaver.from_conn_string(dsn, read_dsn=gone, read_fallback=True) as falls:
            assert saver.reader().read_lag.server is not None
            # Another database stands in for the standby here: not a replica of the
            # primary, so read_fallback reads the primary from the start (revread).
            assert falls.reader().read_lag.mismatch is not None
            drop_database(admin_dsn, gone)
            t0 = time.monotonic()
            with pytest.raises(ReadDsnUnreachableError) as err:
                saver.reader()
            assert time.monotonic() - t0 < 15 and err.value.fields["setting"] == "read_dsn"
            reader = falls.reader()
            lag = reader.read_lag
            assert (lag.source, lag.fell_back, lag.over) == ("primary", True, True)
            assert "does not answer" in lag.describe() and lag.standby_error
            assert reader.get_tuple({"configurable": {"thread_id": "none"}}) is None  # the primary
    finally:
        drop_database(admin_dsn, gone)


# ------------------------------------------------------------------ the lag rule, pure
@pytest.mark.parametrize(
    ("row", "reachable", "seconds", "over", "says"),
    [
        # caught up with the primary's position: 0 whatever the last commit's age
        ({"behind_bytes": 0, "since_replay": 900.0, "paused": False}, True, 0.0, False, "0.0 s behind"),
        # behind: the age of the last replayed transaction
        ({"behind_bytes": 4096, "since_replay": 42.0, "paused": True}, True, 42.0, True,
         "42.0 s behind (4.0 KiB of WAL not replayed, replay paused)"),
        ({"behind_bytes": 100, "since_replay": 2.0, "paused": False}, True, 2.0, False, "2.0 s behind"),
        # nothing replayed since the standby started, and behind: unknown, counted over
        ({"behind_bytes": 100, "since_replay": None, "paused": False}, True, None, True, "unknown time"),
        # the primary did not answer: the age alone, and it says so
        ({"behind_bytes": None, "since_replay": 3.0, "paused": False}, False, 3.0, False,
         "primary not reachable to compare"),
        ({"behind_bytes": None, "since_replay": None, "paused": False}, False, None, True, "unknown time"),
    ],
)
def test_lag_rule(row: dict[str, Any], reachable: bool, seconds: float | None, over: bool, says: str) -> None:
    from langgraph_durable.config import ReadOptions
    from langgraph_durable.core.reader import lag_of

    settings = ReadOptions("host=h port=5433 dbname=app", 10.0, False)
    lag = lag_of({"in_recovery": True, "replay_lsn": "0/1", **row}, settings, primary_reachable=reachable)
    assert (lag.seconds, lag.over) == (seconds, over)
    assert says in lag.describe() and lag.describe().startswith("reading from standby h:5433/app")
    assert lag.to_dict()["over"] is over
