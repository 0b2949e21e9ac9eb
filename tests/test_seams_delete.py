"""Issue 11, the deletion, retention, GC and migration-backup seams (defects 1, 2, 4, 5),
and what an adversary does there: an operator deleting during a live run, a COMMIT
whose reply is lost and the op retried, retention over data the stock saver wrote or
a saver without leases, a thread whose last run is deleted.

Real Postgres throughout; each test works in a schema of its own (retention and GC act
on every thread of their tables). "Killed mid-run" is a child process SIGKILLed while
a node runs.
"""

from __future__ import annotations

import base64
import operator
import os
import random
import signal
import string
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from langgraph_durable import (
    DurablePostgresSaver,
    MigrationRegistry,
    ThreadBusyError,
    idempotent,
)
from langgraph_durable._io import SyncDriver
from langgraph_durable.artifacts import REF_TYPE, ArtifactCodec
from langgraph_durable.errors import MigrationBackupError, MigrationError
from langgraph_durable.ops.migrations import migrate_threads, undo_migration
from langgraph_durable.ops.retention import gc, retain
from langgraph_durable.sql import schema as _sql
from langgraph_durable.sql.schema import KEPT_AFTER_DELETE

THRESHOLD = 256


def big(seed: object, size: int = 1200) -> str:
    rng = random.Random(str(seed))
    return "".join(rng.choices(string.ascii_letters + "     ", k=size))


@pytest.fixture
def schema(dsn: str) -> str:
    return "sd_" + uuid.uuid4().hex[:10]


@pytest.fixture
def saver(dsn: str, schema: str) -> Iterator[DurablePostgresSaver]:
    with DurablePostgresSaver.from_conn_string(dsn, schema=schema, artifact_threshold=THRESHOLD) as s:
        s.setup()
        yield s


def _q(dsn: str, schema: str, sql: Any, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("SET search_path TO {}").format(psycopg.sql.Identifier(schema)))
        cur = conn.execute(sql, args)
        return cur.fetchall() if cur.description else []


def _n(dsn: str, schema: str, sql: Any, *args: Any) -> int:
    return int(_q(dsn, schema, sql, *args)[0][0])


def _cfg(thread: str, run: str | None = None) -> Any:
    conf: dict[str, Any] = {"thread_id": thread}
    if run is not None:
        conf["run_id"] = run
    return {"configurable": conf}


def _raw(dsn: str, schema: str, thread: str) -> dict[str, list[Any]]:
    """Every stored row of the thread in the stock tables, bytes included."""
    return {
        "checkpoints": _q(dsn, schema, "SELECT checkpoint_ns, checkpoint_id, checkpoint, metadata "
                          "FROM checkpoints WHERE thread_id = %s ORDER BY 1, 2", thread),
        "blobs": _q(dsn, schema, "SELECT checkpoint_ns, channel, version, type, blob FROM "
                    "checkpoint_blobs WHERE thread_id = %s ORDER BY 1, 2, 3", thread),
        "writes": _q(dsn, schema, "SELECT checkpoint_ns, checkpoint_id, task_id, idx, channel, "
                     "type, blob FROM checkpoint_writes WHERE thread_id = %s ORDER BY 1, 2, 3, 4", thread),
    }


def _thread_tables(dsn: str, schema: str) -> list[str]:
    """Every table of the schema with a thread_id column (the stock ones included)."""
    rows = _q(
        dsn, schema,
        "SELECT table_name FROM information_schema.columns WHERE table_schema = %s "
        "AND column_name = 'thread_id' ORDER BY 1",
        schema,
    )
    return [r[0] for r in rows]


def _rows_per_table(dsn: str, schema: str, thread: str) -> dict[str, int]:
    return {
        t: _n(dsn, schema, psycopg.sql.SQL("SELECT count(*) FROM {} WHERE thread_id = %s").format(
            psycopg.sql.Identifier(t)), thread)
        for t in _thread_tables(dsn, schema)
        if t not in KEPT_AFTER_DELETE  # the audit trail outlives the thread, by design
    }


def _backdate(dsn: str, schema: str, thread: str, days: int = 40) -> None:
    _q(
        dsn, schema,
        "UPDATE checkpoints SET checkpoint = jsonb_set(checkpoint, '{ts}', to_jsonb("
        "to_char((now() - make_interval(days => %s)) AT TIME ZONE 'UTC', "
        "'YYYY-MM-DD\"T\"HH24:MI:SS.US\"+00:00\"'))) WHERE thread_id = %s",
        days, thread,
    )
    _q(dsn, schema, "UPDATE durable_threads SET updated_at = now() - make_interval(days => %s) "
       "WHERE thread_id = %s", days, thread)


