"""Artifact-by-reference compaction (issue #5): the codec, and the saver on real Postgres.

Covers: round trips of every envelope shape; one stored copy of a value written by a
blob and by a write, by many steps of a growing list, by many threads; integrity
(corrupted bytes -> ArtifactIntegrityError, a deleted artifact -> ArtifactNotFoundError,
both naming thread and checkpoint); EncryptedSerializer, the strict msgpack allowlist,
DeltaChannel history, the async saver, a cache smaller than one checkpoint, and the
retry of a write whose known artifact was collected meanwhile.
"""

from __future__ import annotations

import operator
import random
import string
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.channels import DeltaChannel
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.serde import _msgpack as lg_msgpack
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.serde.types import _DeltaSnapshot
from langgraph.graph import END, START, StateGraph

from langgraph_durable import (
    ArtifactConfig,
    ArtifactIntegrityError,
    ArtifactNotFoundError,
    AsyncDurablePostgresSaver,
    CheckpointLoadError,
    ConfigurationError,
    DurablePostgresSaver,
    SerializationError,
)
from langgraph_durable.artifacts import REF_TYPE, ArtifactCodec, chunk_refs, envelope_refs
from langgraph_durable.errors import DecryptionError


def big(seed: object, size: int = 2048) -> str:
    rng = random.Random(str(seed))
    return "".join(rng.choices(string.ascii_letters + "      ", k=size))


def _store(codec: ArtifactCodec, serde: Any, artifacts: dict[bytes, bytes]) -> dict[bytes, bytes]:
    """What the table would hold: digest -> sealed bytes."""
    return {d: codec.seal(c, serde) for d, c in artifacts.items()}


def _round_trip(value: Any, *, threshold: int | None = 256, serde: Any = None) -> tuple[Any, Any]:
    serde = serde or JsonPlusSerializer()
    writer = ArtifactCodec(ArtifactConfig(threshold=threshold))
    enc = writer.encode(serde, value)
    # A fresh codec (empty cache) reads it back from the "table", verifying every digest.
    reader = ArtifactCodec(ArtifactConfig(threshold=threshold))
    local: dict[bytes, bytes] = {}
    stored = _store(writer, serde, enc.artifacts)
    for _ in range(3):
        need = reader.missing([(enc.type, enc.data)], local)
        reader.accept([(d, stored[d]) for d in need], serde=serde, local=local)
    return enc, reader.decode(serde, enc.type, enc.data, local=local)


# --------------------------------------------------------------------------- codec


@pytest.mark.parametrize(
    "value",
    [
        [big(i) for i in range(40)],  # growing-list shape: chunks + tail
        [f"item {i}" for i in range(100)],  # many small items: inline chunks
        {"a": big("a"), "b": 1, "c": [1, 2]},
        {"turn": 0, "documents": [big(i, 3000) for i in range(20)]},  # nested split
        [{"role": "user", "content": big(i)} for i in range(18)],
        (big("t"), big("u")),  # not split: one artifact
        big("s", 5000),
        b"\x00\x01" * 2000,
        [HumanMessage(content=big(i), id=f"h{i}") for i in range(17)],
        [],
        {},
        "short",
        [1, 2, 3],
    ],
    ids=[
        "list-big",
        "list-small",
        "dict",
        "nested",
        "list-of-dicts",
        "tuple",
        "str",
        "bytes",
        "messages",
        "empty-list",
        "empty-dict",
        "small-str",
        "small-list",
    ],
)
def test_codec_round_trip(value: Any) -> None:
    enc, back = _round_trip(value)
    # Exactly what the serializer alone gives back (a tuple comes back a list, as
    # with the stock saver).
    serde = JsonPlusSerializer()
    expected = serde.loads_typed(serde.dumps_typed(value))
    assert back == expected
    assert type(back) is type(expected)


def test_small_values_are_stored_like_the_stock_saver() -> None:
    serde = JsonPlusSerializer()
    for value in ([1, 2, 3], {"a": "b"}, "x" * 100, [f"i{i}" for i in range(20)]):
        enc = ArtifactCodec(ArtifactConfig(threshold=1024)).encode(serde, value)
        assert (enc.type, enc.data) == serde.dumps_typed(value)
        assert not enc.artifacts


