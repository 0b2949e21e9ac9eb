"""Archive before delete, and restore (issue 16), on real Postgres and real files.

Each test works in a schema of its own (retention acts on every thread it sees). The
round trip compares, for every thread, every checkpoint of the history (StateSnapshot
by StateSnapshot) and every stored row of every per-thread table before the archive
and after the restore.
"""

from __future__ import annotations

import importlib.util
import json
import operator
import os
import pickle
import random
import signal
import string
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from conftest import require_or_skip
from langchain_core.messages import AIMessage
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from typer.testing import CliRunner

from langgraph_durable import AsyncDurablePostgresSaver, DurablePostgresSaver, idempotent
from langgraph_durable import archive as A
from langgraph_durable._io import Stmt
from langgraph_durable.cli import app
from langgraph_durable.errors import (
    ArchiveConflictError,
    ArchiveError,
    ArchiveIntegrityError,
    ArchiveVersionError,
)
from langgraph_durable.ops.retention import aretain, gc, retain

HERE = Path(__file__).parent
runner = CliRunner()


def big(seed: object, size: int = 900) -> str:
    rng = random.Random(str(seed))
    return "".join(rng.choices(string.ascii_letters + "     ", k=size))


SHARED = big("shared-by-every-thread")


class State(TypedDict, total=False):
    messages: Annotated[list[Any], operator.add]
    shared: str
    ask: bool
    answer: str
    paid: str
    subject: str


@idempotent
def charge(thread: str, turn: int) -> str:
    return f"receipt-{thread}-{turn}"


def _graph(saver: Any) -> Any:
    def work(s: State) -> dict[str, Any]:
        n = len(s.get("messages", []))
        who = s.get("subject", "?")
        # 10 big messages a turn: two turns give a chunk artifact (16 elements) + a tail.
        return {
            "messages": [AIMessage(content=big(f"{who}-{n + i}"), id=f"{who}-{n + i}") for i in range(10)],
            "shared": SHARED,
            "paid": charge(who, n),
        }

    def review(s: State) -> dict[str, Any]:
        if s.get("ask"):
            return {"answer": interrupt("approve?")}
        return {}

    g = StateGraph(State)
    g.add_node("work", work)
    g.add_node("review", review)
    g.add_edge(START, "work")
    g.add_edge("work", "review")
    g.add_edge("review", END)
    return g.compile(checkpointer=saver)


