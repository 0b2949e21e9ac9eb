"""Issue 27: with an encrypting serializer, nothing a user or a model supplied is readable
in any table, nor in an archive file.

The canary test runs one workload that puts a canary into every place user data reaches
(an inline string and int channel value, a user key of ``config["metadata"]``, an
operator's queued interrupt answer, an
``@idempotent`` tool's arguments and result, a journaled model's answer, a failing node's
exception text and traceback (then quarantined), an operator's ledger resolve, a failing
migration's report in the audit trail, an archive file, offloaded artifact values), then
reads every row of every table of the schema as text, every bytea value raw and
zstd-decompressed, and the archive file's bytes and payload. Without encryption the
canary must be found in each place (so the scan can fail); with
``EncryptedSerializer.from_pycryptodome_aes(key=...)`` nowhere. The same run also checks
that everything reads back with the key, that ``list(filter=...)`` on a sealed metadata
key works, that the plaintext sha256 of an offloaded value is not stored, and that a
wrong key raises ``DecryptionError`` naming the thread on get_tuple, list, a ledger
lookup, a journal replay and an archive restore.
"""

from __future__ import annotations

import hashlib
import operator
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
import zstandard
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from langgraph_durable import (
    DurablePostgresSaver,
    Ledger,
    PoisonCheckpointError,
    _sealing,
    idempotent,
    journal,
    journaled,
)
from langgraph_durable.archive import restore
from langgraph_durable.artifacts import _digest, _element_content, _space, _zstd_dict
from langgraph_durable.keyring import DurableEncryptedSerializer
from langgraph_durable.ops import poison
from langgraph_durable.ops.control import queue_answer
from langgraph_durable.ops.migrations import migrate_threads
from langgraph_durable.ops.retention import retain
from langgraph_durable.versioning import MigrationRegistry

KEY = b"0123456789abcdef0123456789abcdef"
OTHER_KEY = b"fedcba9876543210fedcba9876543210"
CANARY = "CANARYq7Zx9wPm"
CANARY_INT = 918273645546372  # an int channel value (inline without encryption)
THRESHOLD = 256


def _serde(key: bytes | None, form: str = "langgraph") -> Any:
    """LangGraph's own serializer, or the package's rotating one (same stored form)."""
    if key is None:
        return None
    if form == "rotating":
        return DurableEncryptedSerializer(current=key, old=[b"0" * 32])
    return EncryptedSerializer.from_pycryptodome_aes(key=key)


def _cfg(thread: str, **metadata: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"configurable": {"thread_id": thread}}
    if metadata:
        out["metadata"] = metadata
    return out


class State(TypedDict, total=False):
    text: str
    number: int
    docs: list[str]
    answers: Annotated[list[str], operator.add]
    receipt: dict[str, Any]


class Model(BaseChatModel):
    """A chat model whose answer carries the canary."""

    @property
    def _llm_type(self) -> str:
        return "canary"

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=f"the model says {CANARY}"))])


def _graph(saver: DurablePostgresSaver) -> Any:
    @idempotent
    def charge(card: str) -> dict[str, Any]:
        return {"receipt": f"charged {card}"}

    model = journaled(Model())

    @idempotent(cache_failures=ValueError)
    def verify(card: str) -> None:
        raise ValueError(f"card {card} refused")  # cached: the ledger keeps its text

    def work(state: State) -> dict[str, Any]:
        answer = model.invoke([HumanMessage(f"hi, I am {CANARY}")])  # the journal's preview
        with pytest.raises(ValueError):
            verify(f"card {CANARY}")
        return {
            "text": f"inline {CANARY}",
            "number": CANARY_INT,
            # Offloaded: larger than the threshold, split per element into artifacts.
            "docs": [f"document {i} about {CANARY} " + "x" * 400 for i in range(3)],
            "answers": [str(answer.content)],
            "receipt": charge(f"card {CANARY}"),
        }

    g = StateGraph(State)
    g.add_node("work", work)
    g.add_edge(START, "work")
    g.add_edge("work", END)
    return g.compile(checkpointer=saver)