def test_one_codec_alternating_plain_and_encrypting_serdes() -> None:
    """The codec remembers whether the last serde it saw encrypts (issue 14: the
    EncryptedSerializer isinstance check is a Protocol check). A saver and its
    with_allowlist/bind clones share one codec with different serdes: each value must
    still be encoded the way its own serde asks, small or offloaded."""
    codec = ArtifactCodec(ArtifactConfig(threshold=64))
    codec.digest.set(b"s" * 32)  # the database's digest secret, as a saver loads it (digest27)
    plain = JsonPlusSerializer()
    secret = EncryptedSerializer.from_pycryptodome_aes(key=b"0123456789abcdef")
    for _ in range(2):
        for serde in (plain, secret, plain, secret):
            small = codec.encode(serde, "hello")
            assert small.type == serde.dumps_typed("hello")[0] and not small.artifacts
            assert serde.loads_typed((small.type, small.data)) == "hello"
            if serde is secret:
                assert "+" in small.type and b"hello" not in small.data  # encrypted
            else:
                assert small.data == plain.dumps_typed("hello")[1]
            large = codec.encode(serde, "x" * 500)
            assert large.type == REF_TYPE and len(large.artifacts) == 1
            (content,) = large.artifacts.values()
            key = next(iter(large.artifacts))
            # Plain and encrypting digests live in separate namespaces (_space).
            other = codec.encode(plain if serde is secret else secret, "x" * 500)
            assert key not in other.artifacts
            assert b"x" * 100 in content


def test_threshold_none_and_zero() -> None:
    value = [big(i) for i in range(3)]
    enc, back = _round_trip(value, threshold=None)
    assert enc.type != REF_TYPE and back == value
    for v in ([], {}, 1, "a", None, [None]):
        enc, back = _round_trip(v, threshold=0)
        assert enc.type == REF_TYPE and back == v


def test_delta_snapshot_is_split_like_its_list() -> None:
    items = [big(i) for i in range(20)]
    enc, back = _round_trip(_DeltaSnapshot(items))
    assert isinstance(back, _DeltaSnapshot) and back.value == items
    plain = ArtifactCodec(ArtifactConfig(threshold=256)).encode(JsonPlusSerializer(), items)
    # Same elements, same chunk: a snapshot costs one envelope, not another copy.
    assert set(enc.artifacts) == set(plain.artifacts)


def test_growing_list_reuses_chunks_and_elements() -> None:
    codec = ArtifactCodec(ArtifactConfig(threshold=256))
    serde = JsonPlusSerializer()
    seen: set[bytes] = set()
    new_per_step = []
    items: list[str] = []
    for i in range(48):
        items = [*items, big(i)]
        enc = codec.encode(serde, items)
        new_per_step.append(len(set(enc.artifacts) - seen))
        seen |= set(enc.artifacts)
    # One new element per step, plus one chunk artifact every 16th step.
    assert max(new_per_step) == 2 and sum(new_per_step) == 48 + 3
    elements, chunks = envelope_refs(enc.data)
    assert len(chunks) == 3 and not elements
    children = set().union(*(chunk_refs(codec.cache.get(c) or enc.artifacts[c])[0] for c in chunks))
    assert len(children) == 48


def test_config_is_validated() -> None:
    with pytest.raises(ConfigurationError):
        ArtifactConfig(threshold=-1)
    with pytest.raises(ConfigurationError):
        ArtifactConfig(compression_level=99)
    with pytest.raises(ConfigurationError):
        ArtifactConfig(chunk_size=1)
    with pytest.raises(ConfigurationError):
        DurablePostgresSaver("postgresql://unused", artifact_threshold="big")  # type: ignore[arg-type]


def test_unserializable_value_is_a_typed_error() -> None:
    codec = ArtifactCodec(ArtifactConfig(threshold=64))
    with pytest.raises(SerializationError) as info:
        codec.encode(JsonPlusSerializer(), [big(1), object()])
    assert info.value.value_type == "list"


# --------------------------------------------------------------------------- saver


