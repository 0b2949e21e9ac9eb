"""Review 32: the two capabilities of 2026-12, attacked on real PostgreSQL.

1. ``_acked``: an ``@idempotent`` record the server lost (asynchronous failover) written
   again from this process's memory, by the claim path (``protocol._restore_own``) and
   by a work-lost run's release (``lifecycle._work_lost_release`` / ``restore_stmts``).
   A lost record is simulated as the failover tests do: the completed row set back to
   ``started`` with no result, its owner kept.
2. ``archive.restore`` re-sealing an archive's values with the current key
   (``archive._resealed`` over ``ops.rekey._recrypt_row``), fed real archives, edited.

Each test works in a schema of its own (retention picks every old thread of a schema).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

import psycopg
import pytest
from langgraph.graph import END, START, StateGraph

from langgraph_durable import DurablePostgresSaver, Ledger, idempotent
from langgraph_durable._acked import ACKED, MAX_BYTES, MAX_ONE, Acked, AckedResults, restore_stmts
from langgraph_durable.errors import (
    DecryptionError,
    DurableError,
    IdempotencyConflictError,
    OutcomeUnknownError,
)
from langgraph_durable.keyring import DurableEncryptedSerializer

K1 = b"1" * 32
K2 = b"2" * 32
K0 = b"0" * 32
LOSE = ("UPDATE durable_ledger SET status = 'started', result = NULL, result_type = NULL, "
        "completed_at = NULL, claim_expires_at = now() - interval '1 second' WHERE key = %s")


def _schema() -> str:
    return "r32_" + uuid.uuid4().hex[:10]


def _q(dsn: str, schema: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


@pytest.fixture
def schema(dsn: str) -> Iterator[str]:
    name = _schema()
    yield name
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def _saver(dsn: str, schema: str, serde: Any = None) -> Any:
    return DurablePostgresSaver.from_conn_string(dsn, schema=schema, serde=serde)


# =========================================================================== 1. _acked


# rev32 finding, fixed: _restore_own replays the memory without comparing the call's fingerprint: other arguments get another call's result, not IdempotencyConflictError
def test_restore_own_replays_a_result_of_other_arguments(dsn: str, schema: str) -> None:
    """A key= key reused with other arguments is IdempotencyConflictError (``_judge``).
    When this process's own claim lost its record, ``_restore_own`` runs before
    ``_judge`` and compares the memory with the *row*, never with the *call*: the call
    with other arguments gets the first call's result as its own."""
    runs: list[tuple[int, int]] = []
    with _saver(dsn, schema) as saver:
        saver.setup()

        @idempotent(ledger=saver, key=lambda order, amount: f"charge-{order}", wait_timeout=1.0)
        def charge(order: int, amount: int) -> str:
            runs.append((order, amount))
            return f"charged {amount} for {order}"

        assert charge(1, 5) == "charged 5 for 1"
        # Without a lost record the conflict is seen:
        with pytest.raises(IdempotencyConflictError):
            charge(1, 7)
        _q(dsn, schema, LOSE, ("charge-1",))
        # The record lost, its claim kept: the same conflict must be raised (the
        # record may well be written again, it is the truth).
        try:
            got = charge(1, 7)
        except IdempotencyConflictError:
            got = None
        assert got is None, f"a call with amount=7 returned {got!r}: another call's result"
        assert runs == [(1, 5)]


def _sealed_call(ledger: Any, runs: list[int]) -> Any:
    """The same function (same name: same fingerprint) on ``ledger``."""

    @idempotent(ledger=ledger, key=lambda n: f"sealed-{n}", wait_timeout=1.0)
    def sealed_call(n: int) -> str:
        runs.append(n)
        return f"secret {n}"

    return sealed_call