class LostReplies:
    """Every transaction commits, then its connection drops before the reply is read:
    the driver's own retry path (a connection failure) runs the op again on a fresh
    connection. Each op therefore runs twice, the first time committed for real."""

    def __init__(self, saver: DurablePostgresSaver) -> None:
        self.driver: SyncDriver = saver._driver
        self.injected = 0
        self._retrying = False

    def __enter__(self) -> LostReplies:
        real = SyncDriver._transact

        def transact(conn: Any, op: Any, pending: Any) -> Any:
            result = real(self.driver, conn, op, pending)
            if self._retrying:
                self._retrying = False  # the retry's reply arrives
                return result
            self._retrying = True
            self.injected += 1
            conn.close()  # committed; the reply is lost with the connection
            raise psycopg.OperationalError("connection lost after COMMIT (injected)")

        self.driver._transact = transact  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: Any) -> None:
        del self.driver._transact


# --------------------------------------------------------------------------- defect 1


class Two(TypedDict, total=False):
    a: Annotated[list[str], operator.add]
    b: str


def _two_nodes(saver: Any, gate: Callable[[], None]) -> Any:
    """one writes a big value to ``a``; two (the second node) waits at the gate."""

    def one(s: Two) -> dict[str, Any]:
        return {"a": [big("a-" + uuid.uuid4().hex)]}

    def two(s: Two) -> dict[str, Any]:
        gate()
        return {"b": "B"}

    g = StateGraph(Two)
    g.add_node("one", one)
    g.add_node("two", two)
    g.add_edge(START, "one")
    g.add_edge("one", "two")
    g.add_edge("two", END)
    return g.compile(checkpointer=saver)


def _gated_run(saver: Any, thread: str, run: str) -> tuple[threading.Event, threading.Event, threading.Thread, dict[str, Any]]:
    started, release = threading.Event(), threading.Event()
    out: dict[str, Any] = {}

    def gate() -> None:
        started.set()
        assert release.wait(120)

    def body() -> None:
        try:
            out["result"] = _two_nodes(saver, gate).invoke({"a": []}, _cfg(thread, run), durability="sync")
        except BaseException as exc:  # reported to the test thread
            out["error"] = exc

    t = threading.Thread(target=body)
    t.start()
    assert started.wait(120)
    return started, release, t, out


def test_defect1_delete_for_runs_refuses_a_live_run_and_loses_nothing(
    dsn: str, schema: str, saver: DurablePostgresSaver
) -> None:
    _, release, runner, out = _gated_run(saver, "live", "run-live")
    try:
        before = _raw(dsn, schema, "live")
        assert before["checkpoints"]  # one has checkpointed: the run is in its second node
        # Another saver (another process's view: the check is the lease row).
        with DurablePostgresSaver.from_conn_string(dsn, schema=schema, artifact_threshold=THRESHOLD) as op:
            with pytest.raises(ThreadBusyError) as info:
                op.delete_for_runs(["run-live"])
            assert info.value.thread_id == "live" and info.value.owner
            with pytest.raises(ThreadBusyError):  # the same process: refused the same way
                saver.delete_for_runs(["run-live", "no-such-run"])
        assert _raw(dsn, schema, "live") == before  # nothing deleted
    finally:
        release.set()
        runner.join(120)
    assert "error" not in out, out
    result = out["result"]
    assert result["b"] == "B" and len(result["a"]) == 1
    with DurablePostgresSaver.from_conn_string(dsn, schema=schema, artifact_threshold=THRESHOLD) as fresh:
        assert _two_nodes(fresh, lambda: None).get_state(_cfg("live")).values == result


def test_defect1_on_busy_wait_deletes_once_the_run_has_exited(dsn: str, schema: str, saver: DurablePostgresSaver) -> None:
    _, release, runner, out = _gated_run(saver, "waited", "run-w")
    done: dict[str, Any] = {}
    with DurablePostgresSaver.from_conn_string(
        dsn, schema=schema, artifact_threshold=THRESHOLD, on_busy="wait", busy_timeout=120
    ) as op:

        def delete() -> None:
            try:
                op.delete_for_runs(["run-w"])
                done["ok"] = True
            except BaseException as exc:
                done["error"] = exc

        deleter = threading.Thread(target=delete)
        deleter.start()
        release.set()
        runner.join(120)
        deleter.join(120)
    assert "error" not in out and "error" not in done, (out, done)
    # The run finished whole (no LeaseLostError, no write after the delete), then the
    # delete removed it: the thread was its only run, so nothing of it is left.
    assert out["result"]["b"] == "B"
    assert {t: n for t, n in _rows_per_table(dsn, schema, "waited").items() if n} == {}