@pytest.fixture
def store(dsn: str) -> Iterator[DurablePostgresSaver]:
    with DurablePostgresSaver.from_conn_string(dsn, artifact_threshold=256) as s:
        yield s


def _count(dsn: str, sql: str, *args: Any) -> int:
    with psycopg.connect(dsn) as conn:
        return int(conn.execute(sql, args).fetchone()[0])  # type: ignore[index]


def _cfg(thread: str, ns: str = "") -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ns}}


def _put(saver: Any, thread: str, values: dict[str, Any], parent: dict[str, Any] | None = None) -> Any:
    cp = empty_checkpoint()
    cp["channel_values"] = values
    versions = {k: saver.get_next_version(None, None) for k in values}
    cp["channel_versions"] = versions
    cfg = parent or _cfg(thread)
    return saver.put(cfg, cp, {"source": "update", "step": 0, "parents": {}}, versions)


class Chat(TypedDict, total=False):
    messages: Annotated[list[Any], operator.add]
    turn: int


def _chat_graph(saver: Any) -> Any:
    def chat(s: Chat) -> dict[str, Any]:
        i = s["turn"]
        cls = HumanMessage if i % 2 == 0 else AIMessage
        return {"messages": [cls(content=big(f"m{i}", 1500), id=f"m{i}")]}

    g = StateGraph(Chat)
    g.add_node("chat", chat)
    g.add_edge(START, "chat")
    g.add_edge("chat", END)
    return g.compile(checkpointer=saver)


def test_value_in_blob_and_write_is_stored_once(store: DurablePostgresSaver, dsn: str) -> None:
    thread = f"once-{uuid.uuid4().hex[:6]}"
    docs = [big(f"doc{i}") for i in range(3)]
    saved = _put(store, thread, {"docs": docs})
    store.put_writes(saved, [("docs", [docs[0]]), ("docs", docs[1])], "task-1")
    n = _count(
        dsn,
        "SELECT count(*) FROM durable_artifacts a JOIN durable_artifact_refs r USING (digest) "
        "WHERE r.thread_id = %s",
        thread,
    )
    assert n == 3
    fresh = _fresh(dsn)
    tup = fresh.get_tuple(saved)
    assert tup is not None and tup.checkpoint["channel_values"]["docs"] == docs
    assert [w[1:] for w in tup.pending_writes or []] == [("docs", [docs[0]]), ("docs", docs[1])]


_OPEN: list[Any] = []


def _fresh(dsn: str, **options: Any) -> DurablePostgresSaver:
    """A saver with an empty artifact cache (closed at module teardown)."""
    cm = DurablePostgresSaver.from_conn_string(dsn, artifact_threshold=256, **options)
    saver = cm.__enter__()
    _OPEN.append(cm)
    return saver


@pytest.fixture(scope="module", autouse=True)
def _close_fresh() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().__exit__(None, None, None)


def test_chat_stores_each_message_once_and_loads(store: DurablePostgresSaver, dsn: str) -> None:
    thread = f"chat-{uuid.uuid4().hex[:6]}"
    graph = _chat_graph(store)
    cfg = _cfg(thread)
    for i in range(34):
        graph.invoke({"turn": i}, cfg, durability="sync")
    arts = _count(
        dsn,
        "SELECT count(*) FROM durable_artifacts a JOIN durable_artifact_refs r USING (digest) "
        "WHERE r.thread_id = %s",
        thread,
    )
    assert arts == 34 + 2  # one per message, one per full chunk of 16
    fresh = _fresh(dsn)
    values = _chat_graph(fresh).get_state(cfg).values
    assert values == graph.get_state(cfg).values
    assert [m.id for m in values["messages"]] == [f"m{i}" for i in range(34)]
    history = list(fresh.list(cfg))
    assert len(history) == 34 * 3
    assert len(history[-2].checkpoint["channel_values"].get("messages", [])) == 0


def test_shared_value_across_threads_is_stored_once(store: DurablePostgresSaver, dsn: str) -> None:
    tag = uuid.uuid4().hex[:6]
    shared = [big(f"shared-{tag}-{i}") for i in range(5)]
    for t in range(4):
        _put(store, f"share-{tag}-{t}", {"sources": shared, "mine": big(f"mine-{tag}-{t}")})
    assert (
        _count(
            dsn,
            "SELECT count(DISTINCT digest) FROM durable_artifact_refs WHERE thread_id LIKE %s",
            f"share-{tag}-%",
        )
        == 5 + 4
    )


