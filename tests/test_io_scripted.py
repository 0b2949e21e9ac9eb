"""The saver's op generators driven by the scripted driver: no database, no socket.

Fencing, dead-owner takeover, exit outcomes, the version gate and the @idempotent
ledger protocol are decided by the ops' own logic on the rows they get back; ``ScriptedDriver`` (the generated sync driver with
its I/O replaced) feeds them rows and records what they send. The real-PostgreSQL tests
(test_leases, test_seams_lease, test_versioning, ...) check the SQL's side of each rule.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple, empty_checkpoint

from langgraph_durable._io import Batch, Hook, Sleep, Stmt, Tx
from langgraph_durable._io.protocol import Results
from langgraph_durable._io.scripted import Script, ScriptedDriver
from langgraph_durable.config import SaverOptions
from langgraph_durable.errors import (
    CallInFlightError,
    GraphVersionMismatchError,
    IdempotencyConflictError,
    LeaseLostError,
    OutcomeUnknownError,
    ThreadBusyError,
)
from langgraph_durable.idempotency.call import _Call, _Spec
from langgraph_durable.idempotency.protocol import _protocol, _tx_protocol
from langgraph_durable.leases.model import _RUN_LEASE, Lease
from langgraph_durable.leases.owners import _incarnation, process_identity
from langgraph_durable.saver import _DurableBase
from langgraph_durable.sql import ledger as ledger_sql

# The ops under test, from where they live today (one place: the lead fixes imports).
from langgraph_durable.sql import threads as threads_sql

THREAD = "t-1"


def _saver(**options: Any) -> _DurableBase:
    """The saver's logic without its I/O (no connection: the ops are driven here)."""
    return _DurableBase(options=SaverOptions.from_keywords(**options))


@pytest.fixture
def lease() -> Iterator[Lease]:
    lease = Lease(THREAD, owner="me:1", token=7, attempts=1, checkpoint_id="c0", version=None)
    token = _RUN_LEASE.set(lease)
    yield lease
    _RUN_LEASE.reset(token)


def _put(saver: _DurableBase, checkpoint_id: str = "1ef0") -> Any:
    config: RunnableConfig = {"configurable": {"thread_id": THREAD, "checkpoint_ns": ""}}
    checkpoint = empty_checkpoint()
    checkpoint["id"] = checkpoint_id
    return lambda: saver._op_put(config, checkpoint, {"source": "loop", "step": 1}, {})


def _sql_error(sqlstate: str, detail: str | None = None) -> psycopg.Error:
    """A server error as psycopg raises it, with the SQLSTATE (and DETAIL) the fence uses."""
    diag = type("Diag", (), {"message_detail": detail})()
    cls = type("FenceError", (psycopg.errors.RaiseException,), {"sqlstate": sqlstate, "diag": diag})
    return cls(f"raised {sqlstate}")


# --------------------------------------------------------------------------- the driver


def test_named_results_and_positions() -> None:
    rows = Results([[{"a": 1}], []], [Stmt("x", name="claim"), Stmt("y")])
    assert rows["claim"] == rows[0] == [{"a": 1}]
    assert rows[1] == [] and rows[-1] == [] and len(rows) == 2
    with pytest.raises(KeyError, match="no statement named 'read'"):
        rows["read"]


def test_op_runs_to_its_first_statement_before_a_connection_is_checked_out() -> None:
    driver = ScriptedDriver(Script().on("SELECT 1", [{"n": 1}]))

    def op() -> Any:
        driver.mark("encode")  # what a put does before its batch: encode, compress
        rows = yield Batch([Stmt("SELECT 1", fetch=True)])
        driver.mark("decode")
        return rows[0][0]["n"]

    assert driver.run_op(op) == 1
    kinds = [e[0] for e in driver.events]
    assert kinds == ["encode", "checkout", "begin", "stmt", "decode", "commit", "checkin"]