# --------------------------------------------------------------------------- defect 2


class Doc(TypedDict, total=False):
    doc: str
    turn: int
    notes: Annotated[list[str], operator.add]


def _doc_graph(saver: Any, marker: Callable[[], Any] | None = None) -> Any:
    """The first turn writes ``doc``; every turn appends a note. So ``doc``'s blob
    version is named by old checkpoints too: prune frees it once a migration has
    rewritten the head without it (what the issue's reproduction did)."""

    def step(s: Doc) -> dict[str, Any]:
        turn = s.get("turn", 0)
        if marker is not None:
            marker()
        out: dict[str, Any] = {"notes": [big(f"note-{turn}")]}
        if "doc" not in s:
            out["doc"] = big(f"doc-{turn}")
        return out

    g = StateGraph(Doc)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_edge("step", END)
    return g.compile(checkpointer=saver)


def _registry() -> MigrationRegistry:
    reg = MigrationRegistry()
    reg.register("v1", "v2", lambda st: {**st, "doc": "[redacted]"})
    reg.register("v2", "v3", lambda st: {**st, "turn": 99})
    return reg


def _doc_thread(saver: Any, thread: str, turns: int = 2, run: str | None = None) -> Any:
    """``turns`` runs of the doc graph (run ids ``{run}-0``, ``{run}-1``...)."""
    g = _doc_graph(saver.bind(graph_version="v1"))
    for i in range(turns):
        g.invoke({"turn": i, "notes": []}, _cfg(thread, run and f"{run}-{i}"), durability="sync")
    return g.get_state(_cfg(thread)).values


def _backup_digests(dsn: str, schema: str, thread: str) -> set[bytes]:
    rows = _q(dsn, schema, "SELECT e.type, e.blob FROM durable_migration_log l, "
              "jsonb_to_recordset(l.old_blobs) AS e(type text, blob text) WHERE l.thread_id = %s", thread)
    out: set[bytes] = set()
    for typ, blob in rows:
        if typ == REF_TYPE:
            out |= ArtifactCodec.digests_in(typ, base64.b64decode(blob))
    return out


def test_defect2_undo_after_prune_and_gc_restores_a_loadable_thread(
    dsn: str, schema: str, saver: DurablePostgresSaver
) -> None:
    before = _doc_thread(saver, "mig")
    report = migrate_threads(saver, "v1", "v2", registry=_registry(), thread_ids=["mig"])
    assert report.migrated == ["mig"]
    assert saver.get_tuple(_cfg("mig")).checkpoint["channel_values"]["doc"] == "[redacted]"
    backed_up = _backup_digests(dsn, schema, "mig")
    assert backed_up  # the old doc lives only in the backup now
    saver.prune(["mig"])  # keep_latest: the old doc's blob row goes, its refs recomputed
    gc(saver, grace=0)
    stored = {bytes(r[0]) for r in _q(dsn, schema, "SELECT digest FROM durable_artifacts")}

    undone = undo_migration(saver, "mig")
    assert undone["restored_version"] == "v1"
    with DurablePostgresSaver.from_conn_string(dsn, schema=schema, artifact_threshold=THRESHOLD) as fresh:
        # Cold cache: the old code raised ArtifactNotFoundError here.
        state = _doc_graph(fresh.bind(graph_version="v1")).get_state(_cfg("mig"))
        assert state.values == before
    assert backed_up <= stored  # GC counted the backup as a reference
    gc(saver, grace=0)  # the restored rows hold references of their own
    with DurablePostgresSaver.from_conn_string(dsn, schema=schema, artifact_threshold=THRESHOLD) as fresh:
        assert _doc_graph(fresh.bind(graph_version="v1")).get_state(_cfg("mig")).values == before
        # And it runs on: the next run loads the thread (no ArtifactNotFoundError).
        out = _doc_graph(fresh.bind(graph_version="v1")).invoke({"turn": 5, "notes": []}, _cfg("mig"))
        assert out["turn"] == 5 and len(out["notes"]) == 3