def _cfg(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def _conn(dsn: str, schema: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(psycopg.sql.SQL("SET search_path TO {}").format(psycopg.sql.Identifier(schema)))
    return conn


def _q(dsn: str, schema: str, query: str, *args: Any) -> list[tuple[Any, ...]]:
    with _conn(dsn, schema) as conn:
        cur = conn.execute(query, args)
        return cur.fetchall() if cur.description else []


def _backdate(dsn: str, schema: str, days: int = 40) -> None:
    _q(
        dsn,
        schema,
        "UPDATE checkpoints SET checkpoint = jsonb_set(checkpoint, '{ts}', to_jsonb("
        "to_char((now() - make_interval(days => %s)) AT TIME ZONE 'UTC', "
        "'YYYY-MM-DD\"T\"HH24:MI:SS.US\"+00:00\"')))",
        days,
    )
    _q(dsn, schema, "UPDATE durable_threads SET updated_at = now() - make_interval(days => %s)", days)


def raw_rows(dsn: str, schema: str, thread: str) -> dict[str, list[str]]:
    """Every stored row of the thread, per table, as JSON text (sequence-filled columns,
    which a restore leaves to the target's sequence, left out)."""
    out: dict[str, list[str]] = {}
    with _conn(dsn, schema) as conn:
        for t in A.TABLES:
            skip = ["id"] if t == "durable_migration_log" else []
            rows = conn.execute(
                psycopg.sql.SQL("SELECT (to_jsonb(t) - %s::text[])::text FROM {} t WHERE thread_id = %s").format(
                    psycopg.sql.Identifier(t)
                ),
                (skip, thread),
            ).fetchall()
            out[t] = sorted(r[0] for r in rows)
    return out


def snapshot(saver: Any, thread: str) -> list[tuple[Any, ...]]:
    """get_state and the whole history, as comparable tuples (one per checkpoint)."""
    graph = _graph(saver)
    cfg = _cfg(thread)
    out = []
    for s in [graph.get_state(cfg), *graph.get_state_history(cfg)]:
        out.append(
            (
                json.dumps(s.values, default=repr, sort_keys=True),
                s.next,
                s.config,
                s.parent_config,
                json.dumps(s.metadata, default=repr, sort_keys=True),
                s.created_at,
                repr(s.tasks),
                repr(s.interrupts),
            )
        )
    return out


def _mismatches(a: list[tuple[Any, ...]], b: list[tuple[Any, ...]]) -> int:
    return sum(x != y for x, y in zip(a, b, strict=False)) + abs(len(a) - len(b))


@pytest.fixture
def schema(dsn: str) -> str:
    return "a_" + uuid.uuid4().hex[:10]


@pytest.fixture
def saver(dsn: str, schema: str) -> Iterator[DurablePostgresSaver]:
    with DurablePostgresSaver.from_conn_string(dsn, schema=schema, artifact_threshold=256) as s:
        s.setup()
        yield s


@pytest.fixture(params=["local", "memory"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "archive")
    if importlib.util.find_spec("fsspec") is None:
        require_or_skip("fsspec is not installed (the test extra)")
    return f"memory://lgd-archive-{uuid.uuid4().hex[:8]}"


def _populate(dsn: str, schema: str, saver: DurablePostgresSaver) -> list[str]:
    """Three finished threads (two turns: chunked lists, artifacts shared across
    threads, ledger rows, pending writes of every step), one waiting on a human, and
    one migrated v1 -> v2 (a migration log row) that then finished."""
    graph = _graph(saver)
    threads = []
    for i in range(3):
        t = f"done/{i} é"
        for _ in range(2):
            graph.invoke({"subject": t}, _cfg(t))
        threads.append(t)
    graph.invoke({"subject": "wait", "ask": True}, _cfg("wait"))
    threads.append("wait")
    opts: dict[str, Any] = {"schema": schema, "artifact_threshold": 256}
    with DurablePostgresSaver.from_conn_string(dsn, graph_version="v1", **opts) as v1:
        _graph(v1).invoke({"subject": "mig", "ask": True}, _cfg("mig"))
    with DurablePostgresSaver.from_conn_string(dsn, graph_version="v2", **opts) as v2:
        v2.migrations.register("v1", "v2", lambda s: s)
        _graph(v2).invoke(Command(resume="ok"), _cfg("mig"))
    threads.append("mig")
    _backdate(dsn, schema)
    # The history has what the round trip must carry.
    n = lambda sql: _q(dsn, schema, sql)[0][0]  # noqa: E731
    assert n("SELECT count(*) FROM durable_ledger") >= 7
    assert n("SELECT count(*) FROM durable_migration_log") == 1
    assert n("SELECT count(*) FROM checkpoint_writes") > 0
    assert n("SELECT count(*) FROM durable_artifacts") > 20
    return threads


def _counts(dsn: str, schema: str) -> dict[str, int]:
    return {t: _q(dsn, schema, f"SELECT count(*) FROM {t}")[0][0] for t in (*A.TABLES, "durable_artifacts")}


def test_archive_retain_restore_round_trip(dsn: str, schema: str, saver: DurablePostgresSaver, url: str) -> None:
    threads = _populate(dsn, schema, saver)
    before = {t: snapshot(saver, t) for t in threads}
    rows_before = {t: raw_rows(dsn, schema, t) for t in threads}

    report = retain(saver, older_than_days=30, statuses=("done", "waiting"), archive=url)
    assert report.threads_deleted == report.threads_archived == len(threads), report
    assert len(report.archive_files) == len(threads) and report.archive_bytes > 0
    gc(saver, grace=0)
    assert all(v == 0 for v in _counts(dsn, schema).values()), _counts(dsn, schema)
    manifests = A.verify(url)
    assert sorted(m["thread_id"] for m in manifests) == sorted(threads)

    restored = A.restore(saver, url)
    assert restored.threads_restored == len(threads)
    assert sorted(restored.thread_ids) == sorted(threads)
    mismatches = 0
    for t in threads:
        mismatches += _mismatches(before[t], snapshot(saver, t))
        mismatches += sum(rows_before[t][k] != v for k, v in raw_rows(dsn, schema, t).items())
    checkpoints = sum(len(v) for v in before.values())
    print(f"archive round trip: {len(threads)} threads archived, {restored.threads_restored} "
          f"restored, {checkpoints} snapshots compared, mismatches {mismatches}")
    assert mismatches == 0
    # Deduplicated again: one artifact row per digest, the shared value stored once
    # and referenced by every thread.
    arts = _q(dsn, schema, "SELECT count(*), count(DISTINCT digest) FROM durable_artifacts")[0]
    assert arts[0] == arts[1] and restored.artifacts_inserted == arts[0]
    assert restored.artifacts_present > 0  # the shared ones, in every file
    # The waiting thread resumes; the migrated one is at v2.
    out = _graph(saver).invoke(Command(resume="yes"), _cfg("wait"))
    assert out["answer"] == "yes" and len(out["messages"]) == 10
    assert _q(dsn, schema, "SELECT status FROM durable_threads WHERE thread_id = 'wait'")[0][0] == "done"
    # Every checkpoint of every thread loads from a cold cache.
    with DurablePostgresSaver.from_conn_string(dsn, schema=schema, artifact_threshold=256) as fresh:
        for t in threads:
            assert all(isinstance(x.checkpoint["channel_values"], dict) for x in fresh.list(_cfg(t)))

    # Restoring threads that exist: refused, typed, naming the thread; nothing changes.
    counts = _counts(dsn, schema)
    with pytest.raises(ArchiveConflictError) as err:
        A.restore(saver, url)
    assert err.value.thread_id in threads and err.value.url.startswith(url)
    assert _counts(dsn, schema) == counts


def test_restore_one_thread_and_cli(dsn: str, schema: str, saver: DurablePostgresSaver, tmp_path: Path) -> None:
    graph = _graph(saver)
    for t in ("c1", "c2"):
        graph.invoke({"subject": t}, _cfg(t))
    _backdate(dsn, schema)
    before = {t: snapshot(saver, t) for t in ("c1", "c2")}
    url = str(tmp_path / "arch")
    res = runner.invoke(
        app, ["retain", "--dsn", dsn, "--schema", schema, "--archive", url, "--json"]
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["threads_archived"] == 2 and out["threads_deleted"] == 2
    res = runner.invoke(app, ["restore", url, "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    assert sorted(m["thread_id"] for m in json.loads(res.output)["files"]) == ["c1", "c2"]
    assert _q(dsn, schema, "SELECT count(*) FROM checkpoints")[0][0] == 0
    res = runner.invoke(app, ["restore", url, "--thread", "c2", "--dsn", dsn, "--schema", schema, "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["thread_ids"] == ["c2"]
    assert snapshot(saver, "c2") == before["c2"]
    assert _q(dsn, schema, "SELECT count(*) FROM checkpoints WHERE thread_id = 'c1'")[0][0] == 0
    res = runner.invoke(app, ["restore", url, "--thread", "c2", "--dsn", dsn, "--schema", schema])
    assert res.exit_code == 1 and "already exists" in res.output
    res = runner.invoke(app, ["restore", url, "--thread", "nope", "--dsn", dsn, "--schema", schema])
    assert res.exit_code == 1 and "not found" in res.output
    res = runner.invoke(app, ["restore", url, "--thread", "c1", "--dsn", dsn, "--schema", schema])
    assert res.exit_code == 0, res.output
    assert snapshot(saver, "c1") == before["c1"]


async def test_async_archive_round_trip(dsn: str, schema: str) -> None:
    if importlib.util.find_spec("fsspec") is None:
        require_or_skip("fsspec is not installed (the test extra)")
    url = f"memory://lgd-async-{uuid.uuid4().hex[:8]}"
    async with AsyncDurablePostgresSaver.from_conn_string(dsn, schema=schema, artifact_threshold=256) as s:
        await s.asetup()
        graph = _graph(s)
        await graph.ainvoke({"subject": "x1"}, _cfg("x1"))
        await graph.ainvoke({"subject": "x2", "ask": True}, _cfg("x2"))
        _backdate(dsn, schema)
        before = {t: raw_rows(dsn, schema, t) for t in ("x1", "x2")}
        report = await aretain(s, older_than_days=30, statuses=("done", "waiting"), archive=url)
        assert report.threads_archived == 2 and report.threads_deleted == 2
        restored = await A.arestore(s, url)
        assert restored.threads_restored == 2
        assert {t: raw_rows(dsn, schema, t) for t in ("x1", "x2")} == before
        out = await graph.ainvoke(Command(resume="fine"), _cfg("x2"))
        assert out["answer"] == "fine"


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    (size,) = struct.unpack_from("<I", data, 4)
    manifest = json.loads(data[8 : 8 + size])
    if how == "flip":
        i = len(data) - 40
        data = data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1 :]
    elif how == "truncate":
        data = data[: len(data) - 100]
    elif how in ("version", "count"):
        if how == "version":
            manifest["version"] = 99
        else:
            manifest["counts"]["checkpoints"] += 1
        m = json.dumps(manifest).encode()
        data = struct.pack("<II", 0x184D2A5E, len(m)) + m + data[8 + size :]
    elif how == "garbage":
        data = b"PK\x03\x04" + data[4:]
    path.write_bytes(data)


@pytest.mark.parametrize("how", ["flip", "truncate", "version", "count", "garbage"])
def test_damaged_archive_restores_nothing(
    dsn: str, schema: str, saver: DurablePostgresSaver, tmp_path: Path, how: str
) -> None:
    graph = _graph(saver)
    for t in ("d1", "d2"):
        graph.invoke({"subject": t}, _cfg(t))
    _backdate(dsn, schema)
    url = str(tmp_path / "arch")
    assert retain(saver, older_than_days=30, archive=url).threads_archived == 2
    files = sorted(Path(url).glob("*.lgda.zst"))
    assert len(files) == 2
    damaged = next(f for f in files if f.name.startswith("d2-"))
    _damage(damaged, how)
    expected = ArchiveVersionError if how == "version" else ArchiveIntegrityError
    # The whole directory: the good file is not restored either (one transaction,
    # every file verified first); the damaged one alone, directly.
    for target in (url, str(damaged)):
        with pytest.raises(expected) as err:
            A.restore(saver, target)
        assert err.value.url == str(damaged)
        if how != "garbage":
            assert err.value.thread_id == "d2"
        assert _q(dsn, schema, "SELECT count(*) FROM checkpoints")[0][0] == 0
        assert _q(dsn, schema, "SELECT count(*) FROM durable_threads")[0][0] == 0
        again = pickle.loads(pickle.dumps(err.value))
        assert type(again) is type(err.value) and again.url == err.value.url
        assert isinstance(again, ArchiveError)
    # The intact thread still restores on its own.
    assert A.restore(saver, url.rstrip("/") + "/" + next(f for f in files if f != damaged).name).thread_ids == ["d1"]


def test_thread_changed_after_archive_is_not_deleted(
    dsn: str, schema: str, saver: DurablePostgresSaver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write landing between the archive's read and the delete: the thread stays
    (the archive is a stale copy), and the next run archives and deletes it."""
    graph = _graph(saver)
    graph.invoke({"subject": "ch"}, _cfg("ch"))
    _backdate(dsn, schema)
    url = str(tmp_path / "arch")

    def meddle(point: str) -> None:
        if point == "verified":
            # An operator's edit of a finished thread's ledger row: no new checkpoint,
            # no lease, the same head; only the rows differ.
            _q(dsn, schema, "UPDATE durable_ledger SET args_preview = 'edited' WHERE thread_id = 'ch'")

    monkeypatch.setattr(A, "_pause", meddle)
    report = retain(saver, older_than_days=30, archive=url)
    assert report.threads_deleted == 0 and report.skipped == {"changed_since_archive": 1}
    assert _q(dsn, schema, "SELECT count(*) FROM checkpoints WHERE thread_id = 'ch'")[0][0] > 0
    monkeypatch.setattr(A, "_pause", lambda point: None)
    before = raw_rows(dsn, schema, "ch")
    report = retain(saver, older_than_days=30, archive=url)
    assert report.threads_deleted == 1 and report.threads_archived == 1
    # Same head checkpoint: the new file replaced the stale one under the same name.
    assert len(list(Path(url).glob("*.lgda.zst"))) == 1
    A.restore(saver, url)
    assert raw_rows(dsn, schema, "ch") == before


@pytest.mark.chaos
def test_kill_during_archive_never_loses_a_thread(dsn: str, schema: str, saver: DurablePostgresSaver, tmp_path: Path) -> None:
    """SIGKILL `retain --archive` at random points (inside the temp-file write, between
    verify and delete, inside the delete): every thread is in the database, whole, or
    in a verified archive, never neither; a rerun finishes; a restore gives it all back."""
    graph = _graph(saver)
    threads = [f"k{i}" for i in range(8)]
    for t in threads:
        graph.invoke({"subject": t}, _cfg(t))
    _backdate(dsn, schema)
    rows = {t: raw_rows(dsn, schema, t) for t in threads}
    url = str(tmp_path / "arch")
    rng = random.Random(1616)
    kills = 0
    phases: dict[str, int] = {}
    where_now: dict[str, int] = {}  # thread-observations after the kills
    for attempt in range(6):
        marker = tmp_path / f"marker-{attempt}"
        marker.write_text("")
        child = subprocess.Popen(
            [sys.executable, str(HERE / "_child_archive.py"), dsn, schema, url, str(marker)],
            env={**os.environ, "PYTHONPATH": str(HERE.parent)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        # Kill in the n-th window: odd n after a temp file was written (before its
        # rename), even n after a verify (before the delete).
        target = 1 + attempt % 4
        deadline = time.monotonic() + 120
        try:
            while child.poll() is None and len(steps := marker.read_text().split()) < target:
                assert time.monotonic() < deadline, "child made no progress"
                time.sleep(0.005)
            # Half the kills land inside the window just logged (after the temp file
            # was written, or after the verify), the others a little later.
            late = (attempt // 2) % 2 == 1
            if late:
                time.sleep(rng.uniform(0.02, 0.15))
            if child.poll() is None:
                os.kill(child.pid, signal.SIGKILL)
                kills += 1
                where = (steps[-1] if steps else "start") + ("+later" if late else "")
                phases[where] = phases.get(where, 0) + 1
        finally:
            if child.poll() is None:
                child.kill()
            out, err = child.communicate()
        # The invariant, for every thread.
        archived = {m["thread_id"] for m in A.verify(url)}  # verify raises on a bad file
        for t in threads:
            now = raw_rows(dsn, schema, t)
            in_db = any(now.values())
            if in_db:
                assert now == rows[t], f"thread {t} half deleted"
            assert in_db or t in archived, f"thread {t} lost (attempt {attempt})"
            place = "both" if in_db and t in archived else "db" if in_db else "archive"
            where_now[place] = where_now.get(place, 0) + 1
    assert kills == 6, (kills, out, err)
    # A rerun (no kill) finishes the job.
    res = runner.invoke(
        app, ["retain", "--dsn", dsn, "--schema", schema, "--archive", url, "--no-gc", "--json"]
    )
    assert res.exit_code == 0, res.output
    assert all(not any(raw_rows(dsn, schema, t).values()) for t in threads)
    assert sorted({m["thread_id"] for m in A.verify(url)}) == threads
    restored = A.restore(saver, url)
    assert restored.threads_restored == len(threads)
    mismatches = sum(raw_rows(dsn, schema, t) != rows[t] for t in threads)
    print(f"kill test: {kills} kills, windows {phases}, threads seen after kills {where_now} "
          f"(neither: 0), {len(threads)} threads "
          f"restored, mismatches {mismatches}")
    assert mismatches == 0


def test_write_between_check_and_delete_rolls_back(
    dsn: str, schema: str, saver: DurablePostgresSaver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fingerprint checked under the locks cannot see a write committed after it
    (a put outside any lease takes no row lock): the deletes hash what they removed,
    and a difference rolls the batch back; the rest of the batch is deleted again."""
    graph = _graph(saver)
    for t in ("r1", "r2"):
        graph.invoke({"subject": t}, _cfg(t))
    _backdate(dsn, schema)
    url = str(tmp_path / "arch")
    real_store = A._store_verified
    real_fp = A.fingerprint_stmt
    archived: dict[str, str] = {}

    def store(target: Any, dump: Any) -> dict[str, Any]:
        manifest = real_store(target, dump)
        archived[dump.thread_id] = manifest["fingerprint"]
        if dump.thread_id == "r1":
            _q(dsn, schema, "UPDATE durable_ledger SET args_preview = 'late write' WHERE thread_id = 'r1'")

            # Blind the check under the locks: it reports the archived fingerprints, as
            # it would had the write come right after it.
            def blind(ids: list[str], created: Any = ()) -> Stmt:
                stmt = real_fp(ids, created)
                return Stmt(
                    psycopg.sql.SQL(
                        "SELECT thread_id, CASE WHEN thread_id = 'r1' THEN %(blind)s ELSE fp END AS fp "
                        "FROM ({}) x"
                    ).format(stmt.sql),
                    {**stmt.params, "blind": archived["r1"]},
                    fetch=True,
                    prepare=False,
                )

            monkeypatch.setattr(A, "fingerprint_stmt", blind)
        return manifest

    monkeypatch.setattr(A, "_store_verified", store)
    report = retain(saver, older_than_days=30, archive=url)
    assert report.skipped == {"changed_since_archive": 1}
    assert report.deleted_thread_ids == ["r2"] and report.threads_archived == 1
    late = _q(dsn, schema, "SELECT args_preview FROM durable_ledger WHERE thread_id = 'r1'")
    assert late and all(r[0] == "late write" for r in late)
    assert _q(dsn, schema, "SELECT count(*) FROM checkpoints WHERE thread_id = 'r1'")[0][0] > 0
    assert _q(dsn, schema, "SELECT count(*) FROM checkpoints WHERE thread_id = 'r2'")[0][0] == 0


def test_thread_without_status_row(dsn: str, schema: str, saver: DurablePostgresSaver, tmp_path: Path) -> None:
    """A thread with no durable_threads row (leases=False, or the stock saver's): the row
    retention creates to lock it is neither archived, nor compared, nor restored."""
    with DurablePostgresSaver.from_conn_string(
        dsn, schema=schema, artifact_threshold=256, leases=False
    ) as plain:
        _graph(plain).invoke({"subject": "nr"}, _cfg("nr"))
    assert not _q(dsn, schema, "SELECT 1 FROM durable_threads WHERE thread_id = 'nr'")
    _backdate(dsn, schema)
    before = raw_rows(dsn, schema, "nr")
    history = snapshot(saver, "nr")
    url = str(tmp_path / "arch")
    report = retain(saver, older_than_days=30, archive=url)
    assert report.threads_archived == 1 and report.deleted_thread_ids == ["nr"]
    assert not any(raw_rows(dsn, schema, "nr").values())
    assert A.restore(saver, url, thread_ids=["nr"]).thread_ids == ["nr"]
    assert raw_rows(dsn, schema, "nr") == before and before["durable_threads"] == []
    assert snapshot(saver, "nr") == history


def test_restore_conflicting_ledger_key_restores_nothing(
    dsn: str, schema: str, saver: DurablePostgresSaver, tmp_path: Path
) -> None:
    """A row of another thread holding one of the archive's unique keys: the insert's
    unique violation becomes ArchiveConflictError and the transaction rolls back."""
    _graph(saver).invoke({"subject": "lk"}, _cfg("lk"))
    _backdate(dsn, schema)
    url = str(tmp_path / "arch")
    assert retain(saver, older_than_days=30, archive=url).threads_archived == 1
    (key,) = [m for m in A.verify(url)]
    _, dump = A.decode(Path(key["url"]).read_bytes())
    cols = [c[0] for c in dump.tables["durable_ledger"]["columns"]]
    ledger_key = dump.tables["durable_ledger"]["rows"][0][cols.index("key")]
    _q(dsn, schema, "INSERT INTO durable_ledger (key, thread_id, fingerprint, status) VALUES (%s, 'other', 'f', 'done')", ledger_key)
    with pytest.raises(ArchiveConflictError) as err:
        A.restore(saver, url)
    assert err.value.thread_id == "lk" and isinstance(err.value.__cause__, psycopg.errors.UniqueViolation)
    assert _q(dsn, schema, "SELECT count(*) FROM checkpoints")[0][0] == 0
    assert _q(dsn, schema, "SELECT count(*) FROM durable_threads WHERE thread_id = 'lk'")[0][0] == 0
