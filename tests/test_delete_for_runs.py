"""delete_for_runs (LangGraph Studio's rollback) cleans up after itself, on real
Postgres: no blob row is left that no remaining checkpoint uses, the threads' artifact
references are recomputed, so gc() frees what only the deleted run used, and what the
remaining checkpoints use stays and loads.

Each test works in a schema of its own (gc acts on every artifact in the tables).
"""

from __future__ import annotations

import random
import string
import uuid
from collections.abc import Iterator
from typing import Any, TypedDict

import psycopg
import pytest
from langgraph.graph import END, START, StateGraph

from langgraph_durable import AsyncDurablePostgresSaver, DurablePostgresSaver
from langgraph_durable.artifacts import ArtifactCodec
from langgraph_durable.ops.retention import agc, gc, recompute_refs

THRESHOLD = 256


def big(seed: object, size: int = 1200) -> str:
    rng = random.Random(str(seed))
    return "".join(rng.choices(string.ascii_letters + "     ", k=size))


KEEP = big("keep")  # written by every run of every thread: shared, must survive


class Inner(TypedDict, total=False):
    turn: int
    note: str


class State(TypedDict, total=False):
    turn: int
    keep: str
    scratch: str
    note: str


def _graph(saver: Any) -> Any:
    """step writes the shared value and a value of this run alone; a subgraph (its
    checkpoints live in their own namespace) writes another value of this run alone."""

    def inner_step(s: Inner) -> dict[str, Any]:
        return {"note": big(f"note-{s.get('turn')}-{uuid.uuid4().hex}")}

    inner = StateGraph(Inner)
    inner.add_node("inner_step", inner_step)
    inner.add_edge(START, "inner_step")
    inner.add_edge("inner_step", END)

    def step(s: State) -> dict[str, Any]:
        return {"keep": KEEP, "scratch": big(f"scratch-{s.get('turn')}-{uuid.uuid4().hex}")}

    g = StateGraph(State)
    g.add_node("step", step)
    g.add_node("sub", inner.compile())
    g.add_edge(START, "step")
    g.add_edge("step", "sub")
    g.add_edge("sub", END)
    return g.compile(checkpointer=saver)


