"""The sync saver against the same contract as the async one, plus the properties the
issue adds: ``"\\x00"`` in string channels, typed errors on bad input with nothing
half-written, thread safety, the async twins of the sync saver and the sync methods of
the async saver.

LangGraph's conformance suite only drives the async methods. To hold the *sync* API to
the same spec, ``SyncDriven`` routes every async method the suite calls through the
corresponding sync method (in a worker thread), and the whole suite runs against it.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import psycopg
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.report import CapabilityReport
from langgraph.checkpoint.conformance.test_utils import (
    generate_checkpoint,
    generate_config,
    generate_metadata,
)
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from psycopg.rows import dict_row

from langgraph_durable import (
    ArtifactIntegrityError,
    AsyncDurablePostgresSaver,
    CheckpointLoadError,
    DurableError,
    DurablePostgresSaver,
    SerializationError,
)


class SyncDriven(DurablePostgresSaver):
    """Each async method the conformance suite calls runs the *sync* method."""

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        items = await asyncio.to_thread(
            lambda: list(self.list(config, filter=filter, before=before, limit=limit))
        )
        for item in items:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)


def _assert_full_pass(report: CapabilityReport) -> None:
    counts = {c: (r.tests_passed, r.tests_failed, r.tests_skipped) for c, r in report.results.items()}
    print(f"\n{report.checkpointer_name} conformance (passed, failed, skipped): {counts}")
    assert len(report.results) == 8
    for cap, r in report.results.items():
        assert r.detected, cap
        assert r.tests_failed == 0, (cap, r.failures)
        assert r.tests_passed > 0 and r.passed is True, cap


async def test_conformance_through_sync_methods(dsn: str) -> None:
    @checkpointer_test(name="DurablePostgresSaver (sync methods)")
    async def factory() -> AsyncIterator[SyncDriven]:
        with SyncDriven.from_conn_string(dsn) as saver:
            yield cast(SyncDriven, saver)

    _assert_full_pass(await validate(factory))


async def test_conformance_async_twins_of_sync_saver(dsn: str) -> None:
    """The sync saver's own async methods (what an async graph on it calls)."""

    @checkpointer_test(name="DurablePostgresSaver (async twins)")
    async def factory() -> AsyncIterator[DurablePostgresSaver]:
        with DurablePostgresSaver.from_conn_string(dsn, artifact_threshold=0) as saver:
            yield saver

    _assert_full_pass(await validate(factory))