def test_defect2_undo_refuses_a_backup_whose_artifacts_are_gone(
    dsn: str, schema: str, saver: DurablePostgresSaver
) -> None:
    _doc_thread(saver, "gone")
    migrate_threads(saver, "v1", "v2", registry=_registry(), thread_ids=["gone"])
    saver.prune(["gone"])
    # What an older version of the package let GC do: the backup's artifacts deleted.
    lost = sorted(_backup_digests(dsn, schema, "gone"))
    assert lost
    _q(dsn, schema, "DELETE FROM durable_artifact_refs WHERE digest = ANY(%s)", lost)
    _q(dsn, schema, "DELETE FROM durable_artifacts WHERE digest = ANY(%s)", lost)
    before = _raw(dsn, schema, "gone")
    with pytest.raises(MigrationBackupError) as info:
        undo_migration(saver, "gone")
    err = info.value
    assert isinstance(err, MigrationError) and err.thread_id == "gone"
    assert err.migration_id and err.checkpoint_id and set(err.missing) == {d.hex() for d in lost}
    assert err.__cause__ is not None
    assert _raw(dsn, schema, "gone") == before  # nothing touched
    assert _n(dsn, schema, "SELECT count(*) FROM durable_migration_log WHERE thread_id = 'gone' "
              "AND undone_at IS NULL") == 1
    # The migrated thread still loads and runs.
    assert saver.get_tuple(_cfg("gone")).checkpoint["channel_values"]["doc"] == "[redacted]"


# --------------------------------------------------------------------------- defect 4


class Ask(TypedDict, total=False):
    topic: str
    answer: str


def _ask_graph(saver: Any, *, ask: bool = True) -> Any:
    def plan(s: Ask) -> dict[str, Any]:
        return {"topic": big("topic")}

    def review(s: Ask) -> dict[str, Any]:
        return {"answer": interrupt("approve?") if ask else "auto"}

    g = StateGraph(Ask)
    g.add_node("plan", plan)
    g.add_node("review", review)
    g.add_edge(START, "plan")
    g.add_edge("plan", "review")
    g.add_edge("review", END)
    return g.compile(checkpointer=saver)


_KILLED_CHILD = textwrap.dedent(
    """
    import sys, time
    from typing import TypedDict
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.graph import END, START, StateGraph

    dsn, marker = sys.argv[1], sys.argv[2]

    class S(TypedDict, total=False):
        topic: str
        answer: str

    def plan(s):
        return {"topic": "x" * 2000}

    def review(s):
        open(marker, "w").close()  # plan's checkpoint is committed: kill me now
        time.sleep(600)
        return {"answer": "never"}

    g = StateGraph(S)
    g.add_node("plan", plan)
    g.add_node("review", review)
    g.add_edge(START, "plan")
    g.add_edge("plan", "review")
    g.add_edge("review", END)
    with PostgresSaver.from_conn_string(dsn) as cp:
        g.compile(checkpointer=cp).invoke({}, {"configurable": {"thread_id": "stock-killed"}},
                                          durability="sync")
    """
)


def _schema_dsn(dsn: str, schema: str) -> str:
    return psycopg.conninfo.make_conninfo(dsn, options=f"-c search_path={schema}")


def _kill_mid_run(dsn: str, tmp_path: Path) -> None:
    marker = tmp_path / "in-review"
    child = subprocess.Popen([sys.executable, "-c", _KILLED_CHILD, dsn, str(marker)])
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert child.poll() is None, "child exited early"
            assert time.monotonic() < deadline, "child never reached review"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(60)


def test_defect4_retention_judges_threads_without_a_row_from_their_checkpoint(
    dsn: str, schema: str, saver: DurablePostgresSaver, tmp_path: Path
) -> None:
    stock_dsn = _schema_dsn(dsn, schema)
    with PostgresSaver.from_conn_string(stock_dsn) as stock:
        _ask_graph(stock).invoke({}, _cfg("stock-waiting"))
        _ask_graph(stock, ask=False).invoke({}, _cfg("stock-done"))
    _kill_mid_run(stock_dsn, tmp_path)
    with DurablePostgresSaver.from_conn_string(
        dsn, schema=schema, leases=False, artifact_threshold=THRESHOLD
    ) as bare:
        _ask_graph(bare).invoke({}, _cfg("bare-waiting"))
        _ask_graph(bare, ask=False).invoke({}, _cfg("bare-done"))
        # A thread the leased saver finished ('done' row), then resumed without leases
        # and now waiting on a human: its row is stale, its checkpoint is not.
        _ask_graph(saver, ask=False).invoke({}, _cfg("row-then-bare"))
        _ask_graph(bare).invoke({}, _cfg("row-then-bare"))
    threads = ["stock-waiting", "stock-done", "stock-killed", "bare-waiting", "bare-done", "row-then-bare"]
    rowed = {r[0] for r in _q(dsn, schema, "SELECT thread_id FROM durable_threads")}
    assert rowed == {"row-then-bare"}
    for t in threads:
        _backdate(dsn, schema, t)
    before = {t: _raw(dsn, schema, t) for t in threads}

    dry = retain(saver, older_than_days=30, dry_run=True)
    report = retain(saver, older_than_days=30)
    assert sorted(report.deleted_thread_ids) == ["bare-done", "stock-done"]
    assert dry.threads_deleted == report.threads_deleted == 2
    assert report.skipped == {"unfinished": 1}  # stock-killed; the waiting ones are not 'done'
    left = {r[0] for r in _q(dsn, schema, "SELECT DISTINCT thread_id FROM checkpoints")}
    assert left == {"stock-waiting", "stock-killed", "bare-waiting", "row-then-bare"}
    for t in left:
        assert _raw(dsn, schema, t) == before[t]
    # Rows made to lock rowless threads went again.
    assert {r[0] for r in _q(dsn, schema, "SELECT thread_id FROM durable_threads")} == {"row-then-bare"}
    # Naming 'waiting' deletes the waiting ones, never the killed one (work left).
    again = retain(saver, older_than_days=30, statuses=["done", "waiting"])
    assert sorted(again.deleted_thread_ids) == ["bare-waiting", "row-then-bare", "stock-waiting"]
    assert {r[0] for r in _q(dsn, schema, "SELECT DISTINCT thread_id FROM checkpoints")} == {"stock-killed"}


