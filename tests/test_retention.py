"""GC of artifacts and checkpoint retention (issue #5), on real Postgres.

Each retention test works in a schema of its own: retention acts on every thread in
the tables, so tests must not see each other's threads.
"""

from __future__ import annotations

import json
import operator
import random
import string
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langchain_core.messages import AIMessage
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from typer.testing import CliRunner

from langgraph_durable import ConfigurationError, DurablePostgresSaver
from langgraph_durable.cli import app
from langgraph_durable.ops.retention import gc, recompute_refs, retain

runner = CliRunner()


def big(seed: object, size: int = 1200) -> str:
    rng = random.Random(str(seed))
    return "".join(rng.choices(string.ascii_letters + "     ", k=size))


SHARED = [big(f"shared-{i}") for i in range(3)]


class State(TypedDict, total=False):
    messages: Annotated[list[Any], operator.add]
    shared: str
    scratch: str
    alt: str
    who: str
    turn: int
    answer: str


def _graph(saver: Any, *, ask: bool = False, fail: bool = False, gate: Any = None) -> Any:
    def step(s: State) -> dict[str, Any]:
        i = s.get("turn", 0)
        if gate is not None:
            gate()
        if fail:
            raise RuntimeError("boom")
        return {
            "messages": [AIMessage(content=big(f"msg-{i}"), id=f"m{i}")],
            "shared": SHARED[i % len(SHARED)],
            # A fresh big value each step: garbage once its checkpoint is pruned.
            "scratch": big(f"scratch-{uuid.uuid4().hex}"),
            # A value of this thread alone that comes back every other step: after a
            # prune and a gc it is gone while the writer still believes it stored.
            "alt": big(f"{s.get('who')}-alt-{i % 2}"),
        }

    def review(s: State) -> dict[str, Any]:
        return {"answer": interrupt("approve?")}

    g = StateGraph(State)
    g.add_node("step", step)
    g.add_edge(START, "step")
    if ask:
        g.add_node("review", review)
        g.add_edge("step", "review")
        g.add_edge("review", END)
    else:
        g.add_edge("step", END)
    return g.compile(checkpointer=saver)


