"""Issue 11, defects 13 and 14, on a real PostgreSQL: damaged rows and raw errors.

13. Stored bytes damaged in several ways (garbage in a blob, an envelope with a bad
    msgpack type tag, truncated zstd in an artifact, an unknown type tag, checkpoint or
    metadata JSON of the wrong shape): every read raises ``CheckpointLoadError`` naming
    thread and checkpoint, a run start quarantines, and retention, ``recompute_refs``
    and the CLI (stats, threads list/show/history) skip and report the damaged thread
    and go on with the others.
14. What used to reach users raw (psycopg's DataError, UnicodeEncodeError,
    InvalidTextRepresentation, QueryCanceled, a SerializationError saying "type dict")
    is a typed ``DurableError`` naming thread, checkpoint and the path inside the
    state, raised before anything is written, the original as ``__cause__``. A fenced
    write logs no psycopg warning; ``copy_thread`` into an existing thread is refused.
"""

from __future__ import annotations

import json
import logging
import operator
import pickle
import threading
from collections.abc import Iterator
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, StateGraph
from psycopg.rows import dict_row
from typer.testing import CliRunner

from langgraph_durable import (
    CheckpointLoadError,
    DurableError,
    DurablePostgresSaver,
    InvalidThreadIdError,
    PoisonCheckpointError,
    SerializationError,
    StatementCanceledError,
    ThreadBusyError,
    ThreadExistsError,
    UnencodableValueError,
)
from langgraph_durable._values import find_unencodable, serializer_reject, text_reject
from langgraph_durable.cli import app
from langgraph_durable.ops import inspection as lgi
from langgraph_durable.ops import retention

runner = CliRunner()


class S(TypedDict, total=False):
    docs: Annotated[list[Any], operator.add]
    s: str
    n: int
    tags: list[str]


def cfg(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id}}


def rows(dsn: str, sql: str, *args: Any) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        cur = conn.execute(sql, args)
        return cur.fetchall() if cur.description else []


def counts(dsn: str, thread_id: str) -> dict[str, int]:
    return {
        t: rows(dsn, f"SELECT count(*)::int AS n FROM {t} WHERE thread_id = %s", thread_id)[0]["n"]
        for t in ("checkpoints", "checkpoint_blobs", "checkpoint_writes")
    }


def head(dsn: str, thread_id: str) -> str:
    return str(
        rows(
            dsn,
            "SELECT max(checkpoint_id) AS c FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = ''",
            thread_id,
        )[0]["c"]
    )


def builder(out: dict[str, Any] | None = None) -> StateGraph[Any]:
    """start -> add (appends docs, or returns ``out`` when given) -> end."""

    def add(state: S, config: RunnableConfig) -> dict[str, Any]:
        if out is not None:
            return out
        # Unique per thread: artifacts are content-addressed, and one test damages them.
        tid = config["configurable"]["thread_id"]
        return {"docs": [f"{tid} doc {len(state.get('docs', []))} " + "x" * 3000], "n": 1}

    g: StateGraph[Any] = StateGraph(S)
    g.add_node("add", add)
    g.add_edge(START, "add")
    g.add_edge("add", END)
    return g


@pytest.fixture(scope="module")
def saver(dsn: str) -> Iterator[DurablePostgresSaver]:
    with DurablePostgresSaver.from_conn_string(dsn) as s:
        yield s


# ---------------------------------------------------------------------- error classes
def test_new_errors_pickle_with_their_fields() -> None:
    errors: list[DurableError] = [
        UnencodableValueError(
            thread_id="t", checkpoint_ns="", checkpoint_id="c", path="state['docs'][3]",
            value_type="int", reason="int out of range (2**70)",
        ),
        InvalidThreadIdError("a\x00b", "contains NUL (\\x00)"),
        StatementCanceledError(
            operation="put", thread_id="t", checkpoint_ns="", checkpoint_id="c",
            reason="canceling statement due to statement timeout", sqlstate="57014",
        ),
        ThreadExistsError("a", "b"),
    ]
    for err in errors:
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err) and back.fields == err.fields
        for name, value in err.fields.items():
            assert getattr(back, name) == value
    assert isinstance(errors[0], SerializationError) and isinstance(errors[1], ValueError)
    assert "state['docs'][3]" in str(errors[0]) and "'t'" in str(errors[0]) and "'c'" in str(errors[0])