def test_defect4_waiting_stock_thread_survives_and_resumes(dsn: str, schema: str, saver: DurablePostgresSaver) -> None:
    with PostgresSaver.from_conn_string(_schema_dsn(dsn, schema)) as stock:
        _ask_graph(stock).invoke({}, _cfg("adopted"))
    _backdate(dsn, schema, "adopted")
    assert retain(saver, older_than_days=30).deleted_thread_ids == []
    out = _ask_graph(saver).invoke(Command(resume="yes"), _cfg("adopted"))
    assert out["answer"] == "yes"


# --------------------------------------------------------------------------- defect 5


def _full_thread(dsn: str, schema: str, saver: DurablePostgresSaver, thread: str) -> None:
    """A thread with rows in every per-thread table of the package."""

    @idempotent
    def notify(turn: int) -> str:
        return f"sent-{turn}"

    _doc_thread(saver, thread, turns=2, run=f"run-{thread}")
    g = _doc_graph(saver.bind(graph_version="v1"), marker=lambda: notify(7))
    g.invoke({"turn": 2, "notes": []}, _cfg(thread, f"run-{thread}-2"), durability="sync")
    migrate_threads(saver, "v1", "v2", registry=_registry(), thread_ids=[thread])
    # An operator's quarantine record (the thread was released since, say).
    _q(dsn, schema, "INSERT INTO durable_quarantine (thread_id, attempts, last_error) "
       "VALUES (%s, 3, 'boom')", thread)
    counts = _rows_per_table(dsn, schema, thread)
    assert all(counts.values()), counts


def test_defect5_every_delete_path_removes_every_per_thread_row(
    dsn: str, schema: str, saver: DurablePostgresSaver
) -> None:
    # The list covers every table with a thread_id column: a table added later
    # without being put in sql.schema.THREAD_TABLES (or, with a reason, in
    # KEPT_AFTER_DELETE) fails here.
    assert set(_thread_tables(dsn, schema)) == (
        set(_sql.THREAD_TABLES) | set(_sql.STOCK_THREAD_TABLES) | set(KEPT_AFTER_DELETE)
    )

    def retain_old(thread: str) -> None:
        _backdate(dsn, schema, thread)
        assert retain(saver, older_than_days=30).deleted_thread_ids == [thread]

    paths: dict[str, Callable[[str], Any]] = {
        "delete_thread": saver.delete_thread,
        "prune_delete": lambda t: saver.prune([t], strategy="delete"),
        "retain": retain_old,
        "delete_for_runs": lambda t: saver.delete_for_runs([f"run-{t}-{i}" for i in range(3)]),
    }
    _doc_thread(saver, "bystander", turns=1)
    bystander = _rows_per_table(dsn, schema, "bystander")
    for name, delete in paths.items():
        thread = f"full-{name}"
        _full_thread(dsn, schema, saver, thread)
        delete(thread)
        left = {t: n for t, n in _rows_per_table(dsn, schema, thread).items() if n}
        assert left == {}, (name, left)
    assert _rows_per_table(dsn, schema, "bystander") == bystander
    gc(saver, grace=0)
    assert _doc_graph(saver.bind(graph_version="v1")).get_state(_cfg("bystander")).values["turn"] == 0


# --------------------------------------------------------------------------- adversary


