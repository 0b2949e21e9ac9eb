"""Adversarial review of issue 23's fixes (review23): each test is a scenario a user can
hit, reproduced on real PostgreSQL; its docstring says what the user loses.

A test marked ``xfail(strict=True)`` is a finding left unfixed on this branch (its
reason says the fix); the others fail on the merge of issue 23 (0d398b0) and pass here.
"""

from __future__ import annotations

import logging
import operator
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
import zstandard
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph

from langgraph_durable import DurablePostgresSaver
from langgraph_durable import archive as A
from langgraph_durable.artifacts import _digest, _element_content, _zstd_dict
from langgraph_durable.errors import ArchiveError, UnencodableValueError

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_archive_hostile as H  # its forging helpers
import test_seams_lease as SL  # lost_commit_replies


class _S(TypedDict):
    steps: Annotated[list[int], operator.add]


def _two_steps() -> StateGraph:
    g = StateGraph(_S)
    g.add_node("a", lambda s: {"steps": [1]})
    g.add_node("b", lambda s: {"steps": [2]})
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", END)
    return g


def _rows(dsn: str, q: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(q, args).fetchall()


@pytest.mark.parametrize("how", ["deleted", "other_thread"])
def test_config_with_unknown_checkpoint_id_is_not_work_lost(
    dsn: str, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A caller keeps the config a run returned (it carries ``checkpoint_id``) and uses it
    again after ``delete_thread``, or for another thread (a checkpoint id that is not in
    the thread). LangGraph finds no checkpoint and starts the thread fresh: the stock
    saver's run succeeds. The parent check of issue 23 took the caller's id for the run's
    own acknowledged parent: ``invoke`` raised ``AcknowledgedWorkLostError`` ("a failover
    to a standby that had not received it?"), logged ACKNOWLEDGED WORK LOST, counted it,
    handed the thread back 'stopped', and every retry with that config failed the same
    way. The user loses the run (it can never start with that config) and the operator
    gets a false data-loss alarm."""
    src, dst = f"unk-{how}-src", f"unk-{how}-{'src' if how == 'deleted' else 'dst'}"
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        graph = _two_steps().compile(checkpointer=saver)
        graph.invoke({"steps": []}, {"configurable": {"thread_id": src}})
        head = graph.get_state({"configurable": {"thread_id": src}}).config["configurable"]["checkpoint_id"]
        if how == "deleted":
            saver.delete_thread(src)
        cfg: Any = {"configurable": {"thread_id": dst, "checkpoint_id": head}}
        with caplog.at_level(logging.ERROR, logger="langgraph_durable"):
            out = graph.invoke({"steps": []}, cfg)
        assert out["steps"] == [1, 2]
        assert "ACKNOWLEDGED WORK LOST" not in caplog.text
    assert _rows(dsn, "SELECT status FROM durable_threads WHERE thread_id = %s", (dst,)) == [("done",)]
    # The stock saver does the same: a fresh start.
    with PostgresSaver.from_conn_string(dsn) as stock:
        cfg = {"configurable": {"thread_id": f"{dst}-stock", "checkpoint_id": head}}
        assert _two_steps().compile(checkpointer=stock).invoke({"steps": []}, cfg)["steps"] == [1, 2]


# --------------------------------------------------------------------------- archives


@pytest.fixture
def hsaver(dsn: str) -> Iterator[tuple[DurablePostgresSaver, str]]:
    """A saver in a schema of its own, artifacts from 256 bytes (test_archive_hostile's)."""
    schema = "r23_" + uuid.uuid4().hex[:10]
    with DurablePostgresSaver.from_conn_string(dsn, schema=schema, artifact_threshold=256) as s:
        s.setup()
        yield s, schema


def test_artifact_compressed_without_content_size_cannot_poison_a_later_thread(
    dsn: str, hsaver: tuple[DurablePostgresSaver, str], tmp_path: Path
) -> None:
    """The attack of defect 5 with a file that passes the new digest check: the planted
    artifact holds the RIGHT content for its digest (the value an unrelated thread stores
    later), but as a zstd frame written without its content size. Restore's check reads
    such a frame (a bounded stream reader) and accepted it; the saver's own reader
    (``ZstdDecompressor.decompress``) cannot ("could not determine content size"). The
    later thread's put deduplicated onto the planted row, and a fresh saver's
    ``get_state`` of that thread failed: the victim loses its state, which was never
    stored anywhere else. Restore must refuse what the saver could not read."""
    saver, schema = hsaver
    path = H.archived(dsn, schema, saver, tmp_path, "attacker")
    victim_value = H.big("victim-value", 2000)
    tag, data = saver.serde.dumps_typed(victim_value)
    content = _element_content(tag, data)
    digest = _digest(content)
    odd = zstandard.ZstdCompressor(dict_data=_zstd_dict(), write_dict_id=False, write_content_size=False)
    stream = odd.compressobj()
    frame = stream.compress(content) + stream.flush()
    assert zstandard.frame_content_size(frame) == -1
    body = H.read_body(path)
    H.add_row(
        body["artifacts"], digest=digest, size=len(content), data=frame,
        created_at="2026-01-01T00:00:00+00:00", last_used_at="2026-01-01T00:00:00+00:00",
    )
    H.forge(path, body)
    err: ArchiveError | None = None
    try:
        A.restore(saver, str(path))
    except ArchiveError as exc:
        err = exc
        print(f"refused: {exc}")
    H._graph(saver, victim_value).invoke({"value": "v"}, H._cfg("victim"))
    with DurablePostgresSaver.from_conn_string(dsn, schema=schema, artifact_threshold=256) as fresh:
        state = H._graph(fresh).get_state(H._cfg("victim"))
    assert state.values["value"] == victim_value
    assert err is not None and err.fields["reason"] == "bad_artifact" and digest.hex() in str(err)
    with pytest.raises(ArchiveError):
        A.verify(str(path))


# --------------------------------------------------------------------------- deferral


class _D(TypedDict):
    log: Annotated[list[str], operator.add]


def _deferred_fanout(runs: dict[str, int]) -> StateGraph:
    """START -> prep (deferred) -> {charge, ship} ("always") -> done (deferred) -> END."""

    def node(name: str) -> Any:
        def fn(s: _D) -> dict[str, Any]:
            runs[name] = runs.get(name, 0) + 1
            return {"log": [name]}

        return fn

    g = StateGraph(_D)
    g.add_node("prep", node("prep"), metadata={"checkpoint": "defer"})
    g.add_node("charge", node("charge"))
    g.add_node("ship", node("ship"))
    g.add_node("done", node("done"), metadata={"checkpoint": "defer"})
    g.add_edge(START, "prep")
    g.add_edge("prep", "charge")
    g.add_edge("prep", "ship")
    g.add_edge(["charge", "ship"], "done")
    g.add_edge("done", END)
    return g


@pytest.mark.parametrize("durability", ["sync", "async"])
def test_deferred_flush_with_lost_commit_replies(dsn: str, durability: str) -> None:
    """Every statement batch of the run (the deferred flushes, the always tasks' writes,
    the puts, the release) commits and then loses its reply: the driver retries it on a
    fresh connection. A retried flush must be recognised as its own (a re-put), never
    as clock skew or lost work, and nothing may run twice: the user would see a run fail
    or a node re-run though every write was stored."""
    runs: dict[str, int] = {}
    tid = f"lostreply-{durability}"
    cfg: Any = {"configurable": {"thread_id": tid}}
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        graph = _deferred_fanout(runs).compile(checkpointer=saver)
        with SL.lost_commit_replies() as seen:
            out = graph.invoke({"log": []}, cfg, durability=durability)
        assert seen["injected"] > 3
        stats = saver._granularity.stats  # the flush under test happened
        assert stats.deferred >= 1 and stats.flushed >= 1, stats
        assert sorted(out["log"]) == ["charge", "done", "prep", "ship"]
        assert runs == {"prep": 1, "charge": 1, "ship": 1, "done": 1}
        assert graph.get_state(cfg).values == out and graph.get_state(cfg).next == ()
    assert _rows(dsn, "SELECT status FROM durable_threads WHERE thread_id = %s", (tid,)) == [("done",)]
    chain = _rows(dsn, "SELECT checkpoint_id, parent_checkpoint_id FROM checkpoints WHERE thread_id = %s", (tid,))
    ids = {c for c, _ in chain}
    assert all(p is None or p in ids for _, p in chain), chain


@pytest.mark.parametrize("shape", ["send", "subgraph"])
def test_journaled_calls_in_deferred_send_and_subgraph_survive_sigkill(dsn: str, shape: str) -> None:
    """prep (deferred) fans out with ``Send`` to two workers (deferred; a plain node or
    a subgraph), each asks a ``journaled`` model; the process is SIGKILLed in the last
    worker after its call. The resume runs that worker again: its model call must
    replay (the flush before each journaled call stored the checkpoint the
    task ids hash). Otherwise the user pays for, and may get different, answers."""
    import subprocess

    import _child_review23 as child

    tid = f"jdefer-{shape}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS r23_calls (thread text, prompt text)")
        conn.execute("CREATE TABLE IF NOT EXISTS r23_asks (thread text, q text)")
    proc = subprocess.run([sys.executable, child.__file__, dsn, tid, shape], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr[-2000:]
    first = _rows(dsn, "SELECT prompt FROM r23_calls WHERE thread = %s ORDER BY prompt", (tid,))
    assert [p for (p,) in first] == list(child.QUESTIONS)
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        out = child.build(dsn, tid, shape, saver, kill=False).invoke(None, {"configurable": {"thread_id": tid}}, durability="sync")
    assert sorted(out["answers"]) == [f"answer to {q}" for q in child.QUESTIONS]
    calls = _rows(dsn, "SELECT prompt FROM r23_calls WHERE thread = %s ORDER BY prompt", (tid,))
    assert [p for (p,) in calls] == list(child.QUESTIONS), "a journaled call was made again on resume"
    # The killed worker did run again: the replay was exercised.
    asks = _rows(dsn, "SELECT q, count(*) FROM r23_asks WHERE thread = %s GROUP BY q", (tid,))
    assert dict(asks)[child.QUESTIONS[-1]] == 2, asks


@pytest.mark.parametrize("policy", ["none", "defer"])
def test_journaled_call_before_an_interrupt_is_replayed_on_resume(dsn: str, policy: str) -> None:
    """A node (with a ``RetryPolicy``, deferred or not) asks a ``journaled`` model, then
    ``interrupt()``s for approval: LangGraph raises ``GraphInterrupt`` out of the node,
    and the resume runs it again from its first line. An interrupt is not a rejected
    attempt: the answer must be replayed, not asked again (the user pays twice and may
    get another answer than the one the human approved)."""
    from langchain_core.runnables import RunnableLambda
    from langgraph.types import Command, RetryPolicy, interrupt

    from langgraph_durable import journaled

    calls: list[str] = []

    def answer(prompt: Any) -> str:
        calls.append(str(prompt))
        return f"draft {len(calls)}"

    model = journaled(RunnableLambda(answer, name="model"))

    def draft(s: _D) -> dict[str, Any]:
        text = model.invoke("write it")
        verdict = interrupt(f"approve {text}?")
        return {"log": [f"{text}:{verdict}"]}

    g = StateGraph(_D)
    g.add_node("prep", lambda s: {"log": ["prep"]}, metadata={"checkpoint": "defer"} if policy == "defer" else None)
    g.add_node("draft", draft, retry_policy=RetryPolicy(max_attempts=3), metadata={"checkpoint": "defer"} if policy == "defer" else None)
    g.add_edge(START, "prep")
    g.add_edge("prep", "draft")
    g.add_edge("draft", END)
    cfg: Any = {"configurable": {"thread_id": f"jinterrupt-{policy}"}}
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        first = g.compile(checkpointer=saver).invoke({"log": []}, cfg)
        assert "__interrupt__" in first and calls == ["write it"]
    with DurablePostgresSaver.from_conn_string(dsn) as other:
        out = g.compile(checkpointer=other).invoke(Command(resume="ok"), cfg)
    assert calls == ["write it"], calls
    assert out["log"] == ["prep", "draft 1:ok"]


class _V(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    v: Any


@pytest.mark.parametrize("policy", ["none", "defer"])
def test_failed_flush_of_an_always_task_raises_the_put_error(
    dsn: str, policy: str, caplog: pytest.LogCaptureFixture
) -> None:
    """prep (deferred) leaves an unencodable value (an int beyond 64 bits) in a channel;
    charge ("always") runs from prep's deferred checkpoint, overwrites the value and
    finishes, so its writes flush that checkpoint, and the flush fails. LangGraph runs
    put_writes in the background and goes on: the next put (charge's step, encodable)
    named the never-stored checkpoint as its parent, and the parent check refused it as
    AcknowledgedWorkLostError ("failover?"), logged ACKNOWLEDGED WORK LOST and handed the
    thread back 'stopped' with no attempt counted, so every resume (a recovery worker's,
    for ever) ran prep and charge again and was never quarantined. The user gets a false
    data-loss alarm, a wrong error, and the "always" task repeated without bound.
    Without the policy the put raises UnencodableValueError and the attempt counts."""
    runs: dict[str, int] = {}

    def node(name: str, out: dict[str, Any]) -> Any:
        def fn(s: _V) -> dict[str, Any]:
            runs[name] = runs.get(name, 0) + 1
            return {**out, "log": [name]}

        return fn

    md = {"checkpoint": "defer"} if policy == "defer" else None
    g = StateGraph(_V)
    g.add_node("prep", node("prep", {"v": 2**70}), metadata=md)
    g.add_node("charge", node("charge", {"v": "ok"}))
    g.add_node("done", node("done", {}))
    g.add_edge(START, "prep")
    g.add_edge("prep", "charge")
    g.add_edge("charge", "done")
    g.add_edge("done", END)
    tid = f"flushfail-{policy}"
    cfg: Any = {"configurable": {"thread_id": tid}}
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        graph = g.compile(checkpointer=saver)
        with caplog.at_level(logging.ERROR, logger="langgraph_durable"), pytest.raises(UnencodableValueError) as err:
            graph.invoke({"log": []}, cfg, durability="sync")
    assert err.value.thread_id == tid and "2**70" in str(err.value)
    assert "ACKNOWLEDGED WORK LOST" not in caplog.text
    status, attempts = _rows(dsn, "SELECT status, attempts FROM durable_threads WHERE thread_id = %s", (tid,))[0]
    assert status == "error" and attempts >= 1, (status, attempts)
    assert _rows(dsn, "SELECT count(*) FROM durable_audit WHERE action = 'work_lost' AND thread_id = %s", (tid,)) == [(0,)]
    assert runs.get("done") is None


def test_astream_cancelled_mid_run_stores_the_deferred_steps(dsn: str) -> None:
    """a and b (deferred) then slow; the consumer of ``astream`` is cancelled while slow
    runs (a web request dropped). The run's exit must store b's deferred checkpoint and
    hand the thread back unfinished: the resume runs only slow again (a and b are not
    repeated, the thread is not 'done')."""
    import asyncio

    from langgraph_durable import AsyncDurablePostgresSaver

    runs: dict[str, int] = {}
    tid = "astream-cancel"
    cfg: Any = {"configurable": {"thread_id": tid}}

    async def main() -> dict[str, Any]:
        inside = asyncio.Event()

        def node(name: str) -> Any:
            async def fn(s: _S) -> dict[str, Any]:
                runs[name] = runs.get(name, 0) + 1
                if name == "slow" and runs[name] == 1:
                    inside.set()
                    await asyncio.sleep(3600)
                return {"steps": [len(runs)]}

            return fn

        g = StateGraph(_S)
        for name in ("a", "b"):
            g.add_node(name, node(name), metadata={"checkpoint": "defer"})
        g.add_node("slow", node("slow"))
        g.add_edge(START, "a")
        g.add_edge("a", "b")
        g.add_edge("b", "slow")
        g.add_edge("slow", END)
        async with AsyncDurablePostgresSaver.from_conn_string(dsn) as saver:
            graph = g.compile(checkpointer=saver)

            async def consume() -> None:
                async for _ in graph.astream({"steps": []}, cfg, durability="sync"):
                    pass

            task = asyncio.create_task(consume())
            await asyncio.wait_for(inside.wait(), 60)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert _rows(dsn, "SELECT status FROM durable_threads WHERE thread_id = %s", (tid,)) != [("done",)]
            return await graph.ainvoke(None, cfg, durability="sync")

    out = asyncio.run(main())
    assert runs == {"a": 1, "b": 1, "slow": 2}, runs
    assert len(out["steps"]) == 3


# --------------------------------------------------------------------------- failover


@pytest.mark.parametrize("idem", [False, True])
def test_lost_parent_through_pgbouncer_transaction_mode(dsn: str, idem: bool) -> None:
    """The in-process lost-parent case of test_failover_async (a run's acknowledged
    checkpoint removed under it) through PgBouncer in transaction mode: the parent check,
    the work-lost release and its audit row are new statements; each must run without
    session state (no prepared statement, no SET) or the run fails with a pooler error
    instead of the typed one, and the thread stays leased until its lease expires."""
    import collections

    import _pgbouncer
    import test_failover_async as FA

    from langgraph_durable.errors import AcknowledgedWorkLostError

    _pgbouncer.require_pgbouncer()
    tid = f"bouncer-lost-{idem}"
    cfg: Any = {"configurable": {"thread_id": tid}}
    runs: collections.Counter[str] = collections.Counter()
    with _pgbouncer.pgbouncer(dsn) as through, DurablePostgresSaver.from_conn_string(through, pooler="transaction") as saver:
        graph = FA._lose_parent_graph(dsn, runs, idem=idem).compile(checkpointer=saver)
        with pytest.raises(AcknowledgedWorkLostError):
            graph.invoke({"steps": []}, cfg, durability="sync")
        assert _rows(dsn, "SELECT status, lease_owner FROM durable_threads WHERE thread_id = %s", (tid,)) == [("stopped", None)]
        assert _rows(dsn, "SELECT count(*) FROM durable_audit WHERE action = 'work_lost' AND thread_id = %s", (tid,)) == [(1,)]
        out = graph.invoke(None, cfg, durability="sync")
    assert out["steps"] == [0, 1, 2] and runs == {"a": 1, "b": 2, "c": 1}


# --------------------------------------------------------------------------- audit


def test_redact_url_hides_a_token_in_the_fragment() -> None:
    """An archive URL handed over with its credential in the fragment (OAuth-style
    ``#access_token=...``, a pre-signed link pasted whole) went verbatim into
    durable_audit, logs and errors, and the console's /audit page showed it: the
    credential leaks to anyone who can read the audit trail."""
    from langgraph_durable.audit import redact_url

    assert redact_url("https://h.example/arch#access_token=SECRET&x=1") == "https://h.example/arch#access_token=***&x=1"
    assert redact_url("https://u:pw@h.example/a?sig=S#frag") == "https://***@h.example/a?sig=***#frag"
    assert redact_url("/plain/path") == "/plain/path"


@pytest.mark.parametrize("durability", ["sync", "async"])
def test_delete_thread_during_a_run_is_lease_lost_not_work_lost(dsn: str, durability: str) -> None:
    """Another process deletes the thread while a run is in a node. The run must stop
    with LeaseLostError (its lease row is gone), not AcknowledgedWorkLostError (a false
    failover alarm, and a 'stopped' hand-back that a recovery worker would resume), and
    nothing of it may be written back after the delete."""
    import threading

    from langgraph_durable.errors import AcknowledgedWorkLostError, LeaseLostError

    inside, go = threading.Event(), threading.Event()

    def slow(s: _S) -> dict[str, Any]:
        inside.set()
        go.wait(60)
        return {"steps": [2]}

    g = StateGraph(_S)
    g.add_node("a", lambda s: {"steps": [1]})
    g.add_node("slow", slow)
    g.add_node("c", lambda s: {"steps": [3]})
    g.add_edge(START, "a")
    g.add_edge("a", "slow")
    g.add_edge("slow", "c")
    g.add_edge("c", END)
    tid = f"deleted-mid-run-{durability}"
    result: dict[str, BaseException] = {}
    with DurablePostgresSaver.from_conn_string(dsn) as saver, DurablePostgresSaver.from_conn_string(dsn) as other:
        graph = g.compile(checkpointer=saver)

        def run() -> None:
            try:
                graph.invoke({"steps": []}, {"configurable": {"thread_id": tid}}, durability=durability)
            except BaseException as exc:
                result["error"] = exc

        worker = threading.Thread(target=run)
        worker.start()
        assert inside.wait(60)
        other.delete_thread(tid)
        go.set()
        worker.join(60)
    err = result.get("error")
    assert isinstance(err, LeaseLostError) and not isinstance(err, AcknowledgedWorkLostError), repr(err)
    assert _rows(dsn, "SELECT count(*) FROM checkpoints WHERE thread_id = %s", (tid,)) == [(0,)]
    assert _rows(dsn, "SELECT count(*) FROM durable_threads WHERE thread_id = %s", (tid,)) == [(0,)]


def test_stock_written_thread_interrupted_in_a_subgraph_resumes_under_the_parent_check(dsn: str) -> None:
    """A thread the stock saver wrote (rows the package never acknowledged), stopped at
    an interrupt inside a subgraph, is resumed by the package: the root's and the
    subgraph's first puts name stock checkpoints as parents, which the server has. A
    false AcknowledgedWorkLostError here would strand every thread of an adopting user."""
    from langgraph.types import Command, interrupt

    sub = StateGraph(_S)
    sub.add_node("ask", lambda s: {"steps": [10 if interrupt("ok?") == "yes" else 0]})
    sub.add_node("after", lambda s: {"steps": [11]})
    sub.add_edge(START, "ask")
    sub.add_edge("ask", "after")
    sub.add_edge("after", END)
    g = StateGraph(_S)
    g.add_node("a", lambda s: {"steps": [1]})
    g.add_node("sub", sub.compile())
    g.add_node("c", lambda s: {"steps": [3]})
    g.add_edge(START, "a")
    g.add_edge("a", "sub")
    g.add_edge("sub", "c")
    g.add_edge("c", END)
    cfg: Any = {"configurable": {"thread_id": "stock-sub-interrupt"}}
    with PostgresSaver.from_conn_string(dsn) as stock:
        first = g.compile(checkpointer=stock).invoke({"steps": []}, cfg)
    assert "__interrupt__" in first
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        out = g.compile(checkpointer=saver).invoke(Command(resume="yes"), cfg, durability="sync")
    assert 10 in out["steps"] and 11 in out["steps"] and out["steps"][-1] == 3
