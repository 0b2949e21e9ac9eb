"""Shrunk findings of tests/test_model_chaos.py's long profile, as directed tests.

Each drives the state machine's own rules (``ChaosMachine``) in a fixed order, with
the timing that made the finding made exact (a child gated before it plans), and
checks the machine's invariants after every step as hypothesis would.
"""

from __future__ import annotations

import functools
import time
import uuid
from pathlib import Path
from typing import Any

import _child_chaos as cc
import psycopg
import pytest
import test_model_chaos as tmc

pytestmark = [pytest.mark.chaos]


def _machine(dsn: str) -> tmc.ChaosMachine:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for ddl in cc.TABLES_DDL:
            conn.execute(ddl)
    tmc.ChaosMachine.DSN = dsn
    machine = tmc.ChaosMachine()
    machine.setup()
    machine.model_holds()
    return machine


def _effects(dsn: str, tid: str) -> dict[tuple[int, str], int]:
    rows = tmc.q(dsn, "SELECT turn, node, count(*) AS n FROM chaos_effects WHERE thread_id = %s GROUP BY 1, 2", (tid,))
    return {(r["turn"], r["node"]): int(r["n"]) for r in rows}


def _parent_index(machine: tmc.ChaosMachine) -> int:
    """The index terminate_backends maps to the parent's own backends (chaos_parent)."""
    return len(machine.children)


def test_run_in_flight_recreates_a_thread_retain_deleted(dsn: str, tmp_path: Path) -> None:
    """The long run's "effect recorded twice: turn 0, node n3, count 2, forks 0" after
    run_in_child (no kill) ... terminate_backends chaos_parent ... run_in_child (no kill),
    with a retain in between. Not a saver defect: the second child was spawned while
    the first still ran (so it was asked for turn 0 too) and started slowly; retain
    deleted the thread once the first run had finished it (done, no lease: allowed);
    the second child then found no thread, planned turn 0 as new input and ran it on
    a new thread under the same id, as any checkpointer does. The model still counted
    that new thread's effects against the deleted one's. Now a deleted thread's effects
    are judged up to its deletion only (Thread.effects_upto)."""
    machine = _machine(dsn)
    try:
        tid = machine.active()[0]
        machine.run_in_child((0, False, None))  # A: turn 0, no kill
        (first,) = machine.children.values()
        gate = tmp_path / "gate"
        spawn = machine.spawn
        machine.spawn = functools.partial(spawn, gate=str(gate))  # type: ignore[method-assign]
        machine.run_in_child((0, False, None))  # B: A not reaped yet, so turn 0 as well
        machine.spawn = spawn  # type: ignore[method-assign]
        assert {c.tid for c in machine.children.values()} == {tid} and len(machine.children) == 2
        machine.model_holds()
        machine.terminate_backends(_parent_index(machine), 0, 0.0)
        machine.model_holds()
        first.proc.join(tmc.CHILD_WAIT)
        machine.tick(0.0)  # reaps A: turn 0 finished
        machine.model_holds()
        assert 0 in machine.threads[tid].frozen, "the first run did not finish turn 0"
        machine.retain(0)  # the thread is done and B holds no lease: deleted
        assert machine.threads[tid].deleted, "retain did not delete the finished thread"
        machine.model_holds()
        gate.touch()
        machine.wait_all(0)  # B plans on an empty thread: turn 0 again, as a new thread
        machine.model_holds()  # raised "effect recorded twice" before the model fix
        # The scenario happened (the test is not vacuous): turn 0 ran once per thread.
        assert _effects(dsn, tid) == {(0, n): 2 for n in cc.NODES}
        outcomes = tmc.q(dsn, "SELECT event, message FROM chaos_outcomes WHERE thread_id = %s", (tid,))
        assert [o["event"] for o in outcomes] == ["done", "done"], outcomes
    finally:
        machine.teardown()


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.1, 0.2, 0.3, 0.4])
def test_parent_backends_terminated_between_two_runs(dsn: str, delay: float) -> None:
    """The reported sequence without the retain: a run to completion in a child, the
    parent's own backends terminated (its saver's pool, the connection the model reads
    the store with), the same thread run again in a child. Every effect once."""
    machine = _machine(dsn)
    try:
        tid = machine.active()[0]
        for _ in range(2):
            machine.run_in_child((0, False, None))
            machine.model_holds()
            machine.terminate_backends(_parent_index(machine), 0, delay)
            machine.model_holds()
            machine.wait_all(0)
            machine.model_holds()
            machine.tick(0.45)  # the termination lands on an idle pool too
            machine.model_holds()
        effects = _effects(dsn, tid)
        assert effects and set(effects.values()) == {1}, effects
        assert {t for t, _ in effects} == {0, 1}, effects
    finally:
        machine.teardown()