def test_lost_commit_reply_delete_for_runs_retried_leaves_nothing_stale(
    dsn: str, schema: str, saver: DurablePostgresSaver
) -> None:
    # delete_for_runs of a thread's second run: the first run stays whole, and its
    # references are recomputed in the same transaction (a retry that finds nothing
    # left to delete must not leave them stale: the old code recomputed them in a
    # later transaction that the retry skipped, so gc never freed them).
    g = _doc_graph(saver.bind(graph_version="v1"))
    g.invoke({"turn": 0, "notes": []}, _cfg("rb", "rb-1"), durability="sync")
    first = g.get_state(_cfg("rb")).values
    g.invoke({"turn": 1, "notes": []}, _cfg("rb", "rb-2"), durability="sync")
    with LostReplies(saver) as lost:
        saver.delete_for_runs(["rb-2"])
    assert lost.injected >= 1
    assert g.get_state(_cfg("rb")).values == first
    refs = {bytes(r[0]) for r in _q(dsn, schema, "SELECT digest FROM durable_artifact_refs WHERE thread_id = 'rb'")}
    from langgraph_durable.ops.retention import recompute_refs

    assert recompute_refs(saver, ["rb"]) == 0  # nothing stale was left
    assert refs


def test_lost_commit_reply_undo_retried_undoes_one_migration_only(
    dsn: str, schema: str, saver: DurablePostgresSaver
) -> None:
    # Two migrations, undo the latest with its reply lost: the retry must recognise its
    # own committed undo, not undo the migration before it too (the old code did).
    _doc_thread(saver, "twice")
    migrate_threads(saver, "v1", "v2", registry=_registry(), thread_ids=["twice"])
    migrate_threads(saver, "v2", "v3", registry=_registry(), thread_ids=["twice"])
    with LostReplies(saver) as lost:
        undone = undo_migration(saver, "twice")
    assert lost.injected == 1
    assert (undone["restored_version"], undone["undone_version"]) == ("v2", "v3")
    head = saver.get_tuple(_cfg("twice"))
    assert head.metadata["graph_version"] == "v2" and head.checkpoint["channel_values"]["doc"] == "[redacted]"
    assert _n(dsn, schema, "SELECT count(*) FROM durable_migration_log WHERE thread_id = 'twice' "
              "AND undone_at IS NULL") == 1


def test_lost_commit_replies_whole_thread_deletes_retention_and_gc_retried_are_harmless(
    dsn: str, schema: str, saver: DurablePostgresSaver
) -> None:
    g = _doc_graph(saver.bind(graph_version="v1"))
    g.invoke({"turn": 0, "notes": []}, _cfg("rb", "rb-1"), durability="sync")
    first = g.get_state(_cfg("rb")).values
    for t in ("del", "pr", "old"):
        _doc_thread(saver, t, turns=1)
    _backdate(dsn, schema, "old")
    keep = _raw(dsn, schema, "rb")
    with LostReplies(saver) as lost:
        saver.delete_thread("del")
        saver.prune(["pr"], strategy="delete")
        report = retain(saver, older_than_days=30)
        gc(saver, grace=0)
    assert lost.injected >= 4
    for t in ("del", "pr", "old"):
        assert {k: n for k, n in _rows_per_table(dsn, schema, t).items() if n} == {}, t
    # The retried batch finds the thread gone (its first attempt deleted it).
    assert "old" in report.deleted_thread_ids or report.skipped.get("gone") == 1
    assert _raw(dsn, schema, "rb") == keep
    with DurablePostgresSaver.from_conn_string(dsn, schema=schema, artifact_threshold=THRESHOLD) as fresh:
        assert _doc_graph(fresh.bind(graph_version="v1")).get_state(_cfg("rb")).values == first


def test_delete_for_runs_of_the_last_run_deletes_the_thread_whole(
    dsn: str, schema: str, saver: DurablePostgresSaver
) -> None:
    _doc_thread(saver, "last", turns=2, run="only-run")
    _doc_thread(saver, "other", turns=1, run="other-run")
    assert _rows_per_table(dsn, schema, "last")["durable_threads"] == 1
    saver.delete_for_runs(["only-run-1"])
    assert _rows_per_table(dsn, schema, "last")["durable_threads"] == 1  # a run is left
    saver.delete_for_runs(["only-run-0"])
    assert {t: n for t, n in _rows_per_table(dsn, schema, "last").items() if n} == {}
    # The thread id is free again: a new run starts from nothing (no stale lease,
    # attempts or graph version), the other thread is untouched.
    out = _doc_graph(saver.bind(graph_version="v1")).invoke({"turn": 3, "notes": []}, _cfg("last"))
    assert out["turn"] == 3 and len(out["notes"]) == 1
    assert _doc_graph(saver).get_state(_cfg("other")).values["turn"] == 0
    gc(saver, grace=0)
    with DurablePostgresSaver.from_conn_string(dsn, schema=schema, artifact_threshold=THRESHOLD) as fresh:
        assert _doc_graph(fresh).get_state(_cfg("other")).values["turn"] == 0