# rev32 finding, fixed: _acked restores result bytes sealed under a key since dropped: DecryptionError, and a completed row resolve refuses
def test_restore_own_writes_bytes_sealed_under_a_dropped_key(dsn: str, schema: str) -> None:
    """The memory keeps the result as stored: sealed under the key current when it was
    recorded. After a rotation whose old key left the configuration (a saver made anew
    with the new key alone, in the same process), the claim path writes the old-key
    bytes back: the call fails with DecryptionError, and the row is now 'completed'
    with a result no configured key opens, so ``Ledger.resolve`` (status <> 'completed')
    is refused too; only ``forget`` (a second effect) is left. Before the restore, the
    row was an unknown outcome an operator could resolve. Expected: re-sealed with the
    current key (``Keyring.recrypt_serde``), or not restored."""
    runs: list[int] = []
    with _saver(dsn, schema, DurableEncryptedSerializer(current=K1)) as old:
        old.setup()

        assert _sealed_call(old, runs)(1) == "secret 1"
    _q(dsn, schema, LOSE, ("sealed-1",))
    with _saver(dsn, schema, DurableEncryptedSerializer(current=K2, old=[K1])) as both:
        from langgraph_durable.ops.rekey import rekey

        rekey(both)  # the operator's finished rekey: K1 may leave the configuration
    with _saver(dsn, schema, DurableEncryptedSerializer(current=K2)) as new:

        try:
            got: Any = _sealed_call(new, runs)(1)
        except OutcomeUnknownError:
            got = "unknown"
        except DecryptionError as exc:
            got = exc
        assert got in ("secret 1", "unknown"), f"the restore wrote old-key bytes back: {got!r}"
        if got == "unknown":
            Ledger(new).resolve("sealed-1", "secret 1")
        assert Ledger(new).result("sealed-1") == "secret 1"
    assert runs == [1]


def test_restore_own_leaves_an_operator_resolve(dsn: str, schema: str) -> None:
    """An operator resolved the lost call meanwhile (owner 'operator'): the operator's
    value stands, the memory never overwrites it."""
    with _saver(dsn, schema) as saver:
        saver.setup()

        @idempotent(ledger=saver, key=lambda n: f"res-{n}", wait_timeout=1.0)
        def call(n: int) -> str:
            return f"mine {n}"

        assert call(1) == "mine 1"
        _q(dsn, schema, LOSE, ("res-1",))
        Ledger(saver).resolve("res-1", "the operator's")
        assert call(1) == "the operator's"
        # and the release path's statement does not touch it either
        assert ACKED.get("res-1") is not None
        _q(dsn, schema, "UPDATE durable_ledger SET status = 'started', result = NULL WHERE key = 'res-1'")
        for stmt in restore_stmts_for_key("res-1"):
            assert not _q(dsn, schema, stmt.sql, stmt.params)
        assert _q(dsn, schema, "SELECT owner FROM durable_ledger WHERE key = 'res-1'") == [("operator",)]


def restore_stmts_for_key(key: str) -> list[Any]:
    """restore_stmts' statement for one key= entry (its thread is None, so the release
    path never selects it; the statement is the same)."""
    from langgraph_durable._io import Stmt
    from langgraph_durable.sql.ledger import LEDGER_COMPLETE_SQL

    a = ACKED.get(key)
    assert a is not None
    return [Stmt(LEDGER_COMPLETE_SQL, (a.result_type, a.result, key, a.owner))]


def test_restore_own_leaves_a_ttl_key_claimed_anew_by_another_owner(dsn: str, schema: str) -> None:
    """A key= key whose TTL ran out, claimed anew by another process (its owner): the
    call here waits for / judges that claim, the memory is not written over it."""
    with _saver(dsn, schema) as saver:
        saver.setup()

        @idempotent(ledger=saver, key=lambda n: f"ttl-{n}", ttl=3600, wait_timeout=0.5)
        def call(n: int) -> str:
            return f"first {n}"

        assert call(1) == "first 1"
        _q(dsn, schema, LOSE.replace("claim_expires_at = now() - interval '1 second'",
                                     "claim_expires_at = now() + interval '1 hour', owner = 'elsewhere:1:0:ns1.1:ab'"),
           ("ttl-1",))
        from langgraph_durable.errors import CallInFlightError

        with pytest.raises(CallInFlightError):
            call(1)
        assert _q(dsn, schema, "SELECT status, owner FROM durable_ledger WHERE key = 'ttl-1'") == [
            ("started", "elsewhere:1:0:ns1.1:ab")
        ]


class _S(TypedDict, total=False):
    out: str