# --------------------------------------------------------------------------- statement_timeout
# Issue 11 item 14: a statement the database cancels (statement_timeout, SQLSTATE 57014)
# reached the caller of the maintenance operations as a raw psycopg QueryCanceled. The
# canceled statement waits on a table lock another session holds, so it is canceled by
# the timeout every time (no race with how fast the statement is).

_LOCKED = (
    "checkpoints, checkpoint_blobs, checkpoint_writes, durable_threads, durable_artifacts, "
    "durable_artifact_refs, durable_ledger, durable_migration_log, durable_quarantine"
)


def _canceled_thread(dsn: str) -> tuple[str, str]:
    """A finished thread (a run with an artifact) the canceled operations would delete."""
    from langgraph_durable import DurablePostgresSaver

    tid, run_id = "cancel-" + uuid.uuid4().hex[:8], str(uuid.uuid4())
    with DurablePostgresSaver.from_conn_string(dsn, **cc.saver_options()) as saver:
        graph = cc.build(dsn).compile(checkpointer=saver.bind(graph_version="v1"))
        graph.invoke({"turn": 0}, {"configurable": {"thread_id": tid, "run_id": run_id}})
    return tid, run_id


def _rows(dsn: str, tid: str) -> dict[str, int]:
    return {
        table: int(tmc.q(dsn, f'SELECT count(*) AS n FROM "{table}" WHERE thread_id = %s', (tid,))[0]["n"])
        for table in ("checkpoints", "checkpoint_blobs", "checkpoint_writes", "durable_threads", "durable_ledger")
    }


def _check_canceled(exc: BaseException, operation: str, thread_id: str | None) -> None:
    from langgraph_durable import DurableError, StatementCanceledError

    assert isinstance(exc, StatementCanceledError) and isinstance(exc, DurableError), repr(exc)
    assert exc.operation == operation and exc.thread_id == thread_id, (exc.operation, exc.thread_id)
    assert exc.sqlstate == "57014", exc.sqlstate
    assert isinstance(exc.__cause__, psycopg.errors.QueryCanceled), repr(exc.__cause__)


_SYNC_OPS = ["delete_for_runs", "prune", "prune_delete", "delete_thread", "retain", "gc"]


@pytest.mark.parametrize("op", _SYNC_OPS)
def test_statement_timeout_of_a_maintenance_op_is_typed(dsn: str, op: str) -> None:
    from langgraph_durable import DurablePostgresSaver, gc, retain

    with psycopg.connect(dsn, autocommit=True) as conn:
        for ddl in cc.TABLES_DDL:
            conn.execute(ddl)
    tid, run_id = _canceled_thread(dsn)
    before = _rows(dsn, tid)
    slow = psycopg.conninfo.make_conninfo(dsn, options="-c statement_timeout=100 -c lock_timeout=0")
    with DurablePostgresSaver.from_conn_string(slow, **cc.saver_options()) as saver:
        calls: dict[str, tuple[Any, str | None]] = {
            "delete_for_runs": (lambda: saver.delete_for_runs([run_id]), None),
            "prune": (lambda: saver.prune([tid]), tid),
            "prune_delete": (lambda: saver.prune([tid], strategy="delete"), tid),
            "delete_thread": (lambda: saver.delete_thread(tid), tid),
            "retain": (lambda: retain(saver, older_than_days=0), None),
            "gc": (lambda: gc(saver, grace=0), None),
        }
        fn, named = calls[op]
        with psycopg.connect(dsn) as locker:
            locker.execute(f"LOCK TABLE {_LOCKED} IN ACCESS EXCLUSIVE MODE")
            with pytest.raises(Exception) as info:
                fn()
            locker.rollback()
    _check_canceled(info.value, "prune" if op == "prune_delete" else op, named)
    assert _rows(dsn, tid) == before, "a canceled operation changed the thread"