@pytest.mark.parametrize("how", ["delete_thread", "prune_delete"])
def test_whole_thread_delete_waits_for_a_put_in_flight_and_leaves_nothing(
    dsn: str, schema: str, saver: DurablePostgresSaver, how: str
) -> None:
    """A leased put is mid-transaction (its fence holds the thread row FOR SHARE, its
    rows are written, not committed) when the operator deletes the thread. The delete
    must wait for it and delete what it wrote: the old delete removed the checkpoints
    first, without the row lock, and the put's checkpoint survived the "deleted" thread."""
    tid = f"inflight-{how}"
    _doc_thread(saver, tid, turns=1)
    owner = "other-host:1:0:abc"
    [(token,)] = _q(
        dsn, schema,
        "UPDATE durable_threads SET lease_owner = %s, lease_token = lease_token + 1, "
        "lease_expires_at = now() + interval '5 minutes' WHERE thread_id = %s RETURNING lease_token",
        owner, tid,
    )
    with psycopg.connect(dsn) as put:  # the other run's put, as _op_put sends it
        put.execute(psycopg.sql.SQL("SET search_path TO {}").format(psycopg.sql.Identifier(schema)))
        put.execute("SELECT durable_fence(%s, %s, %s)", (tid, token, owner))
        put.execute(
            "INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob) "
            "VALUES (%s, '', 'late', '99', 'msgpack', %s)", (tid, b"\xa4late"),
        )
        put.execute(
            "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, checkpoint, metadata) "
            "VALUES (%s, '', 'ffffffff-late', %s, '{}')",
            (tid, psycopg.types.json.Jsonb({"v": 4, "id": "ffffffff-late", "channel_versions": {"late": "99"}})),
        )
        failed: list[BaseException] = []

        def delete() -> None:
            try:
                if how == "delete_thread":
                    saver.delete_thread(tid)
                else:
                    saver.prune([tid], strategy="delete")
            except BaseException as exc:
                failed.append(exc)

        deleter = threading.Thread(target=delete)
        deleter.start()
        deadline = time.monotonic() + 60
        while not _n(dsn, schema, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                     "AND datname = current_database()"):
            assert time.monotonic() < deadline and deleter.is_alive(), "the delete never waited for the put"
            time.sleep(0.02)
        put.commit()
    deleter.join(60)
    assert not failed, failed
    assert {t: n for t, n in _rows_per_table(dsn, schema, tid).items() if n} == {}


def test_retain_racing_a_lease_less_live_run_leaves_it_whole(dsn: str, schema: str) -> None:
    """A saver with leases=False gives retention no lease to see; the run's head
    checkpoint (its next node triggered, not run) says it is not finished."""
    with DurablePostgresSaver.from_conn_string(
        dsn, schema=schema, leases=False, artifact_threshold=THRESHOLD
    ) as bare:
        bare.setup()
        _, release, runner, out = _gated_run(bare, "bare-live", "bare-run")
        try:
            before = _raw(dsn, schema, "bare-live")
            report = retain(bare, older_than_days=0, keep_last=1)
            assert report.deleted_thread_ids == [] and report.skipped == {"unfinished": 1}
            assert _raw(dsn, schema, "bare-live") == before
        finally:
            release.set()
            runner.join(120)
        assert "error" not in out, out
        with DurablePostgresSaver.from_conn_string(dsn, schema=schema, artifact_threshold=THRESHOLD) as fresh:
            assert _two_nodes(fresh, lambda: None).get_state(_cfg("bare-live")).values == out["result"]
        # Finished now: it may go.
        assert retain(bare, older_than_days=0).deleted_thread_ids == ["bare-live"]


@pytest.mark.parametrize("how", ["delete_thread", "prune_delete"])
def test_whole_thread_delete_during_a_live_run_fences_it_and_leaves_nothing(
    dsn: str, schema: str, saver: DurablePostgresSaver, how: str
) -> None:
    """The reference delete_for_runs was measured against: the thread goes, the run in
    its second node ends with LeaseLostError, nothing of it is written afterwards."""
    from langgraph_durable import LeaseLostError

    tid = f"fenced-{how}"
    _, release, runner, out = _gated_run(saver, tid, f"run-{how}")
    with DurablePostgresSaver.from_conn_string(dsn, schema=schema, artifact_threshold=THRESHOLD) as op:
        try:
            if how == "delete_thread":
                op.delete_thread(tid)
            else:
                op.prune([tid], strategy="delete")
        finally:
            release.set()
            runner.join(120)
    assert isinstance(out.get("error"), LeaseLostError), out
    assert out["error"].thread_id == tid
    assert {t: n for t, n in _rows_per_table(dsn, schema, tid).items() if n} == {}