def test_release_restore_does_not_resurrect_a_deleted_thread(dsn: str, schema: str) -> None:
    """The release path's statements (restore_stmts) are UPDATEs over the same claim:
    after delete_thread (or retention) removed the thread's rows, nothing comes back."""
    with _saver(dsn, schema) as saver:
        saver.setup()

        @idempotent
        def effect(x: str) -> str:
            return f"did {x}"

        def node(s: _S) -> dict[str, Any]:
            return {"out": effect("it")}

        g = StateGraph(_S)
        g.add_node("n", node)
        g.add_edge(START, "n")
        g.add_edge("n", END)
        graph = g.compile(checkpointer=saver)
        tid = "del-" + uuid.uuid4().hex[:6]
        graph.invoke({}, {"configurable": {"thread_id": tid}})
        stmts = restore_stmts(tid, saver.serde)
        assert len(stmts) == 1
        saver.delete_thread(tid)
        for s in stmts:
            assert not _q(dsn, schema, s.sql, s.params)
        assert _q(dsn, schema, "SELECT count(*) FROM durable_ledger WHERE thread_id = %s", (tid,)) == [(0,)]


def test_memory_bounds_hold() -> None:
    """One result over MAX_ONE is not kept; many calls stay under MAX_ENTRIES and
    MAX_BYTES; replacing a key's entry does not leak its byte count."""
    mem = AckedResults(max_entries=50, max_bytes=10_000)
    mem.remember("huge", Acked(None, "o", "f", "t", b"x" * (MAX_ONE + 1)))
    assert mem.get("huge") is None and mem._bytes == 0
    for i in range(500):
        mem.remember(f"k{i}", Acked("t", f"o{i}", "f", "t", b"y" * 300))
        mem.remember("same", Acked("t", f"s{i}", "f", "t", b"z" * 100))
    assert len(mem._by_key) <= 50 and mem._bytes <= 10_000
    assert mem._bytes == sum(len(a.result) for a in mem._by_key.values())
    assert MAX_BYTES >= MAX_ONE


# =========================================================================== 2. restore re-seal


class _T(TypedDict, total=False):
    text: str


def _text_graph(saver: Any) -> Any:
    def echo(s: _T) -> dict[str, Any]:
        return {"text": s["text"] + " echoed"}

    g = StateGraph(_T)
    g.add_node("echo", echo)
    g.add_edge(START, "echo")
    g.add_edge("echo", END)
    return g.compile(checkpointer=saver)


def _age(dsn: str, schema: str, thread: str) -> None:
    _q(dsn, schema, "UPDATE checkpoints SET checkpoint = jsonb_set(checkpoint, '{ts}', "
       "to_jsonb('2000-01-01T00:00:00.000000+00:00'::text)) WHERE thread_id = %s", (thread,))
    _q(dsn, schema, "UPDATE durable_threads SET updated_at = now() - interval '40 days' WHERE thread_id = %s",
       (thread,))


def _archived(dsn: str, schema: str, tmp: Path, write_key: bytes, archive_serde: Any, thread: str) -> Path:
    """A thread written under ``write_key``, archived (and deleted) by a saver with
    ``archive_serde``; the archive directory."""
    from langgraph_durable.ops.retention import retain

    with _saver(dsn, schema, DurableEncryptedSerializer(current=write_key)) as s:
        s.setup()
        _text_graph(s).invoke({"text": "small value"}, {"configurable": {"thread_id": thread},
                                                         "metadata": {"customer": "c-1"}})
    _age(dsn, schema, thread)
    with _saver(dsn, schema, archive_serde) as s:
        assert retain(s, older_than_days=30, archive=str(tmp)).threads_archived == 1
    return tmp


# rev32 finding, fixed: _resealed skips a one-key ring: an archive with old-key values restores unreadable instead of DecryptionError before writing
def test_restore_with_one_key_keeps_values_of_an_old_key(dsn: str, schema: str, tmp_path: Path) -> None:
    """An archive written mid-rotation (the saver had [K2, K1]: new rows K2, the old
    thread's rows still K1; its digest secret re-sealed under K2 by the archive), the
    database then rekeyed and K1 dropped. Restored with K2 alone: ``_resealed`` returns
    early for a one-key ring (``len(ring.keys) < 2``), so the K1 values are inserted as
    they are, no DecryptionError "before anything is written" as its docstring says,
    and the restored thread does not read. Expected: refused (DecryptionError, nothing
    written), or re-sealed."""
    from langgraph_durable.archive import restore
    from langgraph_durable.ops.rekey import rekey

    thread = "mid-rotation"
    url = _archived(dsn, schema, tmp_path, K1, DurableEncryptedSerializer(current=K2, old=[K1]), thread)
    with _saver(dsn, schema, DurableEncryptedSerializer(current=K2, old=[K1])) as both:
        rekey(both)
    with _saver(dsn, schema, DurableEncryptedSerializer(current=K2)) as new:
        try:
            restore(new, str(url))
        except DecryptionError:
            assert _q(dsn, schema, "SELECT count(*) FROM checkpoints WHERE thread_id = %s", (thread,)) == [(0,)]
            return
        got = new.get_tuple({"configurable": {"thread_id": thread}})  # DecryptionError
        assert got is not None and got.checkpoint["channel_values"]["text"] == "small value echoed"
        assert got.metadata.get("customer") == "c-1"


