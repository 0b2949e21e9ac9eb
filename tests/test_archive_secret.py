"""restore27 (issue 27): an encrypted archive restores into another database.

Since digest27 an encrypting saver keys artifact digests and call fingerprints with the
database's own random secret (``durable_secrets``). An archive written from database A
therefore holds artifacts and fingerprints keyed by A's secret; before restore27 a restore
into any other database (disaster recovery into a new one, a copy to staging) was refused
(``ArchiveRejectedError``, ``artifact_digest``). Now ``retain --archive`` writes A's
secrets into the file, sealed under the current key (never in the clear), and ``restore``
adopts them (a database with no secret in use) or keeps them as accepted secrets
(``digest.<id>`` rows: a database with a secret of its own in use).

Each case on real PostgreSQL databases of its own (A, B, C, D): a thread of A waits in an
interrupt after a journaled model answer and an ``@idempotent`` charge were recorded,
with a large document offloaded to an artifact; ``retain --archive`` moves it to a file.
Restored into B (fresh) and C (its own secret in use): the thread reads back, its resume
calls neither the model nor the charge again (no ``IdempotencyConflictError``), the file
holds no plaintext secret. A file whose sealed secret was changed (payload hash
recomputed) is refused, nothing restored.
"""

from __future__ import annotations

import json
import operator
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import ormsgpack
import psycopg
import pytest
import zstandard
from conftest import drop_database, make_database
from langchain_core.runnables import RunnableLambda
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from langgraph_durable import DurablePostgresSaver, idempotent, journaled
from langgraph_durable import archive as A
from langgraph_durable._sealing import secret_id
from langgraph_durable.errors import ArchiveRejectedError
from langgraph_durable.keyring import DurableEncryptedSerializer, Keyring
from langgraph_durable.ops import rekey as ops_rekey
from langgraph_durable.ops.retention import retain

K1 = b"k1-restore27-0123456789abcdef012"
K2 = b"k2-restore27-0123456789abcdef012"
BIG = "the disaster-recovery contract of Ada Lovelace, " + "clause " * 200
CALLS: list[str] = []


class State(TypedDict, total=False):
    doc: str
    out: Annotated[list[str], operator.add]


def _graph() -> StateGraph:
    def answer(_: Any) -> str:
        CALLS.append("model")
        return "the model says yes"

    model = journaled(RunnableLambda(answer), name="model")

    @idempotent(name="charge")
    def charge(card: str) -> str:
        CALLS.append("charge")
        return "r-" + card[-4:]

    def work(state: State) -> dict[str, Any]:
        said = model.invoke("may I charge card 4111 1111 1111 1111?")
        receipt = charge("4111 1111 1111 1111")
        approved = interrupt("approve?")
        return {"out": [said, receipt, approved]}

    g = StateGraph(State)
    g.add_node("work", work)
    g.add_edge(START, "work")
    g.add_edge("work", END)
    return g