def test_corrupted_artifact_names_thread_and_checkpoint(store: DurablePostgresSaver, dsn: str) -> None:
    thread = f"corrupt-{uuid.uuid4().hex[:6]}"
    first = _put(store, thread, {"doc": big("v1")})
    second = _put(store, thread, {"doc": big("v2")}, parent=first)
    digest = _digest_of(dsn, big("v1"), thread)
    codec = ArtifactCodec()
    with psycopg.connect(dsn) as conn:
        # Valid zstd of other content: only the hash check can tell.
        conn.execute(
            "UPDATE durable_artifacts SET data = %s WHERE digest = %s",
            (codec.compress(b"E" + b"msgpack\x00" + b"\xa5other"), digest),
        )
    with pytest.raises(ArtifactIntegrityError) as info:
        _fresh(dsn).get_tuple(first)
    err = info.value
    assert (err.thread_id, err.checkpoint_id) == (thread, first["configurable"]["checkpoint_id"])
    assert err.digest == digest.hex() and err.actual and err.actual != err.digest
    assert isinstance(err, CheckpointLoadError)
    # list() loads both: the error names the checkpoint that needs the bad artifact.
    with pytest.raises(ArtifactIntegrityError) as info:
        list(_fresh(dsn).list(_cfg(thread)))
    assert info.value.checkpoint_id == first["configurable"]["checkpoint_id"]
    # The newer checkpoint does not need it and still loads.
    tup = _fresh(dsn).get_tuple(second)
    assert tup is not None and tup.checkpoint["channel_values"]["doc"] == big("v2")
    # Bytes that are not even zstd: the same typed error.
    with psycopg.connect(dsn) as conn:
        conn.execute("UPDATE durable_artifacts SET data = %s WHERE digest = %s", (b"garbage", digest))
    with pytest.raises(ArtifactIntegrityError) as info:
        _fresh(dsn).get_tuple(first)
    assert "undecodable" in info.value.actual


def _digest_of(dsn: str, value: Any, thread: str) -> bytes:
    enc = ArtifactCodec(ArtifactConfig(threshold=256)).encode(JsonPlusSerializer(), value)
    (digest,) = enc.artifacts
    assert _count(dsn, "SELECT count(*) FROM durable_artifact_refs WHERE thread_id = %s AND digest = %s", thread, digest) == 1
    return digest


def test_deleted_artifact_is_not_found_never_silent(store: DurablePostgresSaver, dsn: str) -> None:
    thread = f"gone-{uuid.uuid4().hex[:6]}"
    graph = _chat_graph(store)
    cfg = _cfg(thread)
    for i in range(3):
        graph.invoke({"turn": i}, cfg, durability="sync")
    digest = _digest_of(dsn, HumanMessage(content=big("m0", 1500), id="m0"), thread)
    with psycopg.connect(dsn) as conn:
        # The foreign key refuses to delete a referenced artifact: drop the references
        # first, as a bug or a hand-made DELETE would.
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            conn.execute("DELETE FROM durable_artifacts WHERE digest = %s", (digest,))
        conn.rollback()
        conn.execute("DELETE FROM durable_artifact_refs WHERE digest = %s", (digest,))
        conn.execute("DELETE FROM durable_artifacts WHERE digest = %s", (digest,))
    fresh = _fresh(dsn)
    with pytest.raises(ArtifactNotFoundError) as info:
        fresh.get_tuple(cfg)
    head = graph.get_state(cfg).config["configurable"]["checkpoint_id"]
    assert (info.value.thread_id, info.value.checkpoint_id) == (thread, head)
    assert info.value.digest == digest.hex()
    with pytest.raises(ArtifactNotFoundError):
        _chat_graph(_fresh(dsn)).get_state(cfg)