def test_restore_with_two_keys_and_the_archive_key_missing_is_refused(dsn: str, schema: str, tmp_path: Path) -> None:
    """Re-seal with a keyring that lacks the archive's key: DecryptionError (a
    DurableError), nothing of the thread written."""
    from langgraph_durable.archive import restore

    thread = "missing-key"
    url = _archived(dsn, schema, tmp_path, K1, DurableEncryptedSerializer(current=K1), thread)
    with _saver(dsn, schema, DurableEncryptedSerializer(current=K2, old=[K0])) as other:
        with pytest.raises(DecryptionError):
            restore(other, str(url))
    for table in ("checkpoints", "checkpoint_blobs", "durable_threads", "durable_ledger"):
        assert _q(dsn, schema, f"SELECT count(*) FROM {table} WHERE thread_id = %s", (thread,)) == [(0,)]


def _edit(url: Path, edit: Any, serde: Any) -> None:
    """Decode the one archive under ``url``, apply ``edit(dump)``, write it back with
    its manifest recomputed (what anyone who can write the directory can do)."""
    from langgraph_durable import archive as A

    [name] = [p for p in url.iterdir() if p.name.endswith(A.SUFFIX)]
    data = name.read_bytes()
    manifest, dump = A.decode(data, str(name), serde=serde)
    edit(dump)
    name.write_bytes(A.encode(dump, created_at=manifest["created_at"]))


def _set(dump: Any, table: str, column: str, value: Any, **where: Any) -> None:
    part = dump.tables[table]
    names = [c[0] for c in part["columns"]]
    n = 0
    for row in part["rows"]:
        if all(row[names.index(k)] == v for k, v in where.items()):
            row[names.index(column)] = value(row[names.index(column)]) if callable(value) else value
            n += 1
    assert n, (table, column)


HOSTILE = {
    # a bytea value as a string (JSON type confusion): bytes(str) -> TypeError
    "blob-as-text": lambda d: _set(d, "checkpoint_blobs", "blob", "not bytes"),
    # an envelope type over garbage: ormsgpack.unpackb -> MsgpackDecodeError
    "envelope-garbage": lambda d: (_set(d, "checkpoint_blobs", "type", "durable+ref"),
                                   _set(d, "checkpoint_blobs", "blob", b"\xc1\xc1")),
    # sealed metadata whose sealed part is not base64: binascii.Error
    "metadata-not-base64": lambda d: _set(
        d, "checkpoints", "metadata", lambda m: {**m, "lgd:sealed": "!!not base64!!"}),
    # a type column that is not text: `"+" in 5` -> TypeError
    "type-as-int": lambda d: _set(d, "checkpoint_blobs", "type", 5),
    # an int where bytes belong: bytes(10**12) would allocate a terabyte (found by
    # reading, after the review): refused by type before any re-seal
    "blob-as-huge-int": lambda d: _set(d, "checkpoint_blobs", "blob", 10**12),
    "write-blob-as-huge-int": lambda d: _set(d, "checkpoint_writes", "blob", 10**12),
}


# rev32 finding, fixed: a hostile archive's mistyped sealed value crashes _resealed with a non-DurableError (TypeError/ValueError/binascii.Error)
@pytest.mark.parametrize("attack", sorted(HOSTILE))
def test_hostile_value_types_under_reseal_are_refused_typed(
    dsn: str, schema: str, tmp_path: Path, attack: str
) -> None:
    """decode/check_dump never look at the types of checkpoint_blobs.blob/type or of
    checkpoints.metadata; with a two-key ring ``_resealed`` then feeds them to rekey's
    recrypt functions, which assume the database's types. Expected: a typed refusal
    (ArchiveRejectedError / ArchiveIntegrityError), as for every other damaged file."""
    from langgraph_durable.archive import restore

    ring = DurableEncryptedSerializer(current=K2, old=[K1])
    thread = "hostile-" + attack
    url = _archived(dsn, schema, tmp_path, K1, ring, thread)
    _edit(url, HOSTILE[attack], ring)
    with _saver(dsn, schema, ring) as s:
        with pytest.raises(DurableError):
            restore(s, str(url))
    assert _q(dsn, schema, "SELECT count(*) FROM checkpoints WHERE thread_id = %s", (thread,)) == [(0,)]