def _cfg(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


@pytest.fixture
def schema(dsn: str) -> str:
    return "r_" + uuid.uuid4().hex[:10]


@pytest.fixture
def saver(dsn: str, schema: str) -> Iterator[DurablePostgresSaver]:
    with DurablePostgresSaver.from_conn_string(dsn, schema=schema, artifact_threshold=256) as s:
        s.setup()
        yield s


def _q(dsn: str, schema: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("SET search_path TO {}").format(psycopg.sql.Identifier(schema)))
        cur = conn.execute(sql, args)
        return cur.fetchall() if cur.description else []


def _n(dsn: str, schema: str, sql: str, *args: Any) -> int:
    return int(_q(dsn, schema, sql, *args)[0][0])


def _backdate(dsn: str, schema: str, thread: str, days: float = 40) -> None:
    """Make a thread look idle for ``days``: checkpoint timestamps and status row."""
    _q(
        dsn,
        schema,
        "UPDATE checkpoints SET checkpoint = jsonb_set(checkpoint, '{ts}', to_jsonb("
        "to_char((now() - make_interval(days => %s)) AT TIME ZONE 'UTC', "
        "'YYYY-MM-DD\"T\"HH24:MI:SS.US\"+00:00\"'))) WHERE thread_id = %s",
        int(days),
        thread,
    )
    _q(
        dsn,
        schema,
        "UPDATE durable_threads SET updated_at = now() - make_interval(days => %s) WHERE thread_id = %s",
        int(days),
        thread,
    )


def _loads_everything(dsn: str, schema: str, thread: str) -> int:
    """Every checkpoint of the thread (and its pending writes) decodes, cold cache."""
    with DurablePostgresSaver.from_conn_string(dsn, schema=schema, artifact_threshold=256) as fresh:
        tuples = list(fresh.list(_cfg(thread)))
        for t in tuples:
            assert isinstance(t.checkpoint["channel_values"], dict)
        return len(tuples)


# --------------------------------------------------------------------------- gc


def test_gc_frees_what_deleted_threads_alone_used(dsn: str, schema: str, saver: DurablePostgresSaver) -> None:
    graph = _graph(saver)
    for t in ("a", "b"):
        for i in range(3):
            graph.invoke({"turn": i}, _cfg(t), durability="sync")
    total = _n(dsn, schema, "SELECT count(*) FROM durable_artifacts")
    only_a = _n(
        dsn,
        schema,
        "SELECT count(*) FROM durable_artifact_refs r WHERE thread_id = 'a' AND NOT EXISTS "
        "(SELECT 1 FROM durable_artifact_refs o WHERE o.digest = r.digest AND o.thread_id = 'b')",
    )
    assert 0 < only_a < total
    saver.delete_thread("a")
    dry = gc(saver, grace=0, dry_run=True)
    assert (dry.artifacts, dry.dry_run) == (only_a, True) and dry.artifact_bytes > 0
    assert _n(dsn, schema, "SELECT count(*) FROM durable_artifacts") == total
    # Grace: everything was created just now, nothing is old enough.
    assert gc(saver, grace=3600).artifacts == 0
    done = gc(saver, grace=0, batch_size=3)
    assert (done.artifacts, done.artifact_bytes) == (dry.artifacts, dry.artifact_bytes)
    assert done.scanned == total
    assert _n(dsn, schema, "SELECT count(*) FROM durable_artifacts") == total - only_a
    assert _loads_everything(dsn, schema, "b") == 9
    assert gc(saver, grace=0).artifacts == 0


def test_orphan_refs_of_threads_deleted_elsewhere(dsn: str, schema: str, saver: DurablePostgresSaver) -> None:
    graph = _graph(saver)
    graph.invoke({"turn": 0}, _cfg("stock-deleted"), durability="sync")
    # The stock saver's delete_thread knows nothing of our tables.
    for table in ("checkpoints", "checkpoint_blobs", "checkpoint_writes"):
        _q(dsn, schema, f"DELETE FROM {table} WHERE thread_id = 'stock-deleted'")
    refs = _n(dsn, schema, "SELECT count(*) FROM durable_artifact_refs")
    report = gc(saver, grace=0)
    assert (report.orphan_threads, report.orphan_refs) == (1, refs)
    assert report.artifacts == refs  # the thread was their only user
    assert _n(dsn, schema, "SELECT count(*) FROM durable_artifacts") == 0


def test_prune_recomputes_refs_so_gc_frees_old_versions(
    dsn: str, schema: str, saver: DurablePostgresSaver
) -> None:
    graph = _graph(saver)
    for i in range(5):
        graph.invoke({"turn": i}, _cfg("p"), durability="sync")
    before = graph.get_state(_cfg("p")).values
    refs_before = _n(dsn, schema, "SELECT count(*) FROM durable_artifact_refs WHERE thread_id = 'p'")
    saver.prune(["p"], strategy="keep_latest")
    refs_after = _n(dsn, schema, "SELECT count(*) FROM durable_artifact_refs WHERE thread_id = 'p'")
    # 4 scratch values and 2 shared ones (only the latest's survives... plus its own
    # messages' elements) are no longer referenced.
    assert refs_after < refs_before
    assert recompute_refs(saver, ["p"]) == 0  # already exact
    freed = gc(saver, grace=0)
    assert freed.artifacts == refs_before - refs_after
    assert _loads_everything(dsn, schema, "p") >= 1
    with DurablePostgresSaver.from_conn_string(dsn, schema=schema, artifact_threshold=256) as fresh:
        assert _graph(fresh).get_state(_cfg("p")).values == before


def test_gc_never_removes_a_referenced_artifact_under_concurrent_writers(
    dsn: str, schema: str, saver: DurablePostgresSaver
) -> None:
    writers = [f"w{i}" for i in range(3)]
    steps = 20
    stop = threading.Event()
    errors: list[BaseException] = []
    deleted = [0]
    garbage = [0]

    def guard(fn: Any) -> Any:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # surfaced by the assertion below
                errors.append(exc)
                stop.set()

        return run

    def write(thread: str) -> Any:
        def run() -> None:
            graph = _graph(saver)
            for i in range(steps):
                graph.invoke({"turn": i, "who": thread}, _cfg(thread), durability="sync")

        return run

    # Churn and GC run on another saver, as another process would: what the writers'
    # saver remembers as stored is not told about what they remove.
    other_cm = DurablePostgresSaver.from_conn_string(dsn, schema=schema, artifact_threshold=256)
    other = other_cm.__enter__()

    def churn() -> None:
        # Garbage in a stream: threads written then deleted (their unique values go),
        # and prunes of the live writers (their old scratch values go, and the value a
        # writer alternates back to loses its reference while that writer still
        # believes it stored: its put must then be retried with the data).
        n = 0
        while not stop.is_set():
            tid = f"g{n}"
            _graph(other).invoke({"turn": n}, _cfg(tid), durability="sync")
            other.delete_thread(tid)
            garbage[0] += 1
            if n % 2 == 0:
                other.prune([writers[n % len(writers)]], strategy="keep_latest")
            n += 1

    def collect() -> None:
        while not stop.is_set():
            deleted[0] += gc(other, grace=0, batch_size=5).artifacts

    workers = [threading.Thread(target=guard(write(t))) for t in writers]
    helpers = [threading.Thread(target=guard(churn)), threading.Thread(target=guard(collect))]
    for t in workers + helpers:
        t.start()
    for t in workers:
        t.join(120)
    stop.set()
    for t in helpers:
        t.join(120)
    other_cm.__exit__(None, None, None)
    assert not errors, errors
    deleted[0] += gc(saver, grace=0).artifacts
    assert deleted[0] > 0 and garbage[0] > 0
    with DurablePostgresSaver.from_conn_string(dsn, schema=schema, artifact_threshold=256) as fresh:
        for thread in writers:
            assert _loads_everything(dsn, schema, thread) >= 1
            values = _graph(fresh).get_state(_cfg(thread)).values
            assert [m.id for m in values["messages"]] == [f"m{i}" for i in range(steps)]
            assert values["shared"] == SHARED[(steps - 1) % len(SHARED)]
    # Nothing unreferenced survives a final collection, nothing referenced is missing.
    assert _n(
        dsn,
        schema,
        "SELECT count(*) FROM durable_artifact_refs r "
        "WHERE NOT EXISTS (SELECT 1 FROM durable_artifacts a WHERE a.digest = r.digest)",
    ) == 0


# --------------------------------------------------------------------------- retention


def _threads(dsn: str, schema: str) -> set[str]:
    return {r[0] for r in _q(dsn, schema, "SELECT DISTINCT thread_id FROM checkpoints")}


def _populate(dsn: str, schema: str, saver: DurablePostgresSaver) -> None:
    plain = _graph(saver)
    for t in ("done-old", "done-new"):
        for i in range(3):
            plain.invoke({"turn": i}, _cfg(t), durability="sync")
    _graph(saver, ask=True).invoke({"turn": 0}, _cfg("waiting-old"), durability="sync")
    with pytest.raises(RuntimeError):
        _graph(saver, fail=True).invoke({"turn": 0}, _cfg("error-old"), durability="sync")
    for t in ("quarantined-old", "running-dead"):
        plain.invoke({"turn": 0}, _cfg(t), durability="sync")
    _q(dsn, schema, "UPDATE durable_threads SET status = 'quarantined' WHERE thread_id = 'quarantined-old'")
    # A run whose process died: status still 'running', lease expired. Recovery's.
    _q(
        dsn,
        schema,
        "UPDATE durable_threads SET status = 'running', lease_owner = 'dead:1', "
        "lease_expires_at = now() - interval '1 hour' WHERE thread_id = 'running-dead'",
    )
    # Written outside any run (update_state style): no durable_threads row at all.
    with DurablePostgresSaver.from_conn_string(dsn, schema=schema, leases=False, artifact_threshold=256) as bare:
        for i in range(2):
            _graph(bare).invoke({"turn": i}, _cfg("rowless-old"), durability="sync")
    assert _n(dsn, schema, "SELECT count(*) FROM durable_threads WHERE thread_id = 'rowless-old'") == 0
    for t in ("done-old", "waiting-old", "error-old", "quarantined-old", "running-dead", "rowless-old"):
        _backdate(dsn, schema, t)


def test_retention_policy(dsn: str, schema: str, saver: DurablePostgresSaver) -> None:
    _populate(dsn, schema, saver)
    status = dict(_q(dsn, schema, "SELECT thread_id, status FROM durable_threads"))
    assert status["done-old"] == "done" and status["waiting-old"] == "waiting"
    assert status["error-old"] == "error"
    everything = _threads(dsn, schema)

    dry = retain(saver, older_than_days=30, dry_run=True)
    assert _threads(dsn, schema) == everything
    real = retain(saver, older_than_days=30)
    assert sorted(real.deleted_thread_ids) == ["done-old", "rowless-old"]
    assert _threads(dsn, schema) == everything - {"done-old", "rowless-old"}
    for field in ("threads_deleted", "checkpoints", "blobs", "writes", "bytes", "artifacts", "artifact_bytes"):
        assert getattr(dry, field) == getattr(real, field), field
    assert real.checkpoints == 3 * 3 + 2 * 3 and real.bytes > 0
    assert real.skipped == {"quarantined": 1, "running": 1}
    assert _n(dsn, schema, "SELECT count(*) FROM durable_threads WHERE thread_id IN ('done-old', 'rowless-old')") == 0
    assert _n(dsn, schema, "SELECT count(*) FROM durable_artifact_refs WHERE thread_id = 'done-old'") == 0
    assert gc(saver, grace=0).artifacts == real.artifacts

    # 'error' counts as completed only when asked; running/quarantined never can.
    assert retain(saver, older_than_days=30, statuses=["done", "error"]).deleted_thread_ids == ["error-old"]
    for bad in (["running"], ["quarantined"], ["nope"]):
        with pytest.raises(ConfigurationError):
            retain(saver, statuses=bad)
    with pytest.raises(ConfigurationError):
        retain(saver, keep_last=0)
    with pytest.raises(ConfigurationError):
        gc(saver, grace=-1)

    # keep_last trims the live threads it may touch; waiting stays resumable.
    plain = _graph(saver)
    for i in range(3, 6):
        plain.invoke({"turn": i}, _cfg("done-new"), durability="sync")
    before = plain.get_state(_cfg("done-new")).values
    n_before = _n(dsn, schema, "SELECT count(*) FROM checkpoints WHERE thread_id = 'done-new'")
    dry = retain(saver, older_than_days=30, keep_last=2, dry_run=True)
    real = retain(saver, older_than_days=30, keep_last=2)
    for field in ("threads_trimmed", "checkpoints", "blobs", "writes", "bytes"):
        assert getattr(dry, field) == getattr(real, field), field
    assert real.threads_deleted == 0 and real.threads_trimmed == 2  # done-new, waiting-old
    assert _n(dsn, schema, "SELECT count(*) FROM checkpoints WHERE thread_id = 'done-new'") == 2
    assert real.checkpoints == (n_before - 2) + 1  # waiting-old had 3
    assert _n(dsn, schema, "SELECT count(*) FROM checkpoints WHERE thread_id = 'quarantined-old'") == 3
    with DurablePostgresSaver.from_conn_string(dsn, schema=schema, artifact_threshold=256) as fresh:
        assert _graph(fresh).get_state(_cfg("done-new")).values == before
    gc(saver, grace=0)
    out = _graph(saver, ask=True).invoke(Command(resume="yes"), _cfg("waiting-old"), durability="sync")
    assert out["answer"] == "yes" and len(out["messages"]) == 1
    assert _loads_everything(dsn, schema, "done-new") == 2


def test_retention_never_deletes_a_running_thread(dsn: str, schema: str, saver: DurablePostgresSaver) -> None:
    started, release = threading.Event(), threading.Event()

    def gate() -> None:
        started.set()
        assert release.wait(60)

    plain = _graph(saver)
    for i in range(2):
        plain.invoke({"turn": i}, _cfg("live"), durability="sync")
    _q(dsn, schema, "UPDATE durable_threads SET status = 'done' WHERE thread_id = 'live'")
    result: dict[str, Any] = {}
    runner_thread = threading.Thread(
        target=lambda: result.update(_graph(saver, gate=gate).invoke({"turn": 2}, _cfg("live"), durability="sync"))
    )
    runner_thread.start()
    try:
        assert started.wait(60)
        _backdate(dsn, schema, "live", days=400)
        n = _n(dsn, schema, "SELECT count(*) FROM checkpoints WHERE thread_id = 'live'")
        report = retain(saver, older_than_days=0, keep_last=1, statuses=["done", "waiting", "error", "stopped"])
        assert report.skipped == {"leased": 1} and report.threads_deleted == 0
        assert _n(dsn, schema, "SELECT count(*) FROM checkpoints WHERE thread_id = 'live'") == n
    finally:
        release.set()
        runner_thread.join(60)
    assert len(result["messages"]) == 3
    # Finished ('done', lease released) and idle > 0 days: now it may go.
    time.sleep(0.01)
    assert retain(saver, older_than_days=0).deleted_thread_ids == ["live"]


def test_cli_gc_and_retain(dsn: str, schema: str, saver: DurablePostgresSaver) -> None:
    plain = _graph(saver)
    for t in ("old", "new"):
        for i in range(2):
            plain.invoke({"turn": i}, _cfg(t), durability="sync")
    _backdate(dsn, schema, "old")
    base = ["--dsn", dsn, "--schema", schema]

    dry = runner.invoke(app, ["retain", *base, "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    report = json.loads(dry.stdout)
    assert report["dry_run"] and report["threads_deleted"] == 1 and report["checkpoints"] == 6
    assert report["bytes"] > 0 and report["artifacts"] > 0 and report["gc"] is None
    assert _threads(dsn, schema) == {"old", "new"}

    table = runner.invoke(app, ["retain", *base, "--dry-run", "--keep-last", "1"])
    assert table.exit_code == 0, table.output
    assert "would delete" in table.output and "trimmed" in table.output

    done = runner.invoke(app, ["retain", *base, "--no-gc", "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["deleted_thread_ids"] == ["old"]
    assert _threads(dsn, schema) == {"new"}

    preview = runner.invoke(app, ["gc", *base, "--grace", "0", "--dry-run", "--json"])
    assert preview.exit_code == 0, preview.output
    would = json.loads(preview.stdout)["artifacts"]
    assert would == report["artifacts"]
    shown = runner.invoke(app, ["gc", *base, "--grace", "0"])
    assert shown.exit_code == 0, shown.output
    assert "deleted" in shown.output and str(would) in shown.output
    again = runner.invoke(app, ["gc", *base, "--grace", "0", "--json"])
    assert json.loads(again.stdout)["artifacts"] == 0

    bad = runner.invoke(app, ["retain", *base, "--status", "running"])
    assert bad.exit_code == 1 and "never deletes" in bad.output


async def test_async_gc_retain_and_recompute(dsn: str, schema: str) -> None:
    from langgraph_durable import AsyncDurablePostgresSaver
    from langgraph_durable.ops.retention import agc, arecompute_refs, aretain

    async with AsyncDurablePostgresSaver.from_conn_string(dsn, schema=schema, artifact_threshold=256) as saver:
        await saver.asetup()
        graph = _graph(saver)
        for t in ("x", "y"):
            for i in range(2):
                await graph.ainvoke({"turn": i}, _cfg(t), durability="sync")
        _backdate(dsn, schema, "x")
        report = await aretain(saver, older_than_days=30)
        assert report.deleted_thread_ids == ["x"]
        assert await arecompute_refs(saver, ["y"]) == 0
        freed = await agc(saver, grace=0)
        assert freed.artifacts == report.artifacts > 0
        assert len((await graph.aget_state(_cfg("y"))).values["messages"]) == 2


def test_retain_purges_expired_idempotency_keys(dsn: str, schema: str, saver: DurablePostgresSaver) -> None:
    """key= keys outlive their thread; the retention job removes the expired ones."""
    from langgraph_durable import Ledger, idempotent

    runs: list[int] = []

    @idempotent(ledger=saver, key=lambda n: f"retain-key-{n}", ttl=3600)
    def effect(n: int) -> int:
        runs.append(n)
        return n

    assert [effect(1), effect(2), effect(1)] == [1, 2, 1] and runs == [1, 2]
    _q(dsn, schema, "UPDATE durable_ledger SET expires_at = now() - interval '1 second' WHERE key = 'retain-key-1'")
    dry = retain(saver, dry_run=True)
    assert dry.ledger_keys_expired == 1 and Ledger(saver).get("retain-key-1") is not None
    report = retain(saver)
    assert report.ledger_keys_expired == 1
    assert Ledger(saver).get("retain-key-1") is None
    assert Ledger(saver).get("retain-key-2") is not None  # not expired: kept