@pytest.mark.parametrize("op", _SYNC_OPS)
def test_statement_timeout_of_an_async_maintenance_op_is_typed(dsn: str, op: str) -> None:
    import asyncio

    from langgraph_durable import AsyncDurablePostgresSaver, agc, aretain

    with psycopg.connect(dsn, autocommit=True) as conn:
        for ddl in cc.TABLES_DDL:
            conn.execute(ddl)
    tid, run_id = _canceled_thread(dsn)
    before = _rows(dsn, tid)
    slow = psycopg.conninfo.make_conninfo(dsn, options="-c statement_timeout=100 -c lock_timeout=0")

    async def go() -> BaseException:
        async with AsyncDurablePostgresSaver.from_conn_string(slow, **cc.saver_options()) as saver:
            calls: dict[str, Any] = {
                "delete_for_runs": lambda: saver.adelete_for_runs([run_id]),
                "prune": lambda: saver.aprune([tid]),
                "prune_delete": lambda: saver.aprune([tid], strategy="delete"),
                "delete_thread": lambda: saver.adelete_thread(tid),
                "retain": lambda: aretain(saver, older_than_days=0),
                "gc": lambda: agc(saver, grace=0),
            }
            with psycopg.connect(dsn) as locker:
                locker.execute(f"LOCK TABLE {_LOCKED} IN ACCESS EXCLUSIVE MODE")
                try:
                    await calls[op]()
                except Exception as exc:
                    return exc
                finally:
                    locker.rollback()
            raise AssertionError(f"{op} was not canceled")

    exc = asyncio.run(go())
    named = tid if op in ("prune", "prune_delete", "delete_thread") else None
    _check_canceled(exc, "prune" if op == "prune_delete" else op, named)
    assert _rows(dsn, tid) == before, "a canceled operation changed the thread"


def test_retain_keeps_a_migrated_thread_whose_next_node_has_not_run(dsn: str) -> None:
    """Found by the long run ("retain deleted a thread that is not done", issue 11 item
    4): update_state on a new thread (no run, so no durable_threads row: retention
    judges it from its head, whose next node is n1), then migrate_threads, then retain.
    The update's checkpoint records no updated_channels; the migration wrote an empty
    list and bumped the note's version, so the completion check saw nothing pending
    and retain deleted the thread. Once a run finished it, retain deletes it."""
    from langgraph_durable import DurablePostgresSaver, migrate_threads, retain

    with psycopg.connect(dsn, autocommit=True) as conn:
        for ddl in cc.TABLES_DDL:
            conn.execute(ddl)
    tid = "migrated-pending-" + uuid.uuid4().hex[:8]
    config: Any = {"configurable": {"thread_id": tid}}
    with DurablePostgresSaver.from_conn_string(dsn, **cc.saver_options()) as saver:
        v1 = cc.build(dsn).compile(checkpointer=saver.bind(graph_version="v1", migrations=cc.registry()))
        v1.update_state(config, {"note": "c"})
        report = migrate_threads(saver, "v1", "v2", thread_ids=[tid], registry=cc.registry())
        assert report.migrated == [tid], report.as_dict()
        v2 = cc.build(dsn).compile(checkpointer=saver.bind(graph_version="v2", migrations=cc.registry()))
        assert v2.get_state(config).next == ("n1",)
        assert tmc.q(dsn, "SELECT 1 FROM durable_threads WHERE thread_id = %s", (tid,)) == []
        kept = retain(saver, older_than_days=0)
        assert tid not in kept.deleted_thread_ids, kept.as_dict()
        assert v2.get_state(config).values.get("note") == "c+m"
        v2.invoke(None, config)  # runs n1..n4: the thread is finished
        assert v2.get_state(config).next == ()
        assert tid in retain(saver, older_than_days=0).deleted_thread_ids