class _RacingMemory:
    """``ACKED`` as ``_restore_own`` sees it, with ``before_get`` run first: what a
    second actor does between the claim's read of the row and the restore's UPDATE
    (another thread of this process restoring the same record, an operator's resolve)."""

    def __init__(self, before_get: Any) -> None:
        self.before_get = before_get

    def get(self, key: str) -> Any:
        self.before_get(key)
        return ACKED.get(key)

    def remember(self, key: str, acked: Any) -> None:
        ACKED.remember(key, acked)


# rev32 finding, fixed: _restore_own losing a race judges the stale 'started' row: OutcomeUnknownError though the record was just written
@pytest.mark.parametrize("second", ["same-process-restore", "operator-resolve"])
def test_restore_own_losing_the_race_judges_a_stale_row(
    dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch, second: str
) -> None:
    """Two actors meet the same lost record: the second's UPDATE matches nothing (the
    first completed it), and ``_claim`` then judges the row it read before, still
    'started' with an expired claim: OutcomeUnknownError (an operator needed) for a call
    whose record is on the server. Expected: read the row again (``continue``)."""
    from langgraph_durable.idempotency import protocol

    with _saver(dsn, schema) as saver:
        saver.setup()

        @idempotent(ledger=saver, key=lambda n: f"race-{n}", wait_timeout=1.0)
        def call(n: int) -> str:
            return f"result {n}"

        assert call(1) == "result 1"
        _q(dsn, schema, LOSE, ("race-1",))
        acked = ACKED.get("race-1")
        assert acked is not None
        fired: list[str] = []

        def first_actor(key: str) -> None:
            if fired:
                return
            fired.append(key)
            if second == "same-process-restore":
                from langgraph_durable.sql.ledger import LEDGER_COMPLETE_SQL

                assert _q(dsn, schema, LEDGER_COMPLETE_SQL, (acked.result_type, acked.result, key, acked.owner))
            else:
                Ledger(saver).resolve(key, "result 1")

        monkeypatch.setattr(protocol, "ACKED", _RacingMemory(first_actor))
        assert call(1) == "result 1"


def _plain_archive(dsn: str, schema: str, tmp: Path, thread: str) -> Path:
    from langgraph_durable.ops.retention import retain

    with _saver(dsn, schema) as s:
        s.setup()
        _text_graph(s).invoke({"text": "plain"}, {"configurable": {"thread_id": thread}})
    _age(dsn, schema, thread)
    with _saver(dsn, schema) as s:
        assert retain(s, older_than_days=30, archive=str(tmp)).threads_archived == 1
    return tmp


def _one(url: Path) -> Path:
    from langgraph_durable.archive import SUFFIX

    [f] = [p for p in url.iterdir() if p.name.endswith(SUFFIX)]
    return f


def _flip_payload(f: Path) -> None:
    b = bytearray(f.read_bytes())
    b[-5] ^= 0xFF
    f.write_bytes(bytes(b))


def _truncate(f: Path) -> None:
    f.write_bytes(f.read_bytes()[:-40])


def _non_utf8_manifest(f: Path) -> None:
    import struct

    b = f.read_bytes()
    (size,) = struct.unpack_from("<I", b, 4)
    f.write_bytes(b[:8] + b"\xff\xfe" + b[10 : 8 + size] + b[8 + size :])


def _foreign_row(f: Path) -> None:
    from langgraph_durable import archive as A

    manifest, dump = A.decode(f.read_bytes(), str(f))
    part = dump.tables["checkpoint_blobs"]
    at = [c[0] for c in part["columns"]].index("thread_id")
    row = list(part["rows"][0])
    row[at] = "victim-thread"
    part["rows"].append(row)
    f.write_bytes(A.encode(dump, created_at=manifest["created_at"]))


def _json_confusion(f: Path) -> None:
    from langgraph_durable import archive as A

    manifest, dump = A.decode(f.read_bytes(), str(f))
    dump.tables["checkpoints"] = {"columns": "oops", "rows": {"a": 1}}
    f.write_bytes(A.encode(dump, created_at=manifest["created_at"]))