def test_op_without_statements_needs_no_connection() -> None:
    driver = ScriptedDriver()

    def op() -> Any:
        return "pure"
        yield  # pragma: no cover

    assert driver.run_op(op) == "pure"
    assert driver.events == []


def test_connection_failure_retries_the_whole_op_on_a_fresh_connection() -> None:
    driver = ScriptedDriver(Script().on("SELECT 1", psycopg.OperationalError("gone"), [{"n": 1}]))
    started: list[int] = []

    def op() -> Any:
        started.append(1)
        rows = yield Batch([Stmt("SELECT 1", fetch=True)])
        return rows[0][0]["n"]

    driver.conn_obj.broken = True  # the failed statement left the connection broken
    assert driver.run_op(op) == 1
    assert len(started) == 2 and len(driver.sleeps) == 1
    assert [e[0] for e in driver.events].count("checkout") == 2


def test_flow_items_and_interrupts() -> None:
    driver = ScriptedDriver()
    seen: list[Any] = []

    def interrupted() -> None:
        raise KeyboardInterrupt

    def flow() -> Any:
        seen.append((yield Hook(lambda x: x * 2, (21,))))
        yield Sleep(0.5)
        try:
            yield Hook(interrupted, interrupts=True)
        except KeyboardInterrupt:
            seen.append("interrupted")
        return "ok"

    assert driver.run_flow(flow()) == "ok"
    assert seen == [42, "interrupted"] and driver.sleeps == [0.5]

    def plain() -> Any:
        try:
            yield Hook(interrupted)
        except KeyboardInterrupt:  # pragma: no cover - not thrown in without interrupts=True
            return "caught"

    with pytest.raises(KeyboardInterrupt):
        driver.run_flow(plain())


# --------------------------------------------------------------------------- fencing


def test_put_under_a_lost_lease_raises_lease_lost(lease: Lease) -> None:
    """The fence is folded into the put's upsert; its LGD01 refusal is LeaseLostError
    and the lease is marked lost, so the run's next write fails without a round trip."""
    saver = _saver()
    driver = ScriptedDriver(Script().on("durable_put_guard|INSERT INTO checkpoints", _sql_error(threads_sql.FENCE_LOST_STATE)))
    with pytest.raises(LeaseLostError):
        driver.run_op(_put(saver))
    assert lease.lost
    sql, params = driver.statements[-1]
    # The put carries the run's fence: the lease probe's token, owner, thread (it reads
    # the cancel flag too), the order check's 7 parameters, then the failure's thread
    # and token (guard_params).
    assert "durable_guard_fail('lost'" in sql and "WHEN true THEN false" in sql
    assert (7, "me:1", THREAD) == tuple(params[-12:-9])
    assert (THREAD, 7) == tuple(params[-2:])
    with pytest.raises(LeaseLostError):
        ScriptedDriver().run_op(_put(saver))  # lost: refused before any statement


def test_put_into_a_thread_leased_elsewhere_raises_busy() -> None:
    saver = _saver()
    detail = '{"owner": "other:9", "expires_in": 12.5}'
    driver = ScriptedDriver(Script().on("INSERT INTO checkpoints", _sql_error(threads_sql.FENCE_BUSY_STATE, detail)))
    with pytest.raises(ThreadBusyError) as info:
        driver.run_op(_put(saver))
    assert "other:9" in str(info.value)
    sql, params = driver.statements[-1]
    # No lease of ours: no lease check, the foreign-lease check (thread twice), the order check.
    assert "durable_guard_fail('busy'" in sql and "durable_guard_fail('lost'" not in sql
    assert tuple(params[-9:-7]) == (THREAD, THREAD)


def test_put_with_a_held_lease_commits_and_returns_its_config(lease: Lease) -> None:
    saver = _saver()
    driver = ScriptedDriver()
    out = driver.run_op(_put(saver, "1ef1"))
    assert out["configurable"]["checkpoint_id"] == "1ef1" and not lease.lost