# --------------------------------------------------------------------------- helpers
def put_chain(
    saver: DurablePostgresSaver,
    thread_id: str,
    values: Sequence[dict[str, Any]],
    *,
    ns: str = "",
    metadata: Sequence[dict[str, Any]] | None = None,
) -> list[RunnableConfig]:
    """Put one checkpoint per entry of ``values`` (each a parent of the next); a
    channel gets a new version only when its value changes, as LangGraph does."""
    out: list[RunnableConfig] = []
    parent: RunnableConfig | None = None
    versions: dict[str, int] = {}
    current: dict[str, Any] = {}
    for i, vals in enumerate(values):
        new = {k: v for k, v in vals.items() if k not in current or current[k] != v}
        for k in new:
            versions[k] = versions.get(k, 0) + 1
        current.update(vals)
        cp = generate_checkpoint(
            channel_values=dict(current),
            channel_versions={k: str(v) for k, v in versions.items()},
        )
        cfg = generate_config(thread_id, checkpoint_ns=ns)
        if parent is not None:
            cfg["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
        md = generate_metadata(step=i, **(metadata[i] if metadata else {}))
        parent = saver.put(cfg, cp, md, {k: str(versions[k]) for k in new})
        out.append(parent)
    return out


def count_rows(dsn: str, thread_id: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        return {
            table: cast(
                tuple[int],
                conn.execute(
                    f"SELECT count(*) FROM {table} WHERE thread_id = %s", (thread_id,)
                ).fetchone(),
            )[0]
            for table in ("checkpoints", "checkpoint_blobs", "checkpoint_writes", "durable_artifact_refs")
        }


def all_ns(thread_id: str) -> RunnableConfig:
    """A config that lists every namespace of the thread."""
    return {"configurable": {"thread_id": thread_id}}


def cfg_of(thread_id: str, ns: str = "", checkpoint_id: str | None = None) -> RunnableConfig:
    return generate_config(thread_id, checkpoint_ns=ns, checkpoint_id=checkpoint_id)


# --------------------------------------------------------------------------- contract
def test_get_tuple_latest_by_id_missing_and_namespaces(saver: DurablePostgresSaver) -> None:
    big = {"rows": list(range(2000))}  # offloaded to an artifact
    configs = put_chain(
        saver,
        "gt",
        [
            {"s": "one", "n": 1, "f": 1.5, "b": True, "none": None, "d": {"k": [1, 2]}},
            {"s": "two", "big": big},
            {"s": "three"},
        ],
    )
    put_chain(saver, "gt", [{"s": "inner"}], ns="child:1")

    latest = saver.get_tuple(cfg_of("gt"))
    assert latest is not None
    assert latest.config["configurable"]["checkpoint_id"] == configs[-1]["configurable"]["checkpoint_id"]
    assert latest.parent_config is not None
    assert latest.parent_config["configurable"]["checkpoint_id"] == configs[1]["configurable"]["checkpoint_id"]
    # Channels that did not change at the last step come from their older versions.
    assert latest.checkpoint["channel_values"] == {
        "s": "three", "n": 1, "f": 1.5, "b": True, "none": None, "d": {"k": [1, 2]}, "big": big,
    }
    first = saver.get_tuple(configs[0])
    assert first is not None and first.checkpoint["channel_values"]["s"] == "one"
    assert first.parent_config is None
    inner = saver.get_tuple(cfg_of("gt", "child:1"))
    assert inner is not None and inner.checkpoint["channel_values"] == {"s": "inner"}
    assert saver.get_tuple(cfg_of("no-such-thread")) is None
    assert saver.get_tuple(cfg_of("gt", checkpoint_id="1f000000-0000-6000-8000-000000000000")) is None


def test_list_filter_before_limit(saver: DurablePostgresSaver) -> None:
    configs = put_chain(
        saver,
        "ls",
        [{"i": i} for i in range(5)],
        metadata=[{"source": "input" if i == 0 else "loop", "user": f"u{i % 2}"} for i in range(5)],
    )
    put_chain(saver, "ls-other", [{"i": 0}], metadata=[{"user": "u1", "source": "loop"}])
    ids = [c["configurable"]["checkpoint_id"] for c in configs]

    listed = [t.config["configurable"]["checkpoint_id"] for t in saver.list(cfg_of("ls"))]
    assert listed == ids[::-1]
    assert [t.checkpoint["channel_values"]["i"] for t in saver.list(cfg_of("ls"), limit=2)] == [4, 3]
    before = [t.config["configurable"]["checkpoint_id"] for t in saver.list(cfg_of("ls"), before=configs[2])]
    assert before == ids[:2][::-1]
    assert [t.metadata["step"] for t in saver.list(cfg_of("ls"), filter={"user": "u1"})] == [3, 1]
    assert [t.metadata["step"] for t in saver.list(cfg_of("ls"), filter={"source": "input"})] == [0]
    across = {t.config["configurable"]["thread_id"] for t in saver.list(None, filter={"user": "u1"})}
    assert {"ls", "ls-other"} <= across
    assert list(saver.list(cfg_of("ls"), filter={"user": "nobody"})) == []


def test_put_writes_task_path_order_and_idempotence(saver: DurablePostgresSaver) -> None:
    assert "task_path" in inspect.signature(DurablePostgresSaver.put_writes).parameters
    assert "task_path" in inspect.signature(AsyncDurablePostgresSaver.aput_writes).parameters
    (cfg,) = put_chain(saver, "pw", [{"x": 1}])
    saver.put_writes(cfg, [("a", "from-b-1"), ("b", "from-b-2")], "task-b", task_path="~1")
    saver.put_writes(cfg, [("a", "from-a")], "task-a", task_path="~2")
    saver.put_writes(cfg, [("a", {"nested": [1, 2, 3]})], "task-c", task_path="~0")
    # Retried writes (LangGraph resubmits after a failure) must not duplicate.
    saver.put_writes(cfg, [("a", "from-a")], "task-a", task_path="~2")
    saver.put_writes(cfg, [("__error__", "boom")], "task-d", task_path="~3")
    saver.put_writes(cfg, [("__error__", "boom again")], "task-d", task_path="~3")
    tup = saver.get_tuple(cfg)
    assert tup is not None
    assert tup.pending_writes == [
        ("task-c", "a", {"nested": [1, 2, 3]}),
        ("task-b", "a", "from-b-1"),
        ("task-b", "b", "from-b-2"),
        ("task-a", "a", "from-a"),
        ("task-d", "__error__", "boom again"),  # special channels are upserted
    ]
    saver.put_writes(cfg, [], "task-e")  # nothing to write is not an error
    assert count_rows(saver_dsn(saver), "pw")["checkpoint_writes"] == 5


def saver_dsn(saver: DurablePostgresSaver) -> str:
    return str(cast(Any, saver.conn).conninfo)


def test_delete_thread_removes_everything_of_that_thread_only(saver: DurablePostgresSaver) -> None:
    dsn = saver_dsn(saver)
    for tid in ("del-a", "del-b"):
        configs = put_chain(saver, tid, [{"v": "x"}, {"v": "y", "big": list(range(3000))}])
        saver.put_writes(configs[-1], [("v", "z")], "t1")
        put_chain(saver, tid, [{"v": "sub"}], ns="sub:1")
    assert all(count_rows(dsn, "del-a").values())
    saver.delete_thread("del-a")
    assert count_rows(dsn, "del-a") == dict.fromkeys(count_rows(dsn, "del-a"), 0)
    assert saver.get_tuple(cfg_of("del-a")) is None
    kept = saver.get_tuple(cfg_of("del-b"))
    assert kept is not None and kept.checkpoint["channel_values"]["big"] == list(range(3000))
    assert kept.pending_writes == [("t1", "v", "z")]


def test_delete_for_runs(saver: DurablePostgresSaver) -> None:
    configs = put_chain(
        saver, "dfr", [{"i": i} for i in range(4)],
        metadata=[{"run_id": r} for r in ("run-1", "run-1", "run-2", "run-3")],
    )
    saver.put_writes(configs[1], [("i", 99)], "t")
    saver.delete_for_runs(["run-1", "run-3"])
    left = list(saver.list(cfg_of("dfr")))
    assert [t.metadata["run_id"] for t in left] == ["run-2"]
    assert count_rows(saver_dsn(saver), "dfr")["checkpoint_writes"] == 0
    saver.delete_for_runs([])  # a no-op, not an error


def test_copy_thread(saver: DurablePostgresSaver) -> None:
    configs = put_chain(saver, "cp-src", [{"v": "a"}, {"v": "b", "big": ["x" * 50] * 100}])
    saver.put_writes(configs[-1], [("v", "pending")], "t1", task_path="p")
    put_chain(saver, "cp-src", [{"v": "inner"}], ns="sub:9")
    saver.copy_thread("cp-src", "cp-dst")
    src = list(saver.list(all_ns("cp-src")))
    dst = list(saver.list(all_ns("cp-dst")))
    assert [t.checkpoint for t in dst] == [t.checkpoint for t in src]
    assert [t.pending_writes for t in dst] == [t.pending_writes for t in src]
    assert {t.config["configurable"]["thread_id"] for t in dst} == {"cp-dst"}
    assert {t.config["configurable"]["checkpoint_ns"] for t in dst} == {"", "sub:9"}
    # The copy is independent: deleting the source leaves it whole.
    saver.delete_thread("cp-src")
    latest = saver.get_tuple(cfg_of("cp-dst"))
    assert latest is not None and latest.checkpoint["channel_values"]["big"] == ["x" * 50] * 100


def test_prune_keep_latest_and_delete(saver: DurablePostgresSaver) -> None:
    dsn = saver_dsn(saver)
    put_chain(saver, "pr-1", [{"v": i, "const": "kept", "big": list(range(2000))} for i in range(4)])
    put_chain(saver, "pr-1", [{"w": i} for i in range(3)], ns="sub:1")
    put_chain(saver, "pr-2", [{"v": i} for i in range(3)])
    saver.prune(["pr-1"], strategy="keep_latest")
    kept = list(saver.list(all_ns("pr-1")))
    assert sorted((t.config["configurable"]["checkpoint_ns"], t.metadata["step"]) for t in kept) == [("", 3), ("sub:1", 2)]
    # The survivor still loads whole: blobs of channels written at older steps stay.
    root = saver.get_tuple(cfg_of("pr-1"))
    assert root is not None
    assert root.checkpoint["channel_values"] == {"v": 3, "const": "kept", "big": list(range(2000))}
    assert len(list(saver.list(cfg_of("pr-2")))) == 3
    with psycopg.connect(dsn, autocommit=True) as conn:  # bookkeeping a delete must not orphan
        conn.execute(
            "INSERT INTO durable_threads (thread_id, status) VALUES ('pr-2', 'done') "
            "ON CONFLICT (thread_id) DO NOTHING"
        )
    saver.prune(["pr-1", "pr-2"], strategy="delete")
    for tid in ("pr-1", "pr-2"):
        assert set(count_rows(dsn, tid).values()) == {0}, tid
    with psycopg.connect(dsn) as conn:
        left = conn.execute(
            "SELECT count(*) FROM durable_threads WHERE thread_id IN ('pr-1', 'pr-2')"
        ).fetchone()
    assert left == (0,)
    with pytest.raises(TypeError):
        saver.prune("pr-1")
    with pytest.raises(ValueError):
        saver.prune(["pr-1"], strategy="bogus")


def test_get_next_version_matches_stock(saver: DurablePostgresSaver, dsn: str) -> None:
    """The compact form (issue 26, _chanver) counts as the stock one does; with
    ``compact_versions=False`` it is the stock form."""
    from langgraph_durable import _chanver

    with PostgresSaver.from_conn_string(dsn) as stock:
        v: str | None = None
        sv: str | None = None
        for _ in range(3):
            v = saver.get_next_version(v, None)
            sv = stock.get_next_version(sv, None)
            assert _chanver.is_compact(v) and _chanver.counter(v) == _chanver.counter(sv)
        saver.compact_versions = False
        try:
            plain = saver.get_next_version(sv, None)
        finally:
            saver.compact_versions = True
        assert plain.split(".")[0] == stock.get_next_version(sv, None).split(".")[0]
    assert v is not None and _chanver.counter(v) == 3


@dataclass
class Point:
    x: int
    y: int


def test_with_allowlist_clones_and_still_works(dsn: str) -> None:
    strict = JsonPlusSerializer(allowed_msgpack_modules=None)
    with DurablePostgresSaver.from_conn_string(dsn, serde=strict) as saver:
        clone = saver.with_allowlist([Point])
        assert clone is not saver and type(clone) is DurablePostgresSaver
        assert clone.serde is not saver.serde and saver.serde is strict
        assert clone.conn is saver.conn  # same pool, no second connection set
        (cfg,) = put_chain(clone, "allow", [{"p": Point(1, 2)}])
        clone.put_writes(cfg, [("p", Point(3, 4))], "t")
        tup = clone.get_tuple(cfg)
        assert tup is not None
        assert tup.checkpoint["channel_values"]["p"] == Point(1, 2)
        assert tup.pending_writes == [("t", "p", Point(3, 4))]
        # The original keeps its strict serializer: the type is refused (LangGraph
        # hands back the raw payload instead of constructing an unlisted class).
        raw = saver.get_tuple(cfg)
        assert raw is not None and not isinstance(raw.checkpoint["channel_values"]["p"], Point)
        # The clone's async twins use the clone's serializer too.
        again = asyncio.run(clone.aget_tuple(cfg))
        assert again is not None and again.checkpoint["channel_values"]["p"] == Point(1, 2)


# --------------------------------------------------------------------------- sync/async
def test_async_twins_callable_on_sync_saver(saver: DurablePostgresSaver) -> None:
    async def scenario() -> None:
        cfg = await saver.aput(cfg_of("twins"), generate_checkpoint(), generate_metadata(), {})
        await saver.aput_writes(cfg, [("c", 1)], "t", "path")
        tup = await saver.aget_tuple(cfg)
        assert tup is not None and tup.pending_writes == [("t", "c", 1)]
        assert [t.config async for t in saver.alist(cfg_of("twins"))] == [cfg]
        await saver.acopy_thread("twins", "twins-copy")
        await saver.aprune(["twins-copy"], strategy="keep_latest")
        await saver.adelete_for_runs(["nothing"])
        await saver.adelete_thread("twins")
        assert await saver.aget_tuple(cfg) is None
        assert await saver.aget_tuple(cfg_of("twins-copy")) is not None

    asyncio.run(scenario())


async def test_sync_methods_of_async_saver_from_another_thread(asaver: AsyncDurablePostgresSaver) -> None:
    def in_thread() -> tuple[Any, ...]:
        cfg = asaver.put(cfg_of("a-sync"), generate_checkpoint(channel_values={"v": "x"}, channel_versions={"v": "1"}), generate_metadata(), {"v": "1"})
        asaver.put_writes(cfg, [("v", "y")], "t", task_path="p")
        tup = asaver.get_tuple(cfg)
        listed = list(asaver.list(cfg_of("a-sync")))
        asaver.copy_thread("a-sync", "a-sync-copy")
        asaver.prune(["a-sync-copy"], strategy="keep_latest")
        asaver.delete_for_runs(["none"])
        asaver.delete_thread("a-sync-copy")
        return tup, listed, asaver.get_tuple(cfg_of("a-sync-copy"))

    tup, listed, gone = await asyncio.to_thread(in_thread)
    assert tup.checkpoint["channel_values"] == {"v": "x"} and tup.pending_writes == [("t", "v", "y")]
    assert len(listed) == 1 and gone is None
    # From the event loop's own thread a sync call would deadlock: it is refused.
    with pytest.raises(asyncio.InvalidStateError):
        asaver.get_tuple(cfg_of("a-sync"))


# --------------------------------------------------------------------------- "\x00"
NUL_VALUES = {"short": "a\x00b", "edge": "\x00", "long": "head\x00" + "y" * 5000, "nested": {"k": ["\x00"]}}


def test_nul_in_string_channel_round_trips(saver: DurablePostgresSaver) -> None:
    (cfg,) = put_chain(saver, "nul", [NUL_VALUES])
    saver.put_writes(cfg, [("short", "w\x00w")], "t")
    tup = saver.get_tuple(cfg)
    assert tup is not None
    assert tup.checkpoint["channel_values"] == NUL_VALUES
    assert tup.pending_writes == [("t", "short", "w\x00w")]


def test_stock_saver_fails_on_nul_in_string_channel(dsn: str) -> None:
    with PostgresSaver.from_conn_string(dsn) as stock:
        cp = generate_checkpoint(channel_values={"short": "a\x00b"}, channel_versions={"short": "1"})
        with pytest.raises(psycopg.errors.UntranslatableCharacter):
            stock.put(cfg_of("nul-stock"), cp, generate_metadata(), {"short": "1"})


# --------------------------------------------------------------------------- bad input
def test_unserializable_value_is_a_typed_error_and_nothing_is_written(saver: DurablePostgresSaver) -> None:
    dsn = saver_dsn(saver)
    (cfg,) = put_chain(saver, "bad", [{"ok": "fine"}])
    before = count_rows(dsn, "bad")
    cp = generate_checkpoint(
        channel_values={"ok": "fine", "big": list(range(3000)), "lock": threading.Lock()},
        channel_versions={"ok": "1", "big": "1", "lock": "1"},
    )
    with pytest.raises(SerializationError) as info:
        saver.put(cfg, cp, generate_metadata(step=1), {"big": "1", "lock": "1"})
    assert info.value.fields["value_type"] == "lock" and isinstance(info.value, DurableError)
    with pytest.raises(SerializationError):
        saver.put_writes(cfg, [("ok", "fine"), ("lock", threading.Lock())], "t")
    # Neither the checkpoint, nor the blob or artifact of the channel that did
    # serialize, nor the first write of the batch.
    assert count_rows(dsn, "bad") == before
    assert saver.get_tuple(cfg_of("bad", checkpoint_id=cp["id"])) is None


def _corrupt(dsn: str, sql: str, params: tuple[Any, ...]) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql, params).rowcount


def test_corrupted_blob_raises_checkpoint_load_error_naming_it(saver: DurablePostgresSaver) -> None:
    dsn = saver_dsn(saver)
    (cfg,) = put_chain(saver, "corrupt", [{"d": {"k": "v"}}])
    cid = cfg["configurable"]["checkpoint_id"]
    n = _corrupt(
        dsn,
        "UPDATE checkpoint_blobs SET blob = %s WHERE thread_id = %s AND channel = 'd'",
        (b"\xc1\xc1garbage", "corrupt"),
    )
    assert n == 1
    for read in (lambda: saver.get_tuple(cfg_of("corrupt")), lambda: list(saver.list(cfg_of("corrupt")))):
        with pytest.raises(CheckpointLoadError) as info:
            read()
        err = info.value
        assert err.fields == {"thread_id": "corrupt", "checkpoint_ns": "", "checkpoint_id": cid}
        assert vars(err)["checkpoint_id"] == cid  # fields are attributes too
        assert "corrupt" in str(err) and cid in str(err)


def test_corrupted_pending_write_and_artifact(saver: DurablePostgresSaver) -> None:
    dsn = saver_dsn(saver)
    (cfg,) = put_chain(saver, "corrupt-w", [{"x": 1}])
    saver.put_writes(cfg, [("x", {"a": 1})], "t")
    _corrupt(dsn, "UPDATE checkpoint_writes SET blob = %s WHERE thread_id = %s", (b"\xc1", "corrupt-w"))
    with pytest.raises(CheckpointLoadError) as info:
        saver.get_tuple(cfg)
    assert info.value.fields["thread_id"] == "corrupt-w"

    (cfg2,) = put_chain(saver, "corrupt-a", [{"big": "z" * 10_000}])
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        digests = [
            r["digest"]
            for r in conn.execute(
                "SELECT digest FROM durable_artifact_refs WHERE thread_id = %s", ("corrupt-a",)
            ).fetchall()
        ]
        assert digests
        # Valid zstd of other content: only the content hash can tell.
        import zstandard

        conn.execute(
            "UPDATE durable_artifacts SET data = %s WHERE digest = ANY(%s)",
            (zstandard.ZstdCompressor().compress(b"Eother"), digests),
        )
    saver.codec.cache.clear()
    with pytest.raises(ArtifactIntegrityError) as ainfo:
        saver.get_tuple(cfg2)
    assert isinstance(ainfo.value, CheckpointLoadError)
    assert ainfo.value.fields["checkpoint_id"] == cfg2["configurable"]["checkpoint_id"]


# --------------------------------------------------------------------------- threads
def _hammer(saver: DurablePostgresSaver, n_threads: int, n_puts: int, prefix: str) -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(n_threads)

    def work(i: int) -> None:
        try:
            barrier.wait()
            put_chain(
                saver,
                f"{prefix}-{i}",
                [{"i": i, "step": s, "blob": [i] * (s + 1), "big": [f"{i}-{s}"] * 300} for s in range(n_puts)],
            )
            saver.put_writes(
                saver.get_tuple(cfg_of(f"{prefix}-{i}")).config,  # type: ignore[union-attr]
                [("i", -i)],
                f"task-{i}",
            )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for i in range(n_threads):
        chain = list(saver.list(cfg_of(f"{prefix}-{i}")))
        assert len(chain) == n_puts
        for newer, older in zip(chain, chain[1:], strict=False):
            assert newer.parent_config is not None
            assert newer.parent_config["configurable"]["checkpoint_id"] == older.config["configurable"]["checkpoint_id"]
        latest = chain[0]
        assert latest.checkpoint["channel_values"] == {
            "i": i, "step": n_puts - 1, "blob": [i] * n_puts, "big": [f"{i}-{n_puts - 1}"] * 300,
        }
        assert latest.pending_writes == [(f"task-{i}", "i", -i)]


def test_many_threads_put_concurrently_on_one_pooled_saver(dsn: str) -> None:
    with DurablePostgresSaver.from_conn_string(dsn, pool_size=4) as saver:
        _hammer(saver, 16, 12, "pool")


def test_many_threads_put_concurrently_on_one_connection(dsn: str) -> None:
    with psycopg.Connection.connect(dsn, autocommit=True) as conn:
        saver = DurablePostgresSaver(conn)
        _hammer(saver, 8, 8, "conn")


@pytest.fixture
def saver(dsn: str) -> Iterator[DurablePostgresSaver]:
    with DurablePostgresSaver.from_conn_string(dsn) as s:
        yield s