def test_find_unencodable_names_the_deepest_culprit() -> None:
    from langchain_core.messages import AIMessage

    reject = serializer_reject(JsonPlusSerializer())
    path, culprit, reason = find_unencodable({"docs": ["a", "b", "c", 2**70]}, reject, "state") or ("", 0, "")
    assert (path, culprit) == ("state['docs'][3]", 2**70) and reason.startswith("int out of range (2**70")
    msg = [AIMessage(content="x", additional_kwargs={"n": [1, -(2**80)]})]
    assert find_unencodable(msg, reject, "writes['messages']")[:2] == (  # type: ignore[index]
        "writes['messages'][0].additional_kwargs['n'][1]", -(2**80)
    )
    lock = threading.Lock()
    found = find_unencodable({"x": ({"lock": lock},)}, reject, "state")
    assert found is not None and found[:2] == ("state['x'][0]['lock']", lock)
    assert find_unencodable({"ok": [1, "two", {"three": 3.0}]}, reject) is None
    assert find_unencodable({"u": ["ok", "a\ud800b"]}, text_reject, "metadata")[0] == "metadata['u'][1]"  # type: ignore[index]
    assert find_unencodable({"k\x00": 1}, text_reject, "metadata")[0] == "metadata.keys()[0]"  # type: ignore[index]


# ---------------------------------------------------------------------- 13: damaged rows
# Each damages the latest checkpoint of a thread whose state holds offloaded docs.
DAMAGE = {
    # garbage in a plain msgpack blob (0xc1 is never valid msgpack)
    "blob-garbage": "UPDATE checkpoint_blobs SET blob = '\\xc1c1deadbeef'::bytea "
    "WHERE thread_id = %(t)s AND type = 'msgpack'",
    # the case: an envelope whose msgpack type tag is invalid (ValueError
    # "invalid type Reserved" from ormsgpack.unpackb)
    "envelope-tag": "UPDATE checkpoint_blobs SET blob = '\\xc1'::bytea || blob "
    "WHERE thread_id = %(t)s AND type = 'durable+ref'",
    # an artifact cut in the middle of its zstd frame
    "artifact-zstd": "UPDATE durable_artifacts SET data = substring(data from 1 for 12) "
    "WHERE digest IN (SELECT digest FROM durable_artifact_refs WHERE thread_id = %(t)s)",
    # a type tag no serializer knows
    "type-tag": "UPDATE checkpoint_blobs SET type = 'no-such-type' "
    "WHERE thread_id = %(t)s AND type = 'msgpack'",
    # broken JSONB fields: metadata step a string, channel_values not an object
    "metadata-step": "UPDATE checkpoints SET metadata = jsonb_set(metadata, '{step}', '\"three\"') "
    "WHERE thread_id = %(t)s AND checkpoint_id = %(head)s",
    "channel-values": "UPDATE checkpoints SET checkpoint = jsonb_set(checkpoint, '{channel_values}', '\"x\"') "
    "WHERE thread_id = %(t)s AND checkpoint_id = %(head)s",
}


def _damaged_thread(dsn: str, saver: DurablePostgresSaver, what: str, t: str) -> str:
    graph = builder().compile(checkpointer=saver)
    for _ in range(2):
        graph.invoke({"docs": [f"{t} input " + "y" * 3000], "tags": ["a", t]}, cfg(t))
    bad = head(dsn, t)
    with psycopg.connect(dsn, autocommit=True) as conn:
        n = conn.execute(DAMAGE[what], {"t": t, "head": bad}).rowcount
    assert n >= 1
    saver.codec.cache.clear()  # nothing served from before the damage
    return bad