def _q(dsn: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


def _saver(dsn: str, key: bytes = K1, old: tuple[bytes, ...] = ()) -> DurablePostgresSaver:
    # A serializer of its own per saver: a keyring remembers the secrets it has read, so
    # sharing one between databases would hide a database's missing secret.
    return DurablePostgresSaver.from_conn_string(
        dsn, serde=DurableEncryptedSerializer(key, old=list(old)), artifact_threshold=256
    )


def _secrets(dsn: str, key: bytes = K1) -> dict[str, bytes]:
    ring = Keyring.from_serde(DurableEncryptedSerializer(key))
    assert ring is not None
    rows = _q(dsn, "SELECT name, sealed FROM durable_secrets ORDER BY name")
    return {n: ring.open(bytes(s), thread_id=None, where=n) for n, s in rows}


def _artifacts(dsn: str) -> int:
    return int(_q(dsn, "SELECT count(*) FROM durable_artifacts")[0][0])


@pytest.fixture
def databases(admin_dsn: str) -> Iterator[Any]:
    made: list[str] = []

    def make(label: str) -> str:
        dsn = make_database(admin_dsn, f"r27_{label}")
        made.append(dsn)
        with _saver(dsn) as s:
            s.setup()  # a fresh database: its saver makes a secret, nothing keyed by it yet
        return dsn

    yield make
    for dsn in made:
        drop_database(admin_dsn, dsn)


def _archive_from_a(make: Any, tmp_path: Path, thread: str) -> tuple[str, str, bytes]:
    """Database A: the thread waits in its interrupt after the model's answer and the
    charge were recorded; retain archives and deletes it. (A's dsn, the file, A's secret.)"""
    a = make("a")
    CALLS.clear()
    with _saver(a) as saver:
        app = _graph().compile(checkpointer=saver)
        app.invoke({"doc": BIG, "out": []}, {"configurable": {"thread_id": thread}})
        assert CALLS == ["model", "charge"]
        assert _artifacts(a) >= 1  # the large document, offloaded
        _q(a, "UPDATE checkpoints SET checkpoint = jsonb_set(checkpoint, '{ts}', "
              "to_jsonb('2000-01-01T00:00:00.000000+00:00'::text))")
        _q(a, "UPDATE durable_threads SET updated_at = now() - interval '40 days'")
        url = str(tmp_path / "archive")
        report = retain(saver, older_than_days=30, statuses=("waiting",), archive=url)
        assert report.threads_archived == report.threads_deleted == 1, report
    (own,) = _secrets(a).values()
    (path,) = Path(url).glob(f"*{A.SUFFIX}")
    data = path.read_bytes()
    manifest = A.read_manifest(data)
    assert manifest["digest_secrets"] == [{"id": secret_id(own), "key_id": Keyring.from_serde(DurableEncryptedSerializer(K1)).current_id}]  # type: ignore[union-attr]
    # The secret is in the file sealed only: its bytes appear nowhere, neither in the
    # file nor in its decompressed payload.
    payload = zstandard.ZstdDecompressor().decompress(data[manifest["_offset"]:])
    assert own not in data and own not in payload and own.hex().encode() not in payload
    return a, str(path), own


def _resume_reads_back_and_replays(dsn: str, thread: str) -> None:
    CALLS.clear()
    with _saver(dsn) as saver:
        app = _graph().compile(checkpointer=saver)
        cfg = {"configurable": {"thread_id": thread}}
        assert app.get_state(cfg).values["doc"] == BIG
        out = app.invoke(Command(resume="approved"), cfg)
    assert out["out"] == ["the model says yes", "r-1111", "approved"]
    assert CALLS == []  # the journaled answer and the charge replayed: not called again


def test_restore_into_a_fresh_database_adopts_the_archive_secret(databases: Any, tmp_path: Path) -> None:
    """On main this restore is refused: ArchiveRejectedError (artifact_digest), at
    ``A.restore(saver, path)`` below."""
    _, path, own = _archive_from_a(databases, tmp_path, "dr-b")
    b = databases("b")
    (made,) = _secrets(b).values()  # B's setup() made one; nothing is keyed by it yet
    with _saver(b) as saver:
        report = A.restore(saver, path)
        assert report.thread_ids == ["dr-b"]
        # The restoring saver itself switched to the adopted secret at once.
        assert saver.codec.digest.secret == own
        assert saver.get_tuple({"configurable": {"thread_id": "dr-b"}}) is not None
    stored = _secrets(b)
    # Adopted: A's secret is B's own; B's unused one kept as accepted (a running saver
    # that loaded it still verifies what it writes).
    assert stored == {"digest": own, f"digest.{secret_id(made)}": made}
    _resume_reads_back_and_replays(b, "dr-b")
    # A new identical large value deduplicates against the restored artifact.
    before = _artifacts(b)
    with _saver(b) as saver:
        _graph().compile(checkpointer=saver).invoke({"doc": BIG, "out": []}, {"configurable": {"thread_id": "b-new"}})
    assert _artifacts(b) == before


def test_restore_into_a_database_with_its_own_secret_accepts_the_archive_secret(
    databases: Any, tmp_path: Path
) -> None:
    """C holds threads keyed by its own secret: it keeps it, A's is kept as an accepted
    one (``digest.<id>``), and rekey re-seals both. On main: ArchiveRejectedError."""
    _, path, own = _archive_from_a(databases, tmp_path, "dr-c")
    c = databases("c")
    with _saver(c) as saver:  # C in use: an artifact keyed by C's secret
        g = StateGraph(State)
        g.add_node("noop", lambda s: {})
        g.add_edge(START, "noop")
        g.add_edge("noop", END)
        g.compile(checkpointer=saver).invoke({"doc": "c's own " * 100, "out": []}, {"configurable": {"thread_id": "c-own"}})
    (mine,) = _secrets(c).values()
    with _saver(c) as saver:
        A.restore(saver, path)
    assert _secrets(c) == {"digest": mine, f"digest.{secret_id(own)}": own}
    _resume_reads_back_and_replays(c, "dr-c")
    with _saver(c) as saver:  # C's own thread still reads
        assert saver.get_tuple({"configurable": {"thread_id": "c-own"}}) is not None
    # Rekey to K2 re-seals every secret row; with K2 alone the restored thread still
    # verifies and its resume still replays (the accepted secret was re-sealed).
    with _saver(c, K2, (K1,)) as saver:
        report = ops_rekey.rekey(saver, batch_size=10)
        assert report.columns["durable_secrets.sealed"]["scanned"] == 2
    assert _secrets(c, K2) == {"digest": mine, f"digest.{secret_id(own)}": own}
    CALLS.clear()
    with DurablePostgresSaver.from_conn_string(c, serde=DurableEncryptedSerializer(K2), artifact_threshold=256) as saver:
        state = _graph().compile(checkpointer=saver).get_state({"configurable": {"thread_id": "dr-c"}})
        assert state.values["doc"] == BIG and state.values["out"] == ["the model says yes", "r-1111", "approved"]


def _tamper(path: str, change: Any) -> bytes:
    """The file with its payload changed by ``change(body)`` and its manifest's payload
    hash and size recomputed (whoever can write a file can do that)."""
    data = Path(path).read_bytes()
    manifest = A.read_manifest(data)
    body = ormsgpack.unpackb(zstandard.ZstdDecompressor().decompress(data[manifest.pop("_offset"):]))
    change(body)
    payload = zstandard.ZstdCompressor(write_content_size=True).compress(ormsgpack.packb(body))
    import hashlib

    manifest["payload_sha256"] = hashlib.sha256(payload).hexdigest()
    manifest["payload_bytes"] = len(payload)
    m = json.dumps(manifest, sort_keys=True).encode()
    return struct.pack("<II", 0x184D2A5E, len(m)) + m + payload


def test_a_tampered_archive_secret_is_refused_and_nothing_restored(databases: Any, tmp_path: Path) -> None:
    _, path, _ = _archive_from_a(databases, tmp_path, "dr-t")
    d = databases("d")
    before = _secrets(d)

    def flip(body: dict[str, Any]) -> None:
        sealed = bytearray(body["digest_secrets"][0]["sealed"])
        sealed[-1] ^= 0x01
        body["digest_secrets"][0]["sealed"] = bytes(sealed)

    def drop(body: dict[str, Any]) -> None:  # a file without the secret: as before restore27
        del body["digest_secrets"]

    def garbage(body: dict[str, Any]) -> None:
        body["digest_secrets"][0]["sealed"] = b"not sealed at all"

    def swapped(body: dict[str, Any]) -> None:  # a well-sealed secret that is not the one its id names
        ring = Keyring.from_serde(DurableEncryptedSerializer(K1))
        assert ring is not None
        body["digest_secrets"][0]["sealed"] = ring.seal(b"\x07" * 32)

    for change, reason in ((flip, "digest_secret"), (garbage, "digest_secret"), (swapped, "digest_secret"), (drop, "artifact_digest")):
        bad = tmp_path / f"bad-{change.__name__}{A.SUFFIX}"
        bad.write_bytes(_tamper(path, change))
        with _saver(d) as saver, pytest.raises(ArchiveRejectedError) as err:
            A.restore(saver, str(bad))
        assert err.value.reason == reason and err.value.thread_id == "dr-t", err.value
        assert _q(d, "SELECT count(*) FROM checkpoints")[0][0] == 0
        assert _secrets(d) == before


def test_verify_without_a_saver_lists_the_secret_ids(databases: Any, tmp_path: Path) -> None:
    """``verify`` (no key) still reads the file; the manifest names the secrets by id."""
    _, path, own = _archive_from_a(databases, tmp_path, "dr-v")
    (m,) = A.verify(str(Path(path).parent))
    assert [x["id"] for x in m["digest_secrets"]] == [secret_id(own)]


async def test_async_restore_into_a_fresh_database(databases: Any, tmp_path: Path) -> None:
    """The same adoption through ``arestore`` (the op is shared), and a resume through
    the async saver that replays the journaled answer and the charge."""
    from langgraph_durable import AsyncDurablePostgresSaver

    _, path, own = _archive_from_a(databases, tmp_path, "dr-async")
    b = databases("ab")
    CALLS.clear()
    async with AsyncDurablePostgresSaver.from_conn_string(
        b, serde=DurableEncryptedSerializer(K1), artifact_threshold=256
    ) as saver:
        await saver.asetup()
        report = await A.arestore(saver, path)
        assert report.thread_ids == ["dr-async"]
        assert saver.codec.digest.secret == own
        out = await _graph().compile(checkpointer=saver).ainvoke(
            Command(resume="approved"), {"configurable": {"thread_id": "dr-async"}}
        )
    assert out["out"] == ["the model says yes", "r-1111", "approved"]
    assert CALLS == []
    assert _secrets(b)["digest"] == own


def test_cli_restore_into_a_fresh_database(databases: Any, tmp_path: Path) -> None:
    """``langgraph-durable --key-file F restore FILE --dsn NEW``: the operator's recovery."""
    from typer.testing import CliRunner

    from langgraph_durable.cli import app

    _, path, own = _archive_from_a(databases, tmp_path, "dr-cli")
    e = databases("e")
    key_file = tmp_path / "keys"
    key_file.write_text("hex:" + K1.hex() + "\n")
    result = CliRunner().invoke(app, ["--key-file", str(key_file), "restore", path, "--dsn", e, "--json"], env={})
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["thread_ids"] == ["dr-cli"]
    assert _secrets(e)["digest"] == own
    _resume_reads_back_and_replays(e, "dr-cli")