def test_run_child_of_a_thread_whose_head_is_damaged_quarantines_it(dsn: str) -> None:
    """The long run's "a run of a thread that does not load left it unquarantined"
    (item 13) after damage_row hit the head's envelope: the child's planning read
    (graph.get_state) raised CheckpointLoadError, rightly, and the child ended there,
    never starting the run whose start quarantines. Now it runs anyway."""
    machine = _machine(dsn)
    try:
        tid = machine.active()[0]
        machine.run_in_child((0, False, None))
        machine.wait_all(0)
        machine.model_holds()
        # damage_row's damage, aimed at the head's envelope (damage_row takes any row).
        rows = tmc.q(
            dsn,
            "UPDATE checkpoint_blobs SET blob = '\\xc1c1c1'::bytea WHERE thread_id = %s AND type = 'durable+ref' "
            "AND version = (SELECT max(version) FROM checkpoint_blobs WHERE thread_id = %s AND type = 'durable+ref') "
            "RETURNING channel",
            (tid, tid),
        )
        assert rows, "no envelope to damage"
        machine.threads[tid].damaged = True
        machine.model_holds()
        machine.run_in_child((0, False, None))
        machine.wait_all(0)  # raised the item 13 violation before the child ran the thread
        machine.model_holds()
        assert machine.db_status(tid) == "quarantined"
        out = tmc.q(dsn, "SELECT error_type FROM chaos_outcomes WHERE thread_id = %s ORDER BY at", (tid,))
        assert out[-1]["error_type"] == "langgraph_durable.errors.PoisonCheckpointError", out
    finally:
        machine.teardown()


def _index(machine: tmc.ChaosMachine, tid: str, kind: str | None = "run") -> int:
    return machine.active(kind).index(tid)


def test_delete_for_runs_rolls_back_the_copies_of_the_run_too(dsn: str) -> None:
    """The long run's "committed step lost" / "thread vanished" on a thread created by
    copy_thread, after delete_for_runs on its source. Not a saver defect: copy_thread
    copies metadata, run_id included (LangGraph's conformance test_copy_thread_preserves_
    metadata), and delete_for_runs deletes every checkpoint of the run, the copy's too;
    the model rolled back only the source. A copy left with nothing starts at turn 0."""
    machine = _machine(dsn)
    try:
        src = machine.active()[0]
        for _ in range(2):  # turns 0 and 1
            machine.run_in_child((0, False, None))
            machine.wait_all(0)
            machine.model_holds()
        assert len(machine.threads[src].runs) == 2
        machine.copy_thread(0, 0, False)
        machine.model_holds()
        (dst,) = [x for x in machine.active() if x != src]
        assert machine.threads[dst].min_log == machine.threads[src].min_log != []
        machine.delete_for_runs(_index(machine, src, None), 1)  # turn 1's run
        machine.model_holds()  # "committed step lost" on the copy before the model fix
        machine.delete_for_runs(_index(machine, src, None), 0)  # turn 0's run: nothing left
        machine.model_holds()
        assert tmc.q(dsn, "SELECT 1 FROM checkpoints WHERE thread_id = ANY(%s)", ([src, dst],)) == []
        machine.run_in_child((_index(machine, dst), False, None))
        machine.wait_all(0)
        machine.model_holds()  # "log starts at turn 1" before the model fix
        assert machine.threads[dst].min_log[:1] == [cc.entry(0, "n1")]
    finally:
        machine.teardown()


def test_run_that_ended_before_delete_for_runs_of_it_is_not_reasserted(dsn: str) -> None:
    """The long run's "committed step lost" on a source thread: an in-process run
    ended (lease released), delete_for_runs of its run id rolled it back, and only then
    did the machine reap the run and take its returned state as committed."""
    machine = _machine(dsn)
    try:
        tid = machine.active()[0]
        machine.run_in_process(0, 0)
        assert machine.inproc is not None
        machine.inproc[1].join(tmc.CHILD_WAIT)  # ended, not reaped
        assert machine.inproc[3], "the in-process run returned nothing"
        machine.delete_for_runs(0, 0)
        assert machine.threads[tid].epoch == 1, "delete_for_runs was refused"
        machine.tick(0.0)  # reaps the run
        machine.model_holds()  # raised "committed step lost" before the model fix
    finally:
        machine.teardown()