def test_defect4_finished_graphs_of_every_shape_are_judged_done(dsn: str, schema: str, saver: DurablePostgresSaver) -> None:
    """The checkpoint judgement must not keep finished threads forever: Send fan-out
    into a join, a subgraph node, the functional API, a static interrupt, each written
    by the stock saver and by this one."""
    from langgraph.func import entrypoint, task
    from langgraph.types import Send

    from langgraph_durable._completion import HEADS_SQL, inferred_status

    class F(TypedDict, total=False):
        xs: Annotated[list[str], operator.add]
        a: str

    def fan_out(cp: Any) -> Any:
        g = StateGraph(F)
        g.add_node("w", lambda s: {"xs": [s["a"]]})
        g.add_node("p", lambda s: {"a": "p"})
        g.add_node("j", lambda s: {"a": big("joined")})
        g.add_conditional_edges(START, lambda s: [Send("w", {"a": str(i)}) for i in range(3)])
        g.add_edge(START, "p")
        g.add_edge(["w", "p"], "j")
        g.add_edge("j", END)
        return g.compile(checkpointer=cp)

    def with_subgraph(cp: Any, interrupt_before: list[str] | None = None) -> Any:
        sub = StateGraph(F)
        sub.add_node("z", lambda s: {"a": "z"})
        sub.add_edge(START, "z")
        sub.add_edge("z", END)
        g = StateGraph(F)
        g.add_node("sub", sub.compile())
        g.add_node("last", lambda s: {"xs": ["last"]})
        g.add_edge(START, "sub")
        g.add_edge("sub", "last")
        g.add_edge("last", END)
        return g.compile(checkpointer=cp, interrupt_before=interrupt_before)

    def functional(cp: Any) -> Any:
        @task
        def inc(x: int) -> int:
            return x + 1

        @entrypoint(checkpointer=cp)
        def main(x: int) -> int:
            return inc(x).result()

        return main

    expected: dict[str, str] = {}
    with PostgresSaver.from_conn_string(_schema_dsn(dsn, schema)) as stock:
        for name, cp in (("stock", stock), ("durable", saver)):
            fan_out(cp).invoke({"xs": []}, _cfg(f"{name}-fan"))
            with_subgraph(cp).invoke({"xs": []}, _cfg(f"{name}-sub"))
            functional(cp).invoke(1, _cfg(f"{name}-func"))
            with_subgraph(cp, ["last"]).invoke({"xs": []}, _cfg(f"{name}-static"))
            expected |= {f"{name}-fan": "done", f"{name}-sub": "done", f"{name}-func": "done",
                         f"{name}-static": "running"}  # paused before 'last': work left
    with psycopg.connect(dsn, row_factory=psycopg.rows.dict_row) as conn:
        conn.execute(psycopg.sql.SQL("SET search_path TO {}").format(psycopg.sql.Identifier(schema)))
        heads = {r["thread_id"]: r for r in conn.execute(HEADS_SQL, (sorted(expected),)).fetchall()}
    assert {t: inferred_status(heads.get(t)) for t in expected} == expected
    # A damaged head (versions not an object) counts as work left, never as done.
    assert inferred_status({"channel_versions": [1], "versions_seen": {}, "write_channels": []}) == "running"


def test_defect2_undo_after_retention_trim_and_gc_restores_a_loadable_thread(
    dsn: str, schema: str, saver: DurablePostgresSaver
) -> None:
    """The same seam through retention's trim (keep_last), which deletes every blob no
    remaining checkpoint names, the old doc's included."""
    before = _doc_thread(saver, "trim")
    migrate_threads(saver, "v1", "v2", registry=_registry(), thread_ids=["trim"])
    report = retain(saver, older_than_days=30, keep_last=1)
    assert report.threads_trimmed == 1
    gc(saver, grace=0)
    undo_migration(saver, "trim")
    with DurablePostgresSaver.from_conn_string(dsn, schema=schema, artifact_threshold=THRESHOLD) as fresh:
        assert _doc_graph(fresh.bind(graph_version="v1")).get_state(_cfg("trim")).values == before