def _failing_graph(saver: DurablePostgresSaver) -> Any:
    def boom(state: State) -> dict[str, Any]:
        raise ValueError(f"card {CANARY} declined")

    g = StateGraph(State)
    g.add_node("boom", boom)
    g.add_edge(START, "boom")
    g.add_edge("boom", END)
    return g.compile(checkpointer=saver)


def _interrupted(saver: DurablePostgresSaver, key: str) -> None:
    """An @idempotent call interrupted mid-call: its row stays 'started' (an unknown
    outcome) with the canary in its arguments, for the operator's resolve."""

    @idempotent(ledger=saver, key=lambda order: key, name="refund")
    def refund(order: str) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        refund(f"order {CANARY}")


class Run:
    def __init__(self, dsn: str, schema: str, archive: Path, key: bytes | None, form: str = "langgraph") -> None:
        self.dsn, self.schema, self.archive, self.key, self.form = dsn, schema, archive, key, form
        tag = uuid.uuid4().hex[:8]
        self.main, self.failing, self.archived, self.migrating, self.asking = (
            f"{n}-{tag}" for n in ("main", "fail", "arch", "mig", "ask")
        )
        self.ledger_key = f"refund-{tag}"

    def saver(self, key: bytes | None = None, **kw: Any) -> Any:
        key = self.key if key is None else key
        return DurablePostgresSaver.from_conn_string(
            self.dsn, schema=self.schema, serde=_serde(key, self.form), artifact_threshold=THRESHOLD,
            max_resume_attempts=1, **kw,
        )