def test_retain_of_a_live_run_finishing_meanwhile_is_judged_when_it_ends(dsn: str) -> None:
    """The long run's "retain deleted a thread that is not done" for a thread whose
    in-process run was in its last node when retain took its snapshot and had finished
    (status 'done', lease released) when retain judged it: allowed."""
    machine = _machine(dsn)
    try:
        tid = machine.active()[0]
        machine.run_in_process(0, 0)
        assert machine.inproc is not None
        run = machine.inproc[1]
        deadline = time.monotonic() + 60
        while not tmc.q(dsn, "SELECT 1 FROM chaos_node_runs WHERE thread_id = %s AND node = 'n4'", (tid,)):
            assert time.monotonic() < deadline and run.is_alive(), "the run never reached n4"
            time.sleep(0.005)
        try_head = machine.try_head

        def snapshot_then_finish(x: str) -> Any:
            got = try_head(x)
            run.join(tmc.CHILD_WAIT)  # the run ends between the snapshot and retain
            return got

        machine.try_head = snapshot_then_finish  # type: ignore[method-assign]
        machine.retain(0)  # raised the item 4 violation before the model fix
        machine.try_head = try_head  # type: ignore[method-assign]
        assert machine.threads[tid].deleted, "retain kept the finished thread"
        machine.model_holds()
        machine.tick(0.0)
        machine.model_holds()
    finally:
        machine.teardown()


def test_delete_for_runs_of_a_migrated_head_takes_the_migrated_note_with_it(dsn: str) -> None:
    """The long run's "accepted update_state overwritten (note)" (item 3) after migrate
    then delete_for_runs: the migration rewrote the head in place (the note became '+m')
    and the head, a checkpoint of the deleted run, went with the run. A rollback on
    purpose, not a lost update: the model relearns the note."""
    machine = _machine(dsn)
    try:
        tid = machine.active()[0]
        machine.update_state_in_process(0, 0, "a")  # a checkpoint of no run: it stays
        machine.model_holds()
        machine.run_in_child((0, False, None))
        machine.wait_all(0)
        machine.model_holds()
        machine.migrate(0, 0)
        assert machine.threads[tid].version == "v2" and machine.threads[tid].note == "a+m"
        machine.model_holds()
        epoch = machine.threads[tid].epoch
        machine.delete_for_runs(0, 0)
        assert machine.threads[tid].epoch == epoch + 1, "delete_for_runs was refused"
        machine.model_holds()  # raised the item 3 violation before the model fix
        assert machine.head(tid) is not None and machine.threads[tid].note == "a"
    finally:
        machine.teardown()


def _damage_head(dsn: str, tid: str) -> None:
    """damage_row's damage, aimed at the head's envelope (damage_row takes any row)."""
    rows = tmc.q(
        dsn,
        "UPDATE checkpoint_blobs SET blob = '\\xc1c1c1'::bytea WHERE thread_id = %s AND type = 'durable+ref' "
        "AND version = (SELECT max(version) FROM checkpoint_blobs WHERE thread_id = %s AND type = 'durable+ref') "
        "RETURNING channel",
        (tid, tid),
    )
    assert rows, "no envelope to damage"


def test_copy_of_a_damaged_thread_is_damaged_too(dsn: str) -> None:
    """The long run's "thread unloadable and not quarantined" on a copy: copy_thread
    copies the damaged envelope row with the rest, so the copy does not load either
    (CheckpointLoadError, typed: right); the model took the copy for a sound thread."""
    machine = _machine(dsn)
    try:
        src = machine.active()[0]
        machine.run_in_child((0, False, None))
        machine.wait_all(0)
        machine.model_holds()
        _damage_head(dsn, src)
        machine.threads[src].damaged = True
        machine.model_holds()
        machine.copy_thread(0, 0, False)
        (dst,) = [x for x in machine.active() if x != src]
        machine.model_holds()  # raised the item 2/NEW violation before the model fix
        with pytest.raises(tmc.CheckpointLoadError):
            machine.head(dst)
        machine.run_in_child((machine.active("run").index(dst), False, None))
        machine.wait_all(0)  # a run of the copy quarantines it
        machine.model_holds()
        assert machine.db_status(dst) == "quarantined"
    finally:
        machine.teardown()