@pytest.mark.parametrize("what", sorted(DAMAGE))
def test_damaged_row_is_a_load_error_quarantines_and_is_reported(
    dsn: str, saver: DurablePostgresSaver, what: str
) -> None:
    t = f"dmg-{what}"
    bad = _damaged_thread(dsn, saver, what, t)
    graph = builder().compile(checkpointer=saver)

    # Reads: a typed error naming thread and checkpoint, the decoder's error as cause.
    with pytest.raises(CheckpointLoadError) as err:
        graph.get_state(cfg(t))
    assert err.value.thread_id == t and err.value.checkpoint_id == bad
    if what not in ("metadata-step", "channel-values"):  # JSON shape: no decoder error
        assert err.value.__cause__ is not None or "artifact" in type(err.value).__name__.lower()
    with pytest.raises(CheckpointLoadError):
        list(saver.list(cfg(t)))

    # CLI and inspection report the damage and go on.
    info = lgi.show_thread(saver, t)
    assert info["load_error"]["checkpoint_id"] == bad and info["checkpoint"]["id"] == bad
    listed = {r["thread_id"]: r for r in lgi.list_threads(saver, limit=1000)}
    assert t in listed
    history = lgi.thread_history(saver, t)
    assert history[0]["checkpoint_id"] == bad
    stats = lgi.storage_stats(saver)
    if what == "envelope-tag":
        assert any(d.get("thread_id") == t for d in stats["artifacts"]["damaged"])
    shown = runner.invoke(app, ["threads", "show", t, "--dsn", dsn])
    assert shown.exit_code == 0, shown.output
    assert "damaged" in shown.output and bad in shown.output
    for args in (["threads", "list"], ["threads", "history", t], ["stats"]):
        result = runner.invoke(app, [*args, "--dsn", dsn])
        assert result.exit_code == 0, (args, result.output)
    # diff loads both checkpoints: a typed message and exit 1, never a traceback.
    diff = runner.invoke(app, ["threads", "diff", t, "latest~1", "latest", "--dsn", dsn])
    assert diff.exit_code == 1 and isinstance(diff.exception, SystemExit), diff.output
    assert diff.output.startswith("error: ") and "Traceback" not in diff.output

    # A run start fails closed: quarantined at once, nothing ran.
    with pytest.raises(PoisonCheckpointError) as poisoned:
        graph.invoke({"docs": ["more"]}, cfg(t))
    assert poisoned.value.reason == "load_error" and poisoned.value.checkpoint_id == bad
    assert rows(dsn, "SELECT reason FROM durable_quarantine WHERE thread_id = %s", t)[0]["reason"] == "load_error"
    assert head(dsn, t) == bad


def test_list_threads_survives_a_damaged_timestamp(dsn: str, saver: DurablePostgresSaver) -> None:
    t = "dmg-ts"
    builder().compile(checkpointer=saver).invoke({"docs": ["a"]}, cfg(t))
    rows(dsn, "UPDATE checkpoints SET checkpoint = jsonb_set(checkpoint, '{ts}', '\"2024-99-99 not a time\"') "
         "WHERE thread_id = %s", t)
    listed = {r["thread_id"]: r for r in lgi.list_threads(saver, limit=1000)}
    assert t in listed and listed[t]["last_activity"] is not None  # from durable_threads


def test_retention_and_recompute_skip_a_damaged_thread_and_go_on(dsn: str) -> None:
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        graph = builder().compile(checkpointer=saver)
        for t in ("ret-bad", "ret-ok"):
            for _ in range(3):
                graph.invoke({"docs": [f"{t} " + "z" * 3000]}, cfg(t))
        rows(dsn, DAMAGE["envelope-tag"].replace("%(t)s", "%s"), "ret-bad")
        before = counts(dsn, "ret-bad")
        refs_before = rows(dsn, "SELECT count(*)::int AS n FROM durable_artifact_refs WHERE thread_id = %s", "ret-bad")

        report = retention.retain(saver, keep_last=1, older_than_days=30)
        assert report.skipped.get("damaged") == 1
        assert [d["thread_id"] for d in report.damaged] == ["ret-bad"]
        assert report.damaged[0]["checkpoint_id"] and "ret-bad" in report.damaged[0]["error"]
        assert report.threads_trimmed >= 1 and counts(dsn, "ret-ok")["checkpoints"] == 1
        assert counts(dsn, "ret-bad") == before  # its trim rolled back whole
        out = runner.invoke(app, ["retain", "--keep-last", "1", "--dsn", dsn, "--json"])
        assert out.exit_code == 0, out.output
        assert [d["thread_id"] for d in json.loads(out.stdout)["damaged"]] == ["ret-bad"]

        retention.recompute_refs(saver, ["ret-bad", "ret-ok"])  # goes on past it
        damaged: list[CheckpointLoadError] = []
        retention.recompute_refs(saver, ["ret-bad", "ret-ok"], damaged=damaged)
        assert [e.thread_id for e in damaged] == ["ret-bad"] and damaged[0].checkpoint_id is not None
        # What a damaged envelope references is unknown: every reference row stays.
        assert rows(dsn, "SELECT count(*)::int AS n FROM durable_artifact_refs WHERE thread_id = %s", "ret-bad") == refs_before
        saver.prune(["ret-bad"])  # prune's own recompute keeps them too, and does not raise
        assert rows(dsn, "SELECT count(*)::int AS n FROM durable_artifact_refs WHERE thread_id = %s", "ret-bad") == refs_before