def test_cache_smaller_than_a_checkpoint(store: DurablePostgresSaver, dsn: str) -> None:
    thread = f"tiny-{uuid.uuid4().hex[:6]}"
    docs = [big(f"tiny{i}", 4096) for i in range(40)]
    saved = _put(store, thread, {"docs": docs})
    fresh = _fresh(dsn, artifact_cache_bytes=5000)
    tup = fresh.get_tuple(saved)
    assert tup is not None and tup.checkpoint["channel_values"]["docs"] == docs
    assert fresh.codec.cache.size <= 5000


def test_write_retried_when_a_known_artifact_was_collected(store: DurablePostgresSaver, dsn: str) -> None:
    thread = f"retry-{uuid.uuid4().hex[:6]}"
    doc = big("retry-doc")
    first = _put(store, thread, {"doc": doc})
    digest = _digest_of(dsn, doc, thread)
    # Another process pruned the thread's references and collected the artifact; this
    # process still remembers it as stored and sends no data for it.
    with psycopg.connect(dsn) as conn:
        conn.execute("DELETE FROM durable_artifact_refs WHERE thread_id = %s", (thread,))
        conn.execute("DELETE FROM durable_artifacts WHERE digest = %s", (digest,))
    assert store._known_refs.unknown(thread, [digest]) == []
    second = _put(store, thread, {"doc": doc}, parent=first)
    tup = _fresh(dsn).get_tuple(second)
    assert tup is not None and tup.checkpoint["channel_values"]["doc"] == doc
    assert _count(dsn, "SELECT count(*) FROM durable_artifacts WHERE digest = %s", digest) == 1


def test_nothing_half_written_on_bad_value(store: DurablePostgresSaver, dsn: str) -> None:
    thread = f"bad-{uuid.uuid4().hex[:6]}"
    before = _count(dsn, "SELECT count(*) FROM durable_artifacts")
    with pytest.raises(SerializationError):
        _put(store, thread, {"docs": [big("ok"), object()]})
    assert _count(dsn, "SELECT count(*) FROM checkpoints WHERE thread_id = %s", thread) == 0
    assert _count(dsn, "SELECT count(*) FROM durable_artifacts") == before


# --------------------------------------------------------------------------- serializers


def test_encrypted_serializer_dedups_and_encrypts_at_rest(dsn: str) -> None:
    serde = EncryptedSerializer.from_pycryptodome_aes(key=b"0123456789abcdef")
    thread = f"enc-{uuid.uuid4().hex[:6]}"
    marker = "PLAINTEXT-MARKER-" + uuid.uuid4().hex
    with DurablePostgresSaver.from_conn_string(dsn, serde=serde, artifact_threshold=256) as saver:
        graph = _chat_graph(saver)
        cfg = _cfg(thread)
        for i in range(20):
            graph.invoke({"turn": i}, cfg, durability="sync")
        saver.put_writes(graph.get_state(cfg).config, [("messages", [marker + big("w")])], "t")
        expected = graph.get_state(cfg).values
    # Random nonces did not defeat dedup: one artifact per message, one chunk.
    n = _count(dsn, "SELECT count(*) FROM durable_artifact_refs WHERE thread_id = %s", thread)
    assert n == 20 + 1 + 1
    with psycopg.connect(dsn) as conn:
        stored = b"".join(
            bytes(r[0])
            for r in conn.execute(
                "SELECT data FROM durable_artifacts a JOIN durable_artifact_refs r USING (digest) "
                "WHERE r.thread_id = %s UNION ALL SELECT blob FROM checkpoint_writes WHERE thread_id = %s "
                "UNION ALL SELECT blob FROM checkpoint_blobs WHERE thread_id = %s",
                (thread, thread, thread),
            )
        )
    assert marker.encode() not in stored and big("m3", 1500)[:64].encode() not in stored
    with DurablePostgresSaver.from_conn_string(dsn, serde=serde, artifact_threshold=256) as fresh:
        assert _chat_graph(fresh).get_state(cfg).values == expected
    # Without the key: a typed error naming the thread, not wrong state (issue 27: the
    # key's DecryptionError, not a CheckpointLoadError: nothing is damaged, no quarantine).
    with DurablePostgresSaver.from_conn_string(dsn, artifact_threshold=256) as nokey:
        with pytest.raises(DecryptionError) as info:
            nokey.get_tuple(cfg)
    assert info.value.thread_id == thread