# --------------------------------------------------------------------------- takeover


def _dead_owner() -> str:
    """The owner id a process of this machine that has exited would have written."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    pid = int(child.stdout)
    host, _, incarnation, namespace = process_identity().split(":")
    boot = incarnation.split(".", 1)[0]
    assert _incarnation(pid) is None, "the child's pid was reused already"
    assert _incarnation(1) is not None, "psutil cannot read process start times here"
    return f"{host}:{pid}:{boot}.1:{namespace}:abc123"


def _contended(saver: _DurableBase, driver: ScriptedDriver) -> dict[str, Any]:
    result: dict[str, Any] = driver.run_op(
        lambda: saver._op_acquire_contended(THREAD, "me:2", None, None)
    )
    return result


def test_lease_of_a_dead_process_of_this_machine_is_taken_over() -> None:
    holder = _dead_owner()
    acquired = {"lease_token": 8, "attempts": 1, "checkpoint_id": "c0", "prev_status": "running"}
    script = Script().on_sql(threads_sql.THREAD_LEASE_ROW_SQL, [{"status": "running", "lease_owner": holder}])
    script.on_sql(threads_sql.LEASE_ACQUIRE_SQL, [acquired])
    driver = ScriptedDriver(script)
    res = _contended(_saver(), driver)
    assert res["ok"] and res["lease_token"] == 8
    (_, read), (_, take) = driver.statements
    assert take["dead_owner"] == holder and take["owner"] == "me:2"


def test_lease_of_a_live_or_foreign_owner_is_not_taken_over() -> None:
    for holder in (f"{process_identity()}:live", "another-host:1:1.1:ns1.b:ff"):
        script = Script().on_sql(threads_sql.THREAD_LEASE_ROW_SQL, [{"status": "running", "lease_owner": holder, "expires_in": 5}])
        driver = ScriptedDriver(script)
        res = _contended(_saver(), driver)
        assert res == {"ok": False, "checkpoint_id": None, "status": "running", "lease_owner": holder, "expires_in": 5}
        assert len(driver.statements) == 1  # the read only: no takeover attempted


def test_takeover_disabled_waits_for_expiry() -> None:
    holder = _dead_owner()
    driver = ScriptedDriver(Script().on_sql(threads_sql.THREAD_LEASE_ROW_SQL, [{"status": "running", "lease_owner": holder}]))
    res = _contended(_saver(takeover_dead_owners=False), driver)
    assert res["ok"] is False and len(driver.statements) == 1


def test_quarantined_thread_is_never_taken_over() -> None:
    holder = "gone"
    driver = ScriptedDriver(Script(strict=True).on_sql(threads_sql.THREAD_LEASE_ROW_SQL, [{"status": "quarantined", "lease_owner": holder}]))
    res = _contended(_saver(), driver)
    assert res["ok"] is False and res["status"] == "quarantined" and len(driver.statements) == 1


# --------------------------------------------------------------------------- exit outcomes


class _Loop:
    def __init__(self, status: str | None, head: str | None = "c0", writes: Any = ()) -> None:
        self.status = status
        self.checkpoint_config = {"configurable": {"checkpoint_id": head}}
        self.checkpoint_pending_writes = list(writes)


def _release(loop: _Loop, exc: BaseException | None) -> tuple[dict[str, Any], list[Any]]:
    saver = _saver()
    lease = Lease(THREAD, owner="me:1", token=3, attempts=2, checkpoint_id="c0", version=None)
    driver = ScriptedDriver()
    driver.run_flow(saver._release_flow(lease, loop, exc))
    assert lease.released
    release = [p for sql, p in driver.statements if sql == threads_sql.LEASE_RELEASE_SQL]
    assert len(release) == 1
    return release[0], driver.statements


@pytest.mark.parametrize(
    ("loop", "exc", "expected"),
    [
        (_Loop("done"), None, ("done", True, False, None)),
        (_Loop("interrupt_before"), None, ("waiting", True, False, None)),
        (_Loop(None, writes=[("task", "__interrupt__", 1)]), None, ("waiting", True, False, None)),
        (_Loop("pending"), None, ("stopped", False, True, None)),
        (_Loop("pending"), KeyboardInterrupt(), ("stopped", False, True, None)),
        (_Loop("pending"), ValueError("boom"), ("error", False, False, "ValueError: boom")),
    ],
    ids=["done", "interrupted", "interrupt-write", "stopped", "killed", "error"],
)
def test_exit_outcome(loop: _Loop, exc: BaseException | None, expected: tuple[Any, ...]) -> None:
    params, stmts = _release(loop, exc)
    assert (params["status"], params["reset"], params["undo"], params["error"]) == expected
    assert (params["thread_id"], params["token"], params["owner"]) == (THREAD, 3, "me:1")
    # A failed run also records its failure (issue 25), fenced like the release.
    failures = [p for sql, p in stmts if sql == threads_sql.RECORD_FAILURE_SQL]
    assert len(stmts) == 1 + len(failures) and len(failures) == (exc is not None and expected[0] == "error")
    for f in failures:
        assert (f["thread_id"], f["token"], f["owner"]) == (THREAD, 3, "me:1")
        assert f["failure"].obj["type"] == "builtins.ValueError" and f["failure"].obj["message"] == "boom"


def test_failure_past_the_start_checkpoint_counts_as_a_first_attempt_there() -> None:
    params, stmts = _release(_Loop("pending", head="c5"), RuntimeError("late"))
    assert params["status"] == "error" and params["reset"] is False
    moved_sql, moved_params = stmts[0]
    assert "attempts = 1" in moved_sql and moved_params == ("c5", THREAD, 3, "me:1")


# --------------------------------------------------------------------------- version gate


def _saved(version: str | None) -> CheckpointTuple:
    metadata: Any = {"step": 1} if version is None else {"step": 1, "graph_version": version}
    return CheckpointTuple({"configurable": {"thread_id": THREAD}}, empty_checkpoint(), metadata)


def _gate(saver: _DurableBase, saved: CheckpointTuple, current: str | None, policy: str) -> tuple[Any, ScriptedDriver]:
    driver = ScriptedDriver(Script().on("durable_graph_versions", []))
    return driver.run_flow(saver._flow_check_version(THREAD, saved, current, policy)), driver


def test_same_version_passes_without_a_statement() -> None:
    saved = _saved("v1")
    out, driver = _gate(_saver(), saved, "v1", "refuse")
    assert out is saved and driver.events == []


def test_other_version_is_refused_by_strict_and_refuse() -> None:
    for policy in ("strict", "refuse"):
        with pytest.raises(GraphVersionMismatchError) as info:
            _gate(_saver(), _saved("v1"), "v2", policy)
        assert "v1" in str(info.value) and "v2" in str(info.value)


def test_warn_and_auto_upgrade_resume_on_another_version() -> None:
    saved = _saved("v1")
    out, driver = _gate(_saver(), saved, "v2", "warn")
    assert out is saved and len(driver.statements) == 1  # the stored topologies were read
    out, driver = _gate(_saver(), saved, "v2", "auto-upgrade")
    assert out is saved and driver.events == []


def test_unversioned_thread_adopted_or_refused() -> None:
    saved = _saved(None)
    out, _ = _gate(_saver(), saved, "v2", "refuse")
    assert out is saved  # unversioned_policy="adopt" (the default)
    with pytest.raises(GraphVersionMismatchError):
        _gate(_saver(unversioned_policy="refuse"), saved, "v2", "refuse")


def test_tx_transaction_false_runs_without_begin() -> None:
    driver = ScriptedDriver()

    def op() -> Any:
        yield Batch([Stmt("SELECT 1")])

    def flow() -> Any:
        yield Tx(op, transaction=False)
        yield Tx(op)

    driver.run_flow(flow())
    kinds = [e[0] for e in driver.events]
    assert kinds == ["checkout", "stmt", "checkin", "checkout", "begin", "stmt", "commit", "checkin"]


# --------------------------------------------------------------------------- @idempotent


def _call(fn: Any, **spec: Any) -> _Call:
    options: dict[str, Any] = {
        "fn": fn, "name": "charge", "key": None, "ttl": None, "on_unknown": "raise",
        "cache_failures": (), "transactional": False, "wait_timeout": 5.0, "claim_ttl": 30.0,
        "exclude": frozenset(), "ledger": None, "is_async": False, "signature": None,
        "public": None, "takes_key": False,
    }
    options.update(spec)
    return _Call(
        spec=_Spec(**options), ledger=_saver(), key="call:k", fingerprint="fp", preview="",
        thread_id=THREAD, origin=THREAD, checkpoint_ns="", task_id="task", ttl=None,
        claim_ttl=30.0, invoke=lambda conn: fn(),
    )


def _row(call: _Call, **row: Any) -> dict[str, Any]:
    dumped = call.serde.dumps_typed(row.pop("value", None))
    base = {"fingerprint": call.fingerprint, "status": "completed", "owner": "other", "live": False,
            "result_type": dumped[0], "result": dumped[1], "thread_id": THREAD,
            "origin_thread_id": THREAD, "name": "charge", "attempts": 1}
    return {**base, **row}


def _run_call(call: _Call, script: Script) -> tuple[Any, ScriptedDriver]:
    driver = ScriptedDriver(script)
    return driver.run_flow(_protocol(call)), driver


def _sent(driver: ScriptedDriver) -> list[str]:
    names = {v: k for k, v in vars(ledger_sql).items() if k.startswith("LEDGER_")}
    return [names.get(sql, sql) for sql, _ in driver.statements]


def test_claimed_call_runs_once_and_is_recorded() -> None:
    runs: list[int] = []
    call = _call(lambda: runs.append(1) or "paid")
    script = Script().on_sql(ledger_sql.LEDGER_CLAIM_SQL, [{"key": call.key}])
    script.on_sql(ledger_sql.LEDGER_COMPLETE_SQL, [{"key": call.key}])
    value, driver = _run_call(call, script)
    assert value == "paid" and runs == [1]
    assert _sent(driver) == ["LEDGER_CLAIM_SQL", "LEDGER_READ_SQL", "LEDGER_COMPLETE_SQL"]


def test_recorded_call_replays_without_running() -> None:
    call = _call(lambda: pytest.fail("a recorded call must not run again"))
    value, driver = _run_call(call, Script().on_sql(ledger_sql.LEDGER_READ_SQL, [_row(call, value="paid")]))
    assert value == "paid" and _sent(driver) == ["LEDGER_CLAIM_SQL", "LEDGER_READ_SQL"]


def test_other_arguments_under_the_same_key_conflict() -> None:
    call = _call(lambda: "x")
    script = Script().on_sql(ledger_sql.LEDGER_READ_SQL, [_row(call, fingerprint="other-fp")])
    with pytest.raises(IdempotencyConflictError):
        _run_call(call, script)


def test_live_claim_elsewhere_is_waited_for_then_taken_over_when_free() -> None:
    call = _call(lambda: "ran")
    script = Script().on_sql(ledger_sql.LEDGER_CLAIM_SQL, [], [{"key": call.key}])
    script.on_sql(ledger_sql.LEDGER_READ_SQL, [_row(call, status="started", live=True)])
    script.on_sql(ledger_sql.LEDGER_COMPLETE_SQL, [{"key": call.key}])
    value, driver = _run_call(call, script)
    assert value == "ran" and len(driver.sleeps) == 1


def test_in_flight_past_wait_timeout_raises() -> None:
    call = _call(lambda: "x", wait_timeout=0.0)
    script = Script().on_sql(ledger_sql.LEDGER_READ_SQL, [_row(call, status="started", live=True)])
    with pytest.raises(CallInFlightError):
        _run_call(call, script)


def test_expired_claim_is_an_unknown_outcome_or_retried() -> None:
    call = _call(lambda: "again")
    expired = Script().on_sql(ledger_sql.LEDGER_READ_SQL, [_row(call, status="started")])
    with pytest.raises(OutcomeUnknownError):
        _run_call(call, expired)
    call = _call(lambda: "again", on_unknown="retry")
    retry = Script().on_sql(ledger_sql.LEDGER_READ_SQL, [_row(call, status="started")])
    retry.on_sql(ledger_sql.LEDGER_TAKEOVER_SQL, [{"attempts": 2}])
    retry.on_sql(ledger_sql.LEDGER_COMPLETE_SQL, [{"key": call.key}])
    value, driver = _run_call(call, retry)
    assert value == "again" and "LEDGER_TAKEOVER_SQL" in _sent(driver)


@pytest.mark.parametrize(
    ("exc", "cache", "expected"),
    [
        (ValueError("declined"), (), "LEDGER_RELEASE_SQL"),  # did not happen: run again next time
        (ValueError("declined"), (ValueError,), "LEDGER_FAIL_SQL"),  # cached failure
        (KeyboardInterrupt(), (), "LEDGER_ABANDON_SQL"),  # interrupted mid-call: unknown
    ],
    ids=["released", "failed", "abandoned"],
)
def test_failed_call_outcome(exc: BaseException, cache: tuple[type[BaseException], ...], expected: str) -> None:
    def fn() -> Any:
        raise exc

    call = _call(fn, cache_failures=cache)
    script = Script().on_sql(ledger_sql.LEDGER_CLAIM_SQL, [{"key": call.key}])
    driver = ScriptedDriver(script)
    with pytest.raises(type(exc)):
        driver.run_flow(_protocol(call))
    assert _sent(driver)[-1] == expected


def test_transactional_call_runs_in_a_savepoint_of_the_claims_transaction() -> None:
    conns: list[Any] = []
    call = _call(lambda: "written", transactional=True)
    call.invoke = lambda conn: conns.append(conn) or "written"
    script = Script().on("current_setting", [{"v": "0"}]).on_sql(ledger_sql.LEDGER_CLAIM_SQL, [{"key": call.key}])
    driver = ScriptedDriver(script)
    outcome = driver.run_op(lambda: _tx_protocol(call, 0.0))
    assert outcome.unwrap() == "written" and conns == [driver.conn_obj]
    kinds = [e[0] for e in driver.events]
    # BEGIN, the claim batch, lock_timeout restored, SAVEPOINT (the call), record, COMMIT.
    assert kinds == ["checkout", "begin", "stmt", "stmt", "stmt", "stmt", "stmt", "begin", "commit", "stmt", "commit", "checkin"]


def test_transactional_call_failure_rolls_its_savepoint_back_and_releases_the_key() -> None:
    def fn(conn: Any) -> Any:
        raise ValueError("constraint")

    call = _call(lambda: None, transactional=True)
    call.invoke = fn
    script = Script().on("current_setting", [{"v": "0"}]).on_sql(ledger_sql.LEDGER_CLAIM_SQL, [{"key": call.key}])
    driver = ScriptedDriver(script)
    outcome = driver.run_op(lambda: _tx_protocol(call, 0.0))
    with pytest.raises(ValueError, match="constraint"):
        outcome.unwrap()
    kinds = [e[0] for e in driver.events]
    assert kinds[-5:] == ["begin", "rollback", "stmt", "commit", "checkin"]
    assert _sent(driver)[-1] == "LEDGER_RELEASE_SQL"