# ---------------------------------------------------------------------- 14: raw errors
@pytest.mark.parametrize("tid", ["nul\x00id", "sur\ud800id"])
def test_unstorable_thread_id_is_typed_before_any_statement(
    dsn: str, saver: DurablePostgresSaver, tid: str
) -> None:
    before = rows(dsn, "SELECT count(*)::int AS n FROM checkpoints")[0]["n"]
    graph = builder().compile(checkpointer=saver)
    for call in (
        lambda: graph.invoke({"docs": ["a"]}, cfg(tid)),
        lambda: graph.get_state(cfg(tid)),
        lambda: saver.put(
            {"configurable": {"thread_id": tid, "checkpoint_ns": ""}}, empty_checkpoint(), {}, {}
        ),
        lambda: saver.copy_thread("anything", tid),
    ):
        with pytest.raises(InvalidThreadIdError) as err:
            call()
        assert err.value.value == tid and err.value.key == "thread_id"
        if "\ud800" in tid:
            assert isinstance(err.value.__cause__, UnicodeEncodeError)
    assert rows(dsn, "SELECT count(*)::int AS n FROM checkpoints")[0]["n"] == before
    assert rows(dsn, "SELECT count(*)::int AS n FROM durable_threads WHERE thread_id LIKE %s", tid[:3] + "%")[0]["n"] == 0


def test_lone_surrogate_in_a_state_string_is_refused_before_anything_is_written(
    dsn: str, saver: DurablePostgresSaver
) -> None:
    # As graph input: nothing of the thread is stored (the serializer would have
    # stored '?' in the input checkpoint, then PostgreSQL refused the JSON).
    graph = builder().compile(checkpointer=saver)
    with pytest.raises(UnencodableValueError) as err:
        graph.invoke({"s": "caf\ud800"}, cfg("sur-input"), durability="sync")
    e = err.value
    assert e.path == "input['s']" and e.thread_id == "sur-input" and e.checkpoint_id
    assert "lone surrogate" in e.reason and isinstance(e.__cause__, UnicodeEncodeError)
    assert counts(dsn, "sur-input") == {"checkpoints": 0, "checkpoint_blobs": 0, "checkpoint_writes": 0}
    # durability="async" (the default): LangGraph runs the first step while the input
    # checkpoint's put is in flight, so that step's own (valid) writes may land under a
    # checkpoint id that is never stored; no checkpoint is, and the error is the same.
    with pytest.raises(UnencodableValueError) as err:
        graph.invoke({"s": "caf\ud800"}, cfg("sur-input-async"))
    assert err.value.path == "input['s']" and counts(dsn, "sur-input-async")["checkpoints"] == 0

    # As a node's output: the node's write is refused; the thread stays at its input.
    bad = builder({"s": "ok \ud83d then"}).compile(checkpointer=saver)
    with pytest.raises(UnencodableValueError) as err:
        bad.invoke({"n": 1}, cfg("sur-node"))
    assert err.value.path == "writes['s']" and err.value.checkpoint_id == head(dsn, "sur-node")
    assert rows(dsn, "SELECT count(*)::int AS n FROM checkpoint_writes WHERE thread_id = %s AND channel = 's'",
                "sur-node")[0]["n"] == 0
    assert bad.get_state(cfg("sur-node")).next == ("add",)