@dataclass
class Finding:
    title: str
    body: str


def test_strict_msgpack_and_allowlist(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lg_msgpack, "STRICT_MSGPACK_ENABLED", True)
    strict = JsonPlusSerializer()
    value = [Finding(f"f{i}", big(f"finding{i}")) for i in range(3)]
    thread = f"strict-{uuid.uuid4().hex[:6]}"
    allow = [(Finding.__module__, Finding.__name__)]
    with DurablePostgresSaver.from_conn_string(dsn, serde=strict, artifact_threshold=256) as saver:
        allowed = saver.with_allowlist(allow)
        saved = _put(allowed, thread, {"findings": value})
        # The clone's serde (with the allowlist) reads the offloaded elements back.
        tup = allowed.get_tuple(saved)
        assert tup is not None and tup.checkpoint["channel_values"]["findings"] == value
    with DurablePostgresSaver.from_conn_string(dsn, serde=strict, artifact_threshold=256) as saver:
        # Without it, exactly what the strict serializer itself gives back (not an instance).
        tup = saver.get_tuple(saved)
        assert tup is not None
        expected = [strict.loads_typed(strict.dumps_typed(v)) for v in value]
        assert tup.checkpoint["channel_values"]["findings"] == expected
        assert not isinstance(expected[0], Finding)


# --------------------------------------------------------------------------- DeltaChannel


def _concat(state: list[Any], writes: list[list[Any]]) -> list[Any]:
    out = list(state)
    for w in writes:
        out.extend(w)
    return out


class DeltaChat(TypedDict, total=False):
    messages: Annotated[list[Any], DeltaChannel(_concat, snapshot_frequency=5)]
    turn: int


def test_delta_channel_history_with_offloaded_writes(store: DurablePostgresSaver, dsn: str) -> None:
    thread = f"delta-{uuid.uuid4().hex[:6]}"

    def chat(s: DeltaChat) -> dict[str, Any]:
        return {"messages": [AIMessage(content=big(f"d{s['turn']}", 1500), id=f"d{s['turn']}")]}

    g = StateGraph(DeltaChat)
    g.add_node("chat", chat)
    g.add_edge(START, "chat")
    g.add_edge("chat", END)
    graph = g.compile(checkpointer=store)
    cfg = _cfg(thread)
    for i in range(12):
        graph.invoke({"turn": i}, cfg, durability="sync")
    fresh = _fresh(dsn)
    values = g.compile(checkpointer=fresh).get_state(cfg).values
    assert [m.id for m in values["messages"]] == [f"d{i}" for i in range(12)]
    history = fresh.get_delta_channel_history(config=graph.get_state(cfg).config, channels=["messages"])
    writes = history["messages"]["writes"]
    assert writes and all(isinstance(w[2], list) for w in writes)
    # Snapshots reference the written messages: one artifact per message (no chunk yet).
    assert _count(dsn, "SELECT count(*) FROM durable_artifact_refs WHERE thread_id = %s", thread) == 12
    assert _count(dsn, "SELECT count(*) FROM checkpoint_blobs WHERE thread_id = %s AND type = %s", thread, REF_TYPE) >= 2


# --------------------------------------------------------------------------- async


async def test_async_saver_offloads_and_loads(dsn: str) -> None:
    thread = f"async-{uuid.uuid4().hex[:6]}"
    async with AsyncDurablePostgresSaver.from_conn_string(dsn, artifact_threshold=256) as saver:
        graph = _chat_graph(saver)
        cfg = _cfg(thread)
        for i in range(18):
            await graph.ainvoke({"turn": i}, cfg, durability="sync")
        state = await graph.aget_state(cfg)
    async with AsyncDurablePostgresSaver.from_conn_string(dsn, artifact_threshold=256) as fresh:
        again = await _chat_graph(fresh).aget_state(cfg)
        assert again.values == state.values and len(again.values["messages"]) == 18
        tuples = [t async for t in fresh.alist(cfg, limit=5)]
        assert len(tuples) == 5
    assert _count(dsn, "SELECT count(*) FROM durable_artifact_refs WHERE thread_id = %s", thread) == 18 + 1