def _q(run: Run, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(run.dsn, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{run.schema}"')
        cur = conn.execute(sql, args or None)
        return cur.fetchall() if cur.description else []


def _workload(run: Run) -> None:
    with run.saver() as saver:
        saver.setup()
        # 1. An archived thread (retain deletes it from the tables: the file is scanned).
        _graph(saver).invoke({"answers": []}, _cfg(run.archived, customer=f"client {CANARY}"))
        _q(run, "UPDATE checkpoints SET checkpoint = jsonb_set(checkpoint, '{ts}', "
                "to_jsonb('2000-01-01T00:00:00.000000+00:00'::text)) WHERE thread_id = %s", run.archived)
        _q(run, "UPDATE durable_threads SET updated_at = now() - interval '40 days' WHERE thread_id = %s",
           run.archived)
        report = retain(saver, older_than_days=30, archive=str(run.archive))
        assert report.threads_archived == 1, report
        # 2. The main thread: inline values, metadata, a tool call, a journaled answer, artifacts.
        _graph(saver).invoke({"answers": []}, _cfg(run.main, customer=f"client {CANARY}"))
        # 3. A failing node, run until its thread is quarantined.
        failing = _failing_graph(saver)
        with pytest.raises(ValueError):
            failing.invoke({"answers": []}, _cfg(run.failing))
        with pytest.raises(PoisonCheckpointError) as poisoned:  # max_resume_attempts=1
            failing.invoke(None, _cfg(run.failing))
        assert CANARY in str(poisoned.value)  # the error a user meets is in the clear
        # 4. An operator resolves an unknown outcome (audited).
        _interrupted(saver, run.ledger_key)
        Ledger(saver).resolve(run.ledger_key, {"refunded": f"order {CANARY}"})
        # 5. A migration that fails: its report (in the audit trail) quotes the error.
        v1 = saver.bind(graph_version="v1")
        _failing_graph(v1)  # the graph is not run: a thread at v1 is enough
        v1.put(
            _cfg(run.migrating), _empty_checkpoint(), {"source": "input", "step": -1, "parents": {}}, {}
        )
        registry = MigrationRegistry()

        def bad(state: dict[str, Any]) -> dict[str, Any]:
            raise ValueError(f"cannot migrate {CANARY}")

        registry.register("v1", "v2", bad)
        report = migrate_threads(saver, "v1", "v2", registry=registry, thread_ids=[run.migrating])
        assert run.migrating in report.failed, report
        # 6. An interrupt answered by an operator, queued for a worker (issue 25): the
        # answer waits in durable_threads.answer_blob (digest27).
        _asking_graph(saver).invoke({"answers": []}, _cfg(run.asking))
        queue_answer(saver, run.asking, f"approved by {CANARY}")
        assert _q(run, "SELECT answer_blob IS NOT NULL FROM durable_threads WHERE thread_id = %s", run.asking)[0][0]


def _asking_graph(saver: DurablePostgresSaver) -> Any:
    def ask(state: State) -> dict[str, Any]:
        return {"answers": [str(interrupt("approve?"))]}

    g = StateGraph(State)
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    return g.compile(checkpointer=saver)


def _empty_checkpoint() -> Any:
    from langgraph.checkpoint.base import empty_checkpoint

    cp = empty_checkpoint()
    cp["channel_values"] = {"text": f"to migrate {CANARY}"}
    cp["channel_versions"] = {"text": 1}
    return cp


def _texts(data: bytes) -> Iterator[bytes]:
    """The bytes and, where they decompress, their zstd content (with and without the
    artifacts' prefix dictionary; an archive's manifest frame skipped)."""
    yield data
    for start in {0, data.find(b"\x28\xb5\x2f\xfd")} - {-1}:
        for dict_data in (None, _zstd_dict()):
            try:
                d = zstandard.ZstdDecompressor(dict_data=dict_data) if dict_data else zstandard.ZstdDecompressor()
                yield d.decompress(data[start:], max_output_size=1 << 26)
            except zstandard.ZstdError:
                pass
    if data[:1] == b"\x00":  # an artifact, encrypted: nothing to decompress
        return


def _scan(run: Run, needles: tuple[bytes, ...] = (CANARY.encode(), str(CANARY_INT).encode())) -> dict[str, set[str]]:
    """Where the canary (or another needle) is readable: {table.column or archive file: ...}."""
    found: dict[str, set[str]] = {}
    tables = [r[0] for r in _q(
        run, "SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
             "AND table_type = 'BASE TABLE'", run.schema)]
    for table in tables:
        cols = _q(run, "SELECT column_name, data_type FROM information_schema.columns "
                       "WHERE table_schema = %s AND table_name = %s", run.schema, table)
        for col, typ in cols:
            for (value,) in _q(run, f'SELECT "{col}"{"::text" if typ != "bytea" else ""} FROM "{table}"'):
                if value is None:
                    continue
                data = bytes(value) if typ == "bytea" else value.encode()
                for text in _texts(data):
                    for needle in needles:
                        if needle in text:
                            found.setdefault(f"{table}.{col}", set()).add(needle.decode())
    for path in run.archive.rglob("*"):
        if path.is_file():
            for text in _texts(path.read_bytes()):
                for needle in needles:
                    if needle in text:
                        found.setdefault("archive file", set()).add(needle.decode())
    return found


# Where the workload puts the canary, and so where a run without a key must find it.
EXPECTED = {
    "checkpoints.checkpoint",  # inline str/int channel values
    "checkpoints.metadata",  # config["metadata"]
    "checkpoint_blobs.blob",  # a channel value through the serializer
    "checkpoint_writes.blob",  # the node's writes
    "durable_artifacts.data",  # offloaded documents (zstd)
    "durable_ledger.args_preview",  # the tool's arguments, the journaled call's last message
    "durable_ledger.error",  # a cached failure's text
    "durable_ledger.result",  # the tool's result, the journaled answer, the operator's resolve
    "durable_threads.last_error",  # the failing node's exception text (and the migrated thread)
    "durable_threads.last_failure",  # its traceback
    "durable_quarantine.last_error",  # quarantined
    "durable_audit.detail",  # the failed migration's report
    "durable_threads.answer_blob",  # an operator's queued interrupt answer (issue 25; digest27)
    "archive file",
}


# Module-scoped: the workload runs once per mode; the tests only read (the run-start test
# writes a thread of its own).
@pytest.fixture(scope="module")
def plain(dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Run:
    run = Run(dsn, "enc_plain_" + uuid.uuid4().hex[:8], tmp_path_factory.mktemp("archive-plain"), None)
    _workload(run)
    return run


@pytest.fixture(scope="module", params=["langgraph", "rotating"])
def sealed(dsn: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Run:
    """EncryptedSerializer.from_pycryptodome_aes, and rekey27's DurableEncryptedSerializer."""
    archive = tmp_path_factory.mktemp("archive-sealed")
    run = Run(dsn, "enc_sealed_" + uuid.uuid4().hex[:8], archive, KEY, request.param)
    _workload(run)
    return run


def test_without_a_key_the_canary_is_readable_in_every_place(plain: Run) -> None:
    found = _scan(plain)
    missing = EXPECTED - set(found)
    assert not missing, f"the workload did not reach {sorted(missing)} (found in {sorted(found)})"
    # The int channel value is inline: readable as JSON.
    assert str(CANARY_INT) in found["checkpoints.checkpoint"]


def test_without_a_key_nothing_changes(plain: Run) -> None:
    """No sealed form anywhere, inline values and metadata as the stock saver stores them,
    artifact digests the plain sha256 of their content (the format before issue 27)."""
    assert not _scan(plain, needles=(b"lgd:sealed",))
    row = _q(plain, "SELECT checkpoint, metadata FROM checkpoints WHERE thread_id = %s "
                    "ORDER BY checkpoint_id DESC LIMIT 1", plain.main)[0]
    assert row[0]["channel_values"]["text"] == f"inline {CANARY}" and row[0]["channel_values"]["number"] == CANARY_INT
    assert row[1]["customer"] == f"client {CANARY}"
    (error,) = _q(plain, "SELECT last_error FROM durable_quarantine WHERE thread_id = %s", plain.failing)[0]
    assert error.startswith("ValueError: card ")
    stored = {bytes(r[0]) for r in _q(plain, "SELECT digest FROM durable_artifacts")}
    doc = f"document 0 about {CANARY} " + "x" * 400
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    content = _element_content(*JsonPlusSerializer().dumps_typed(doc))
    assert hashlib.sha256(content).digest() in stored


def test_with_a_key_the_canary_is_nowhere(sealed: Run) -> None:
    found = _scan(sealed)
    assert found == {}, f"the canary is readable in {found}"


def test_with_the_key_everything_reads_back(sealed: Run) -> None:
    with sealed.saver() as saver:
        state = _graph(saver).get_state(_cfg(sealed.main))
        assert state.values["text"] == f"inline {CANARY}" and state.values["number"] == CANARY_INT
        assert state.values["receipt"] == {"receipt": f"charged card {CANARY}"}
        assert state.metadata["customer"] == f"client {CANARY}"
        # A filter on a sealed metadata key is applied on the decrypted metadata.
        hits = list(saver.list(_cfg(sealed.main), filter={"customer": f"client {CANARY}"}))
        assert hits and all(h.metadata["customer"] == f"client {CANARY}" for h in hits)
        assert list(saver.list(_cfg(sealed.main), filter={"customer": "someone else"})) == []
        assert len(list(saver.list(None, filter={"customer": f"client {CANARY}", "source": "loop"}, limit=1))) == 1
        entries = Ledger(saver).entries(thread_id=sealed.main)
        assert any(CANARY in (e.args_preview or "") for e in entries), entries
        assert any(e.status == "failed" and CANARY in (e.error or "") for e in entries), entries
        assert any(e.key.startswith("llm:") and CANARY in (e.args_preview or "") for e in entries), entries
        refund = Ledger(saver).get(sealed.ledger_key)
        assert refund is not None and CANARY in (refund.args_preview or "")
        assert Ledger(saver).result(sealed.ledger_key) == {"refunded": f"order {CANARY}"}
        report = poison.show(saver, sealed.failing)
        assert CANARY in (report.last_error or ""), report


def test_offloaded_values_have_keyed_digests(sealed: Run) -> None:
    """The plaintext sha256 of an offloaded value (what the table stored before) is not
    findable; the HMAC digest is, and deduplication holds (one row per document)."""
    serde = _serde(KEY, sealed.form)
    stored = {bytes(r[0]) for r in _q(sealed, "SELECT digest FROM durable_artifacts")}
    space = _space("aes")
    doc = f"document 0 about {CANARY} " + "x" * 400
    content = _element_content(*serde.serde.dumps_typed(doc))
    assert _digest(content, space) not in stored
    assert hashlib.sha256(content).digest() not in stored
    ring = _sealing.keyring_of(serde)
    assert ring is not None and _digest(content, space, ring.digest_key()) not in stored  # not key-derived
    # Keyed by the database's own secret, stored sealed (digest27).
    with sealed.saver(KEY) as saver:
        saver.setup()
        secret = saver.codec.digest.secret
    assert secret is not None and _digest(content, space, secret) in stored


def test_a_wrong_key_raises_decryption_error_naming_the_thread(sealed: Run) -> None:
    with sealed.saver(OTHER_KEY) as wrong:
        with pytest.raises(_sealing.DecryptionError) as got:
            wrong.get_tuple(_cfg(sealed.main))
        assert got.value.thread_id == sealed.main
        with pytest.raises(_sealing.DecryptionError) as got:
            list(wrong.list(_cfg(sealed.main)))
        assert got.value.thread_id == sealed.main
        with pytest.raises(_sealing.DecryptionError) as got:
            Ledger(wrong).get(sealed.ledger_key)
        with pytest.raises(_sealing.DecryptionError) as got:
            Ledger(wrong).result(sealed.ledger_key)
        # Journal replay: a replay decodes the recorded answer with the ledger's serde (a
        # run cannot reach it with a wrong key: its checkpoint load fails first).
        rows = _q(sealed, "SELECT key, result_type, result FROM durable_ledger "
                          "WHERE thread_id = %s AND key LIKE 'llm:%%'", sealed.main)
        assert rows, "no journal record"
        key, result_type, result = rows[0]
        entry = SimpleNamespace(
            ledger=SimpleNamespace(serde=wrong.serde), name="Model", key=key,
            thread_id=sealed.main, origin=sealed.main,
        )
        with pytest.raises(_sealing.DecryptionError) as got:
            journal._decode(entry, {"result_type": result_type, "result": result})  # type: ignore[arg-type]
        assert got.value.thread_id == sealed.main


def test_a_run_start_with_a_wrong_key_fails_typed_and_leaves_the_thread_runnable(sealed: Run) -> None:
    """A run of a thread with the wrong key raises DecryptionError (not a load error: the
    thread is not quarantined), and the right key runs it at once (no lease left behind)."""
    thread = f"{sealed.main}-again-{uuid.uuid4().hex[:6]}"
    with sealed.saver() as saver:
        _graph(saver).invoke({"answers": []}, _cfg(thread))
    with sealed.saver(OTHER_KEY) as wrong:
        with pytest.raises(_sealing.DecryptionError) as got:
            _graph(wrong).invoke({"answers": []}, _cfg(thread))
        assert got.value.thread_id == thread
    (status,) = _q(sealed, "SELECT status FROM durable_threads WHERE thread_id = %s", thread)[0]
    assert status != "quarantined"
    with sealed.saver() as saver:
        out = _graph(saver).invoke({"answers": []}, _cfg(thread))
        assert out["text"] == f"inline {CANARY}" and len(out["answers"]) == 2


async def test_the_async_saver_reads_and_refuses_alike(sealed: Run) -> None:
    from langgraph_durable import AsyncDurablePostgresSaver

    def make(key: bytes) -> Any:
        return AsyncDurablePostgresSaver.from_conn_string(
            sealed.dsn, schema=sealed.schema, serde=_serde(key, sealed.form), artifact_threshold=THRESHOLD
        )

    async with make(KEY) as saver:
        got = await saver.aget_tuple(_cfg(sealed.main))
        assert got is not None and got.checkpoint["channel_values"]["text"] == f"inline {CANARY}"
        assert got.metadata["customer"] == f"client {CANARY}"
        hits = [t async for t in saver.alist(_cfg(sealed.main), filter={"customer": f"client {CANARY}"}, limit=2)]
        assert len(hits) == 2
        entry = await Ledger(saver).aget(sealed.ledger_key)
        assert entry is not None and CANARY in (entry.args_preview or "")
    async with make(OTHER_KEY) as wrong:
        with pytest.raises(_sealing.DecryptionError) as err:
            await wrong.aget_tuple(_cfg(sealed.main))
        assert err.value.thread_id == sealed.main


def test_a_migration_rewrites_a_thread_sealed(sealed: Run) -> None:
    """A graph-version migration rewrites the checkpoint in place (core.rewrite): the
    migrated values go to blobs and the metadata stays sealed; it reads back migrated."""
    thread = f"mig-ok-{uuid.uuid4().hex[:6]}"
    with sealed.saver() as saver:
        saver.bind(graph_version="v1").put(
            _cfg(thread, customer=f"client {CANARY}"), _empty_checkpoint(),
            {"source": "input", "step": -1, "parents": {}, "customer": f"client {CANARY}"}, {},
        )
        registry = MigrationRegistry()
        registry.register("v1", "v2", lambda st: {**st, "text": f"migrated {CANARY}", "number": CANARY_INT})
        report = migrate_threads(saver, "v1", "v2", registry=registry, thread_ids=[thread])
        assert report.migrated == [thread], report
        got = saver.get_tuple(_cfg(thread))
        assert got is not None and got.checkpoint["channel_values"]["text"] == f"migrated {CANARY}"
        assert got.checkpoint["channel_values"]["number"] == CANARY_INT
        assert got.metadata["customer"] == f"client {CANARY}" and got.metadata["graph_version"] == "v2"
    rows = _q(sealed, "SELECT checkpoint::text, metadata::text FROM checkpoints WHERE thread_id = %s", thread)
    assert rows and not any(CANARY in c or CANARY in m or str(CANARY_INT) in c for c, m in rows), rows


def test_an_archive_restores_with_the_key_only(sealed: Run) -> None:
    """A wrong key refuses the restore with DecryptionError naming the thread, before
    anything is written; the right key restores a thread that reads back in the clear."""
    with sealed.saver(OTHER_KEY) as wrong:
        with pytest.raises(_sealing.DecryptionError) as got:
            restore(wrong, str(sealed.archive))
        assert got.value.thread_id == sealed.archived
    assert _q(sealed, "SELECT count(*) FROM checkpoints WHERE thread_id = %s", sealed.archived) == [(0,)]
    with sealed.saver() as saver:
        report = restore(saver, str(sealed.archive))
        assert report.thread_ids == [sealed.archived], report
        state = _graph(saver).get_state(_cfg(sealed.archived))
        assert state.values["text"] == f"inline {CANARY}" and state.metadata["customer"] == f"client {CANARY}"
        assert Ledger(saver).entries(thread_id=sealed.archived)
    assert _scan(sealed) == {}  # restored as it was archived: sealed


def test_fingerprints_are_keyed_and_replays_still_match(plain: Run, sealed: Run) -> None:
    """A call's fingerprint (sha256 of its name and arguments) would let someone confirm
    guessed arguments: with a key it is HMAC-keyed. The same call replays (no conflict),
    also with an argument only the serializer can canonicalize (a Path: its encrypted
    bytes differ at every call, the fingerprint does not)."""
    q = "SELECT fingerprint FROM durable_ledger WHERE name LIKE %s"
    plain_fps = {r[0] for r in _q(plain, q, "%charge%")}
    sealed_fps = {r[0] for r in _q(sealed, q, "%charge%")}
    assert plain_fps and sealed_fps and not plain_fps & sealed_fps
    runs: list[Any] = []
    with sealed.saver() as saver:
        key = f"path-{uuid.uuid4().hex[:6]}"

        @idempotent(ledger=saver, key=lambda where: key, name="store")
        def store(where: Path) -> str:
            runs.append(where)
            return f"stored {CANARY}"

        assert store(Path("/tmp") / CANARY) == store(Path("/tmp") / CANARY) == f"stored {CANARY}"
    assert len(runs) == 1