def _cfg(thread: str, run: str | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": thread}
    if run is not None:
        conf["run_id"] = run
    return {"configurable": conf}


@pytest.fixture
def schema(dsn: str) -> str:
    return "dfr_" + uuid.uuid4().hex[:10]


@pytest.fixture
def saver(dsn: str, schema: str) -> Iterator[DurablePostgresSaver]:
    with DurablePostgresSaver.from_conn_string(dsn, schema=schema, artifact_threshold=THRESHOLD) as s:
        s.setup()
        yield s


def _q(dsn: str, schema: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("SET search_path TO {}").format(psycopg.sql.Identifier(schema)))
        cur = conn.execute(sql, args)
        return cur.fetchall() if cur.description else []


def _n(dsn: str, schema: str, sql: str, *args: Any) -> int:
    return int(_q(dsn, schema, sql, *args)[0][0])


ORPHAN_BLOBS_SQL = """
SELECT count(*) FROM checkpoint_blobs b WHERE b.thread_id = %s AND NOT EXISTS (
    SELECT 1 FROM checkpoints c
    WHERE c.thread_id = b.thread_id AND c.checkpoint_ns = b.checkpoint_ns
      AND c.checkpoint -> 'channel_versions' ->> b.channel = b.version)
"""


def _refs(dsn: str, schema: str, thread: str) -> set[bytes]:
    rows = _q(dsn, schema, "SELECT digest FROM durable_artifact_refs WHERE thread_id = %s", thread)
    return {bytes(r[0]) for r in rows}


def _artifacts(dsn: str, schema: str) -> set[bytes]:
    return {bytes(r[0]) for r in _q(dsn, schema, "SELECT digest FROM durable_artifacts")}


def _blob_digests(dsn: str, schema: str, thread: str, channel: str) -> dict[tuple[str, str], set[bytes]]:
    """(namespace, version) -> the artifacts a channel's blob rows reference."""
    rows = _q(
        dsn, schema,
        "SELECT checkpoint_ns, version, type, blob FROM checkpoint_blobs "
        "WHERE thread_id = %s AND channel = %s AND blob IS NOT NULL",
        thread, channel,
    )
    return {(ns, v): ArtifactCodec.digests_in(t, bytes(b)) for ns, v, t, b in rows}


def _loads_everything(dsn: str, schema: str, thread: str) -> list[Any]:
    """Every checkpoint of the thread, every namespace, decodes on a cold cache, and
    each names only blobs that exist."""
    with DurablePostgresSaver.from_conn_string(dsn, schema=schema, artifact_threshold=THRESHOLD) as fresh:
        namespaces = [r[0] for r in _q(
            dsn, schema, "SELECT DISTINCT checkpoint_ns FROM checkpoints WHERE thread_id = %s", thread
        )]
        tuples = []
        for ns in namespaces:
            cfg = {"configurable": {"thread_id": thread, "checkpoint_ns": ns}}
            for t in fresh.list(cfg):
                values = t.checkpoint["channel_values"]
                assert isinstance(values, dict)
                # Every channel with a version and a stored blob came back.
                for ch in t.checkpoint["channel_versions"]:
                    stored = _n(
                        dsn, schema,
                        "SELECT count(*) FROM checkpoint_blobs WHERE thread_id = %s AND "
                        "checkpoint_ns = %s AND channel = %s AND version = %s AND type <> 'empty'",
                        thread, ns, ch, str(t.checkpoint["channel_versions"][ch]),
                    )
                    if stored:
                        assert ch in values, (ns, ch)
                tuples.append(t)
        return tuples


def test_rollback_leaves_no_orphan_blobs_and_gc_frees_what_the_run_alone_used(
    dsn: str, schema: str, saver: DurablePostgresSaver
) -> None:
    graph = _graph(saver)
    graph.invoke({"turn": 0}, _cfg("t", "run-1"), durability="sync")
    after_first = graph.get_state(_cfg("t")).values
    # Another thread uses the shared value too.
    graph.invoke({"turn": 9}, _cfg("other", "run-o"), durability="sync")
    other_before = graph.get_state(_cfg("other")).values

    scratch_before = _blob_digests(dsn, schema, "t", "scratch")
    note_before = _blob_digests(dsn, schema, "t", "note")
    graph.invoke({"turn": 1}, _cfg("t", "run-2"), durability="sync")
    assert graph.get_state(_cfg("t")).values["scratch"] != after_first["scratch"]
    namespaces = {r[0] for r in _q(
        dsn, schema, "SELECT DISTINCT checkpoint_ns FROM checkpoints WHERE metadata ->> 'run_id' = 'run-2'"
    )}
    assert "" in namespaces and len(namespaces) >= 2  # the subgraph's checkpoints too
    # What run 2 alone used: artifacts of its new scratch and note blob rows that no
    # blob row of run 1 names (its subgraph's input carries run 1's note: shared).
    kept = set().union(*scratch_before.values(), *note_before.values())
    run2 = set().union(*(
        d for key, d in _blob_digests(dsn, schema, "t", "scratch").items() if key not in scratch_before
    ), *(
        d for key, d in _blob_digests(dsn, schema, "t", "note").items() if key not in note_before
    )) - kept
    assert len(run2) >= 2 and kept  # a new scratch and a new note at least
    refs_before = _refs(dsn, schema, "t")
    assert run2 <= refs_before

    saver.delete_for_runs(["run-2"])

    assert _n(dsn, schema, "SELECT count(*) FROM checkpoints WHERE metadata ->> 'run_id' = 'run-2'") == 0
    assert _n(dsn, schema, ORPHAN_BLOBS_SQL, "t") == 0
    assert _n(dsn, schema, ORPHAN_BLOBS_SQL, "other") == 0
    # The blobs of run 1 are all still there.
    assert _blob_digests(dsn, schema, "t", "scratch") == scratch_before
    assert _blob_digests(dsn, schema, "t", "note") == note_before
    # References: exactly what the remaining rows need (recompute finds nothing to drop).
    refs_after = _refs(dsn, schema, "t")
    assert not (run2 & refs_after) and kept <= refs_after
    assert recompute_refs(saver, ["t"]) == 0

    assert graph.get_state(_cfg("t")).values == after_first
    loaded = _loads_everything(dsn, schema, "t")
    assert loaded and all(t.metadata.get("run_id") != "run-2" for t in loaded)

    freed = gc(saver, grace=0)
    assert freed.artifacts >= len(run2)
    left = _artifacts(dsn, schema)
    assert not (run2 & left)
    assert refs_after <= left and _refs(dsn, schema, "other") <= left
    with DurablePostgresSaver.from_conn_string(dsn, schema=schema, artifact_threshold=THRESHOLD) as fresh:
        again = _graph(fresh)
        assert again.get_state(_cfg("t")).values == after_first
        assert again.get_state(_cfg("other")).values == other_before
        assert again.get_state(_cfg("t")).values["keep"] == KEEP
    assert len(_loads_everything(dsn, schema, "t")) == len(loaded)
    assert gc(saver, grace=0).artifacts == 0

    # The thread carries on from run 1's head.
    out = graph.invoke({"turn": 2}, _cfg("t", "run-3"), durability="sync")
    assert out["keep"] == KEEP and out["turn"] == 2


def test_deleting_several_runs_across_threads_and_unknown_runs(
    dsn: str, schema: str, saver: DurablePostgresSaver
) -> None:
    graph = _graph(saver)
    for thread in ("a", "b"):
        for i in range(3):
            graph.invoke({"turn": i}, _cfg(thread, f"{thread}-run-{i}"), durability="sync")
    heads = {t: graph.get_state(_cfg(t)).values for t in ("a", "b")}
    saver.delete_for_runs(["a-run-1", "b-run-2", "a-run-2", "no-such-run"])
    for thread in ("a", "b"):
        assert _n(dsn, schema, ORPHAN_BLOBS_SQL, thread) == 0
        assert recompute_refs(saver, [thread]) == 0
        assert _loads_everything(dsn, schema, thread)
    left_runs = {r[0] for r in _q(dsn, schema, "SELECT DISTINCT metadata ->> 'run_id' FROM checkpoints")}
    assert left_runs == {"a-run-0", "b-run-0", "b-run-1"}
    gc(saver, grace=0)
    assert graph.get_state(_cfg("b")).values["turn"] == 1
    assert graph.get_state(_cfg("a")).values["turn"] == 0
    assert heads["a"]["keep"] == graph.get_state(_cfg("a")).values["keep"] == KEEP
    saver.delete_for_runs(["no-such-run"])  # nothing to do, not an error
    saver.delete_for_runs([])


async def test_adelete_for_runs(dsn: str, schema: str) -> None:
    async with AsyncDurablePostgresSaver.from_conn_string(
        dsn, schema=schema, artifact_threshold=THRESHOLD
    ) as asaver:
        await asaver.asetup()
        graph = _graph(asaver)
        await graph.ainvoke({"turn": 0}, _cfg("as", "as-1"), durability="sync")
        first = (await graph.aget_state(_cfg("as"))).values
        await graph.ainvoke({"turn": 1}, _cfg("as", "as-2"), durability="sync")
        refs_before = _refs(dsn, schema, "as")
        await asaver.adelete_for_runs(["as-2"])
        assert _n(dsn, schema, ORPHAN_BLOBS_SQL, "as") == 0
        refs_after = _refs(dsn, schema, "as")
        assert refs_after < refs_before
        report = await agc(asaver, grace=0)
        assert report.artifacts == len(refs_before - refs_after)
        assert refs_after <= _artifacts(dsn, schema)
        assert (await graph.aget_state(_cfg("as"))).values == first
    assert _loads_everything(dsn, schema, "as")