def test_int_beyond_64_bits_names_its_path_and_writes_nothing(dsn: str, saver: DurablePostgresSaver) -> None:
    graph = builder().compile(checkpointer=saver)
    with pytest.raises(UnencodableValueError) as err:
        graph.invoke({"docs": ["a", "b", "c", 2**70]}, cfg("bigint-input"), durability="sync")
    e = err.value
    assert e.path == "input['docs'][3]" and e.value_type == "int" and "2**70" in e.reason
    assert "type dict" not in str(e) and e.thread_id == "bigint-input" and e.checkpoint_id
    assert isinstance(e.__cause__, SerializationError)
    assert counts(dsn, "bigint-input") == {"checkpoints": 0, "checkpoint_blobs": 0, "checkpoint_writes": 0}

    node = builder({"docs": [1, 2, 3, 2**70]}).compile(checkpointer=saver)
    with pytest.raises(UnencodableValueError) as err:
        node.invoke({"n": 0}, cfg("bigint-node"))
    assert err.value.path == "writes['docs'][3]" and "int out of range (2**70" in str(err.value)
    assert node.get_state(cfg("bigint-node")).next == ("add",)  # the node's step is not stored


def test_statement_timeout_is_typed_and_writes_nothing(dsn: str) -> None:
    short = f"{dsn} options='-c statement_timeout=300'"
    cp = empty_checkpoint()
    cp["channel_values"] = {"docs": ["x" * 3000, "y"]}
    cp["channel_versions"] = {"docs": "1"}
    put_cfg = {"configurable": {"thread_id": "timeout", "checkpoint_ns": ""}}
    with DurablePostgresSaver.from_conn_string(short) as saver, psycopg.connect(dsn) as locker:
        # Another session holds the tables: every statement of ours waits, then is canceled.
        locker.execute("LOCK TABLE checkpoints, checkpoint_blobs, checkpoint_writes IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(StatementCanceledError) as err:
            saver.put(put_cfg, cp, {"step": 0}, {"docs": "1"})
        e = err.value
        assert e.operation == "put" and e.thread_id == "timeout" and e.checkpoint_id == cp["id"]
        assert e.sqlstate == "57014" and isinstance(e.__cause__, psycopg.errors.QueryCanceled)
        with pytest.raises(StatementCanceledError) as err:
            saver.get_tuple(cfg("timeout"))
        assert err.value.operation == "get_tuple"
        with pytest.raises(StatementCanceledError):
            list(saver.list(cfg("timeout")))
        with pytest.raises(StatementCanceledError) as err:
            saver.copy_thread("timeout", "timeout-copy")
        assert err.value.operation == "copy_thread" and err.value.thread_id == "timeout-copy"
        locker.rollback()
    assert counts(dsn, "timeout") == {"checkpoints": 0, "checkpoint_blobs": 0, "checkpoint_writes": 0}


def test_fenced_write_shows_only_the_typed_error(
    saver: DurablePostgresSaver, caplog: pytest.LogCaptureFixture
) -> None:
    saver.run_op(lambda: saver._op_acquire("fenced", "other-host:1:x", None, None))
    cp = empty_checkpoint()
    cp["channel_values"] = {"a": [1, 2], "big": "x" * 5000}
    cp["channel_versions"] = {"a": "1", "big": "1"}
    conf = {"configurable": {"thread_id": "fenced", "checkpoint_ns": ""}}
    with caplog.at_level(logging.DEBUG, logger="psycopg"):
        with pytest.raises(ThreadBusyError):
            saver.put(conf, cp, {"step": 0}, {"a": "1", "big": "1"})
        # Many rows: psycopg is still sending the executemany when the fence's error
        # comes back, which is when it used to log "error ignored terminating Pipeline".
        for n in (500, 5000):
            with pytest.raises(ThreadBusyError):
                saver.put_writes(
                    {"configurable": {**conf["configurable"], "checkpoint_id": cp["id"]}},
                    [(f"c{i}", i) for i in range(n)],
                    "task-1",
                )
    noise = [r.getMessage() for r in caplog.records if r.name.startswith("psycopg")]
    assert not [m for m in noise if "error ignored" in m], noise


def test_copy_thread_refuses_to_merge_into_an_existing_thread(dsn: str, saver: DurablePostgresSaver) -> None:
    graph = builder().compile(checkpointer=saver)
    graph.invoke({"docs": ["from a"]}, cfg("copy-a"))
    graph.invoke({"docs": ["from b"]}, cfg("copy-b"))
    history_b = [c.config["configurable"]["checkpoint_id"] for c in saver.list(cfg("copy-b"))]
    with pytest.raises(ThreadExistsError) as err:
        saver.copy_thread("copy-a", "copy-b")
    assert err.value.source_thread_id == "copy-a" and err.value.target_thread_id == "copy-b"
    assert [c.config["configurable"]["checkpoint_id"] for c in saver.list(cfg("copy-b"))] == history_b
    saver.copy_thread("copy-a", "copy-c")  # a new target works as before
    assert graph.get_state(cfg("copy-c")).values["docs"][0].startswith("from a")


async def test_async_saver_gives_the_same_typed_errors(dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    """The ops are shared; this covers the async driver (its pipeline) and twins."""
    from langgraph_durable import AsyncDurablePostgresSaver

    short = f"{dsn} options='-c statement_timeout=300'"
    async with AsyncDurablePostgresSaver.from_conn_string(short) as saver:
        graph = builder().compile(checkpointer=saver)
        await graph.ainvoke({"docs": ["a"]}, cfg("async-a"))
        with pytest.raises(ThreadExistsError):
            await saver.acopy_thread("async-a", "async-a")
        with pytest.raises(UnencodableValueError) as err:
            await graph.ainvoke({"docs": [{"deep": [0, 2**70]}]}, cfg("async-big"), durability="sync")
        assert err.value.path == "input['docs'][0]['deep'][1]"
        with pytest.raises(InvalidThreadIdError):
            await graph.ainvoke({"docs": ["a"]}, cfg("x\x00y"))

        await saver.arun_op(lambda: saver._op_acquire("async-fenced", "other-host:1:x", None, None))
        conf = {"configurable": {"thread_id": "async-fenced", "checkpoint_ns": "", "checkpoint_id": "c"}}
        with caplog.at_level(logging.DEBUG, logger="psycopg"):
            for n in (500, 5000):
                with pytest.raises(ThreadBusyError):
                    await saver.aput_writes(conf, [(f"c{i}", i) for i in range(n)], "task-1")  # type: ignore[arg-type]
        assert not [r for r in caplog.records if "error ignored" in r.getMessage()]

        async with await psycopg.AsyncConnection.connect(dsn) as locker:
            await locker.execute("LOCK TABLE checkpoints IN ACCESS EXCLUSIVE MODE")
            with pytest.raises(StatementCanceledError) as canceled:
                await saver.aget_tuple(cfg("async-a"))
            assert canceled.value.thread_id == "async-a"
            with pytest.raises(StatementCanceledError):
                [t async for t in saver.alist(cfg("async-a"))]
            await locker.rollback()


def test_unstorable_metadata_names_its_key_and_leaves_no_blob_behind(
    dsn: str, saver: DurablePostgresSaver
) -> None:
    conf = {"configurable": {"thread_id": "bad-metadata", "checkpoint_ns": ""}}
    for md, path, cause in (
        # not JSON: used to fail while psycopg adapted it, inside the pipeline, after
        # the blob and artifact statements were sent: those committed without it
        ({"step": 1, "obj": object()}, "metadata['obj']", TypeError),
        # JSON PostgreSQL refuses
        ({"step": 1, "user": "caf\ud800"}, "metadata['user']", psycopg.DataError),
    ):
        cp = empty_checkpoint()
        cp["channel_values"] = {"small": [1, 2], "big": "x" * 5000}
        cp["channel_versions"] = {"small": "1", "big": "1"}
        with pytest.raises(UnencodableValueError) as err:
            saver.put(conf, cp, md, {"small": "1", "big": "1"})  # type: ignore[arg-type]
        assert err.value.path == path and err.value.checkpoint_id == cp["id"]
        assert isinstance(err.value.__cause__, cause)
        assert counts(dsn, "bad-metadata") == {"checkpoints": 0, "checkpoint_blobs": 0, "checkpoint_writes": 0}
        assert rows(dsn, "SELECT count(*)::int AS n FROM durable_artifact_refs WHERE thread_id = %s",
                    "bad-metadata")[0]["n"] == 0