DAMAGE = {
    "payload-bytes-flipped": _flip_payload,
    "truncated": _truncate,
    "manifest-not-utf8": _non_utf8_manifest,
    "row-of-another-thread": _foreign_row,
    "tables-json-confusion": _json_confusion,
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_archives_are_refused_whole(dsn: str, schema: str, tmp_path: Path, damage: str) -> None:
    """Refused with an ArchiveError (a DurableError), nothing written."""
    from langgraph_durable.archive import restore
    from langgraph_durable.errors import ArchiveError

    thread = "dmg-" + damage
    url = _plain_archive(dsn, schema, tmp_path, thread)
    DAMAGE[damage](_one(url))
    with _saver(dsn, schema) as s:
        with pytest.raises(ArchiveError):
            restore(s, str(url))
    for t in (thread, "victim-thread"):
        assert _q(dsn, schema, "SELECT count(*) FROM checkpoint_blobs WHERE thread_id = %s", (t,)) == [(0,)]
        assert _q(dsn, schema, "SELECT count(*) FROM durable_threads WHERE thread_id = %s", (t,)) == [(0,)]


def test_restore_over_an_existing_or_live_thread_is_refused(dsn: str, schema: str, tmp_path: Path) -> None:
    """A thread that exists again (a new run under the same id, holding its lease
    meanwhile) is never overwritten or merged: ArchiveConflictError, its rows as they were."""
    import threading

    from langgraph_durable.archive import restore
    from langgraph_durable.errors import ArchiveConflictError

    thread = "exists"
    url = _plain_archive(dsn, schema, tmp_path, thread)
    inside = threading.Event()
    go = threading.Event()
    with _saver(dsn, schema) as s:
        def slow(st: _T) -> dict[str, Any]:
            inside.set()
            assert go.wait(30)
            return {"text": "new run"}

        g = StateGraph(_T)
        g.add_node("slow", slow)
        g.add_edge(START, "slow")
        g.add_edge("slow", END)
        graph = g.compile(checkpointer=s)
        t = threading.Thread(target=graph.invoke, args=({"text": "x"}, {"configurable": {"thread_id": thread}}))
        t.start()
        try:
            assert inside.wait(30)
            with _saver(dsn, schema) as op, pytest.raises(ArchiveConflictError):
                restore(op, str(url))
        finally:
            go.set()
            t.join(30)
        assert graph.get_state({"configurable": {"thread_id": thread}}).values["text"] == "new run"
        with pytest.raises(ArchiveConflictError):
            restore(s, str(url))
    assert _q(dsn, schema, "SELECT count(*) FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = ''",
              (thread,))[0][0] >= 1


def _fork_and_wait(child: Any, timeout: float = 5.0) -> int | None:
    """Run ``child()`` in a fork()ed process (its exit status; None: it hung, killed)."""
    import os
    import signal
    import time

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            code = int(bool(child()) is False)
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def test_owner_ids_after_fork_do_not_collide() -> None:
    """A fork()ed child inherits ACKED, never the parent's owner ids: its claims carry
    its own pid, so no record of the parent can be restored over a claim of the child."""
    import os

    from langgraph_durable.idempotency.keys import _owner

    parent = _owner()
    r, w = os.pipe()

    def child() -> bool:
        os.write(w, _owner().encode())
        return True

    assert _fork_and_wait(child) == 0
    os.close(w)
    got = os.read(r, 4096).decode()
    os.close(r)
    assert got.split(":")[1] != parent.split(":")[1] and got.rsplit(":", 1)[1] != parent.rsplit(":", 1)[1]


# rev32 finding, fixed: ACKED's lock is not reset after fork(): a child forked while another thread records hangs at its first @idempotent record
def test_a_child_forked_while_a_thread_records_can_record() -> None:
    """``AckedResults._lock`` (a threading.Lock) taken by another thread at the moment
    of fork() stays taken in the child for ever; the child's first ``remember`` (every
    plain @idempotent record) blocks. Expected: ``os.register_at_fork`` resets it (or
    the child starts with an empty memory)."""
    import threading

    held, release = threading.Event(), threading.Event()

    def recorder() -> None:
        with ACKED._lock:
            held.set()
            release.wait(10)

    t = threading.Thread(target=recorder)
    t.start()
    assert held.wait(5)
    try:
        status = _fork_and_wait(lambda: ACKED.remember("fork-k", Acked(None, "o", "f", "t", b"r")) or True)
    finally:
        release.set()
        t.join(10)
    assert status == 0, "the forked child hung in ACKED.remember"
