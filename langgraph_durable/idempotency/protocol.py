"""The ledger protocol of one call, written once: claim, run, record (plain) or one
transaction (transactional); run by the sync or the async driver (``Mode``).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import logging
import time
from collections.abc import (
    Callable,
    Generator,
    Mapping,
)
from dataclasses import dataclass
from typing import Any, cast

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_durable import _sealing, granularity
from langgraph_durable import telemetry as _telemetry
from langgraph_durable._acked import ACKED, Acked, current_result
from langgraph_durable._io import (
    AsyncDriver,
    Batch,
    Call,
    Hook,
    Sleep,
    Stmt,
    SyncDriver,
    Tx,
    aconnect,
    connect,
)
from langgraph_durable.core.base import _DurableBase
from langgraph_durable.errors import (
    AcknowledgedWorkLostError,
    CallInFlightError,
    IdempotencyConflictError,
    IdempotencyError,
    IdempotentCallFailedError,
    LeaseLostError,
    OutcomeUnknownError,
    SerializationError,
    UnstableKeyError,
)
from langgraph_durable.idempotency.call import _Call
from langgraph_durable.idempotency.keys import _PARENT, _Parent
from langgraph_durable.idempotency.renewer import _RENEWER
from langgraph_durable.leases.fence import report_work_lost
from langgraph_durable.leases.model import _RUN_LEASE, Lease
from langgraph_durable.leases.owners import owner_is_dead
from langgraph_durable.pooler import session_schema
from langgraph_durable.saver import AsyncDurablePostgresSaver, DurablePostgresSaver
from langgraph_durable.sql.checkpoints import CHECKPOINT_HEAD_SQL
from langgraph_durable.sql.ledger import (
    LEDGER_ABANDON_SQL,
    LEDGER_CHECKPOINT_STORED_SQL,
    LEDGER_CLAIM_SQL,
    LEDGER_COMPLETE_SQL,
    LEDGER_FAIL_SQL,
    LEDGER_LEASE_HELD_SQL,
    LEDGER_LEGACY_TOOL_KEY_SQL,
    LEDGER_READ_SQL,
    LEDGER_RELEASE_SQL,
    LEDGER_TAKEOVER_SQL,
)

logger = logging.getLogger("langgraph_durable.idempotency")

# --- the protocol -----------------------------------------------------------------------


@dataclass
class _Outcome:
    value: Any = None
    error: BaseException | None = None

    def unwrap(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


def _op_claim(call: _Call) -> Generator[Any, Any, tuple[bool, dict[str, Any] | None]]:
    rows = yield Batch(
        [
            Stmt(LEDGER_CLAIM_SQL, call.params(), fetch=True, name="claim"),
            Stmt(LEDGER_READ_SQL, (call.key,), fetch=True, name="row"),
        ]
    )
    row = rows["row"][0] if rows["row"] else None
    # A 'started' row under this call's own owner (unique per call) is this very claim:
    # it committed, the reply to the COMMIT was lost and the driver ran the op again.
    # The function has not run yet: proceed, not "in flight" / "outcome unknown".
    mine = row is not None and row["status"] == "started" and row["owner"] == call.owner
    return bool(rows["claim"]) or mine, row


def _op_one(sql: str, params: Any) -> Generator[Any, Any, list[dict[str, Any]]]:
    rows = yield Batch([Stmt(sql, params, fetch=True)])
    return cast("list[dict[str, Any]]", rows[0])


def _op_exec(sql: str, params: Any) -> Generator[Any, Any, None]:
    yield Batch([Stmt(sql, params)])


def _tx(sql: str, params: Any, *, fetch: bool = True) -> Tx:
    """A flow item: one statement in its own transaction (its rows, if ``fetch``)."""
    return Tx(functools.partial(_op_one if fetch else _op_exec, sql, params))


def _decode(call: _Call, row: Mapping[str, Any]) -> Any:
    try:
        return call.serde.loads_typed((row["result_type"], bytes(row["result"] or b"")))
    except Exception as exc:
        wrong_key = _sealing.decrypt_failure(
            call.serde, str(row["result_type"]), exc, thread_id=call.thread_id or call.origin,
            where=f"the recorded result of idempotency key {call.key!r}",
        )
        if wrong_key is not None:
            raise wrong_key from exc
        raise SerializationError(
            f"the recorded result of idempotency key {call.key!r} cannot be decoded: "
            f"{type(exc).__name__}: {exc}",
            value_type=str(row["result_type"]),
            key=call.key,
        ) from exc


def _encode(call: _Call, result: Any) -> tuple[str, bytes, Any]:
    """(type, bytes, the value a replay will return). The first caller gets the
    round-tripped value too, so first run and replays see the same thing."""
    try:
        tag, data = call.serde.dumps_typed(result)
        return tag, data, call.serde.loads_typed((tag, data))
    except Exception as exc:
        raise SerializationError(
            f"the result of {call.spec.name!r} (idempotency key {call.key!r}, a "
            f"{type(result).__qualname__}) cannot be serialized by the saver's serializer: "
            f"{exc}. The call ran: its key is now recorded as failed so the effect is not "
            "repeated (transactional=True: its writes were rolled back instead).",
            value_type=type(result).__qualname__,
            key=call.key,
        ) from exc


def _error_text(call: _Call, text: str) -> str:
    """A failed call's error text as stored: sealed with an encrypting serializer."""
    return _sealing.seal_text(_sealing.keyring_of(call.serde), text) or text


@_telemetry.instrument("ledger_judge")
def _judge(call: _Call, row: Mapping[str, Any]) -> str:
    """What to do with someone else's row: 'replay', 'wait' or 'takeover' (raises the
    terminal outcomes)."""
    if row["fingerprint"] != call.fingerprint and (
        row["fingerprint"] not in call.legacy_fingerprints
    ):
        raise IdempotencyConflictError(call.key, row["fingerprint"], call.fingerprint)
    if row["status"] == "completed":
        return "replay"
    if row["status"] == "failed":
        error = _sealing.open_text(
            _sealing.keyring_of(call.serde), row["error"], thread_id=call.thread_id or call.origin,
            where=f"the recorded error of idempotency key {call.key!r}",
        )
        raise IdempotentCallFailedError(call.key, row["error_type"], error)
    if _live(row):
        return "wait"
    if call.spec.on_unknown == "retry":
        return "takeover"
    raise OutcomeUnknownError(
        call.key,
        row["thread_id"] or row["origin_thread_id"],
        row["name"],
        int(row["attempts"] or 1),
    )


def _live(row: Mapping[str, Any]) -> bool:
    """Whether a 'started' row's claim is held by a live caller: its claim lease runs
    and its owner is not a provably dead process of this machine. A dead owner's claim
    is judged dead as soon as its run's lease is (the same ``owner_is_dead``, one
    mechanism): the resume that took the lease over at once does not then wait out the
    claim's ``claim_ttl`` (the lease's ttl by default) to learn the outcome is unknown."""
    return bool(row["live"]) and not owner_is_dead(row["owner"])


def _is_bubble(exc: BaseException) -> bool:
    from langgraph.errors import GraphBubbleUp

    return isinstance(exc, GraphBubbleUp)


def _await_checkpoint(call: _Call) -> Generator[Any, Any, None]:
    """Wait until the checkpoint the task was prepared from is stored.

    A derived key hashes the task id, which hashes that checkpoint's id. With the
    default durability ("async") LangGraph stores the checkpoint in the background while
    the task already runs; if the process died before it was stored, the resumed run
    would prepare the task again from a *new* checkpoint (new id, new task id, new
    key) and the effect would run twice. Claiming only once the checkpoint is stored
    closes that window; with durability "sync" the first check already succeeds."""
    if call.await_checkpoint is None:
        return
    started, delay = time.monotonic(), 0.005
    while True:
        lease = _RUN_LEASE.get()
        if lease is not None and lease.thread_id != call.await_checkpoint[0]:
            lease = None
        # Before the read: a put acknowledged after it is not yet visible to it.
        acked = lease is not None and lease.acknowledged(call.await_checkpoint[1])
        rows = yield _tx(LEDGER_CHECKPOINT_STORED_SQL, call.await_checkpoint)
        if rows and rows[0]["ok"]:
            if call.task_state is not None:
                call.task_state.stored = True
            return
        if lease is not None:
            yield from _check_work_lost(lease, call.await_checkpoint[1], acked)
            held = yield _tx(LEDGER_LEASE_HELD_SQL, (lease.thread_id, lease.token, lease.owner))
            if lease.lost or not (held and held[0]["held"]):
                lease.lost = True
                raise LeaseLostError(lease.thread_id, lease.token)
        waited = time.monotonic() - started
        if waited >= max(call.spec.wait_timeout, 1.0):
            raise UnstableKeyError(
                call.await_checkpoint[0],
                call.await_checkpoint[1],
                f"the checkpoint this task runs from was not stored after {waited:.1f} s",
            )
        yield Sleep(delay)
        delay = min(delay * 2, 0.2)


def _check_work_lost(lease: Lease, checkpoint_id: str, acked: bool) -> Generator[Any, Any, None]:
    """Raise AcknowledgedWorkLostError at once when the checkpoint awaited will never
    be stored (issue 23: it used to wait ``wait_timeout`` and then blame the key):
    this run's put found its history gone, or the checkpoint is one the server had
    for this run (``acked``: loaded at its start or acknowledged by a put before the
    read that did not find it) and has no more."""
    err = lease.work_lost
    if err is None and acked:
        ns = next((n for n, c in lease.acked.items() if c == checkpoint_id), "")
        rows = yield _tx(CHECKPOINT_HEAD_SQL, (lease.thread_id, ns))
        head = rows[0]["checkpoint_id"] if rows else None
        err = AcknowledgedWorkLostError(lease.thread_id, ns, checkpoint_id, head)
        report_work_lost(err, lease, "await")
    if err is not None:
        raise AcknowledgedWorkLostError(**err.fields)


def _adopt_legacy_key(call: _Call) -> Generator[Any, Any, None]:
    """Keep replaying a tool call that this task recorded before the upgrade.

    Tool keys used to be (thread, tool_call_id). A thread in flight across the upgrade
    may have run the tool under that key in the task that is now resumed; claiming the
    new key would run it a second time. The old row counts only if the same task made
    it (a later turn reusing ``call_0`` is another task, so it runs). Costs one indexed
    read per tool call; rows under the old scheme are never created any more."""
    if call.legacy_key is None or call.task_id is None:
        return
    rows = yield _tx(LEDGER_LEGACY_TOOL_KEY_SQL, (call.legacy_key, call.thread_id, call.task_id))
    if rows:
        # Only the key changes: a tool's invoke ignores the key it was built with, and
        # calls nested in it are keyed from call.key when it runs (_enter).
        call.key = call.legacy_key


def _protocol(call: _Call) -> Generator[Any, Any, Any]:
    """The plain (non-transactional) call: claim, run, record."""
    claimed, replayed = yield from _claim(call)
    if not claimed:
        return replayed
    try:
        # interrupts: a cancellation mid-call is thrown in too (the effect may have happened).
        result = yield Hook(_invoking(call, renew=True), (None,), interrupts=True)
    except BaseException as exc:
        yield from _record_failure(call, exc)
        raise exc
    return (yield from _record(call, result))


def _claim(call: _Call) -> Generator[Any, Any, tuple[bool, Any]]:
    """(True, None) once this call holds the key; (False, the recorded result) to replay."""
    started = time.monotonic()
    delay = 0.02
    logged = False
    restore_tried = False
    while True:
        claimed, row = yield Tx(lambda: _op_claim(call))
        if claimed:
            return True, None
        if row is None:  # released between our two statements: claim again
            continue
        if not restore_tried:
            restore_tried = True
            if (yield from _restore_own(call, row)):
                # The row changed (our record written again, or someone else's change
                # won the race): read it again and judge that, never the stale row.
                continue
        action = _judge(call, row)
        if action == "replay":
            return False, _decode(call, row)
        if action == "takeover":
            takeover = {
                "owner": call.owner,
                "claim_ttl": call.claim_ttl,
                "key": call.key,
                "old_owner": row["owner"],
                "owner_dead": bool(row["live"]),  # _judge found its owner dead
            }
            taken = yield _tx(LEDGER_TAKEOVER_SQL, takeover)
            if taken:
                logger.warning(
                    "re-running %s (idempotency key %r, attempt %s) after an unknown outcome "
                    "(on_unknown='retry')", call.spec.name, call.key, taken[0]["attempts"],
                )
                return True, None
            continue
        waited = time.monotonic() - started
        if waited >= call.spec.wait_timeout:
            raise CallInFlightError(call.key, waited)
        if not logged:
            logged = True
            logger.debug("call %s (key %r) is in flight elsewhere; waiting", call.spec.name, call.key)
        yield Sleep(min(delay, max(call.spec.wait_timeout - waited, 0.001)))
        delay = min(delay * 2, 0.5)


def _record_failure(call: _Call, exc: BaseException) -> Generator[Any, Any, None]:
    mine = (call.key, call.owner)
    if isinstance(exc, Exception) and not _is_bubble(exc) and call.spec.caches(exc):
        failed = (type(exc).__qualname__, _error_text(call, f"{exc}"[:4000]), *mine)
        yield _tx(LEDGER_FAIL_SQL, failed, fetch=False)
    elif isinstance(exc, Exception):
        # An exception (or an interrupt) means the call did not happen: run it again
        # next time.
        yield _tx(LEDGER_RELEASE_SQL, mine, fetch=False)
    else:  # cancelled / interrupted mid-call: the effect may have happened
        with contextlib.suppress(Exception):
            yield _tx(LEDGER_ABANDON_SQL, mine, fetch=False)


def _record(call: _Call, result: Any) -> Generator[Any, Any, Any]:
    try:
        tag, data, value = _encode(call, result)
    except SerializationError as err:
        failed = ("SerializationError", _error_text(call, err.message[:4000]), call.key, call.owner)
        yield _tx(LEDGER_FAIL_SQL, failed, fetch=False)
        raise
    done = yield _tx(LEDGER_COMPLETE_SQL, (tag, data, call.key, call.owner))
    if not done:
        # Completed by this call already (a retry after a lost COMMIT reply), or taken over.
        done = yield _tx(LEDGER_READ_SQL, (call.key,))
        done = [r for r in done if r["owner"] == call.owner and r["status"] == "completed"]
    if not done:
        logger.error(
            "the claim on idempotency key %r was taken over while %s ran (its claim lease "
            "expired: was the process stalled?); its result is not recorded",
            call.key, call.spec.name,
        )
    else:
        # Acknowledged: kept, in case a failover loses it (_acked).
        ACKED.remember(call.key, Acked(call.thread_id, call.owner, call.fingerprint, tag, data))
    return value


def _restore_own(call: _Call, row: Mapping[str, Any]) -> Generator[Any, Any, bool]:
    """Whether the row may have changed: ``row`` is this process's own claim of an
    earlier call whose record the server acknowledged and has lost since (an
    asynchronous failover), and the record was sent again from ``ACKED`` (written, or
    the row changed meanwhile). The caller reads the row again and judges it as usual:
    a call with other arguments under the same key meets IdempotencyConflictError, as
    it would had the record never been lost (review32). False: nothing to restore, the
    row is judged as it is. A kept result no configured key opens is not written back
    (``_acked.current_result``): the claim stays an unknown outcome an operator can
    resolve."""
    acked = ACKED.get(call.key) if row["status"] == "started" else None
    if acked is None or acked.owner != row["owner"] or acked.fingerprint != row["fingerprint"]:
        return False
    data = current_result(call.key, acked, call.serde)
    if data is None:
        logger.warning(
            "idempotency key %r: this process recorded the result of %s (claim %s) and the "
            "database has lost that record, but the kept result does not open with the "
            "configured keys: not written back, the outcome stays unknown (resolve it)",
            call.key, call.spec.name, acked.owner,
        )
        return False
    done = yield _tx(LEDGER_COMPLETE_SQL, (acked.result_type, data, call.key, acked.owner))
    if done:
        logger.warning(
            "idempotency key %r: this process recorded the result of %s (claim %s), and the "
            "database has lost that record (an asynchronous failover?): written again, the "
            "call not run again", call.key, call.spec.name, acked.owner,
        )
        _telemetry.count("ledger_records_restored", where="claim")
    return True


def _tx_protocol(call: _Call, started: float) -> Generator[Any, Any, _Outcome]:
    """The transactional call: one op, on a connection of its own (``_run_tx``); the
    function runs as a ``Call``, in a savepoint: its writes roll back if it fails, the
    claim stays. A lock wait past wait_timeout is CallInFlightError."""
    try:
        return (yield from _tx_steps(call))
    except psycopg.errors.LockNotAvailable as exc:
        raise CallInFlightError(call.key, time.monotonic() - started) from exc


def _tx_steps(call: _Call) -> Generator[Any, Any, _Outcome]:
    timeout_ms = max(int(call.spec.wait_timeout * 1000), 1)
    rows = yield Batch(
        [
            Stmt("SELECT current_setting('lock_timeout') AS v", fetch=True, name="previous"),
            Stmt("SELECT set_config('lock_timeout', %s, true)", (f"{timeout_ms}ms",)),
            Stmt(LEDGER_CLAIM_SQL, call.params(), fetch=True, name="claim"),
            Stmt(LEDGER_READ_SQL, (call.key,), fetch=True, name="row"),
        ]
    )
    previous = rows["previous"][0]["v"]
    if not rows["claim"]:
        row = rows["row"][0] if rows["row"] else None
        if row is None:
            return _Outcome(error=CallInFlightError(call.key, 0.0))
        try:
            action = _judge(call, row)
        except IdempotencyError as exc:
            return _Outcome(error=exc)
        if action == "replay":
            return _Outcome(value=_decode(call, row))
        if action == "wait":  # a plain (non-transactional) call holds it
            return _Outcome(error=CallInFlightError(call.key, 0.0))
        takeover = {
            "owner": call.owner, "claim_ttl": None, "key": call.key, "old_owner": row["owner"],
            "owner_dead": bool(row["live"]),
        }
        taken = yield Batch([Stmt(LEDGER_TAKEOVER_SQL, takeover, fetch=True)])
        if not taken[0]:
            return _Outcome(error=CallInFlightError(call.key, 0.0))
    yield Batch([Stmt("SELECT set_config('lock_timeout', %s, true)", (previous,))])
    try:
        result = yield Call(_invoking(call, renew=False))
    except Exception as exc:
        # The driver rolled the function's savepoint back: its writes are gone.
        if call.spec.caches(exc) and not _is_bubble(exc):
            failed = (type(exc).__qualname__, _error_text(call, f"{exc}"[:4000]), call.key, call.owner)
            yield Batch([Stmt(LEDGER_FAIL_SQL, failed)])
        else:
            yield Batch([Stmt(LEDGER_RELEASE_SQL, (call.key, call.owner))])
        return _Outcome(error=exc)
    # An unserializable result raises here, inside the transaction: the effect and the
    # claim roll back together, nothing is half-written.
    tag, data, value = _encode(call, result)
    yield Batch([Stmt(LEDGER_COMPLETE_SQL, (tag, data, call.key, call.owner), fetch=True)])
    return _Outcome(value=value)


def _call_flow(call: _Call, mode: Mode) -> Generator[Any, Any, Any]:
    """One wrapped call, sync or async alike (``mode`` says which)."""
    # A deferred checkpoint (checkpoint_policy) is stored before the key is claimed.
    yield Hook(mode.before_effect)
    if call.legacy_key is not None:
        yield from _adopt_legacy_key(call)
    yield from _await_checkpoint(call)
    if call.spec.transactional:
        outcome = yield Hook(_run_tx, (call, mode))
        return cast(_Outcome, outcome).unwrap()
    return (yield from _protocol(call))


# --- running it -------------------------------------------------------------------------


@dataclass(frozen=True)
class Mode:
    """What differs between a sync and an async call: the driver class, the saver and
    pool classes whose connections it can use, how it opens one of its own, the
    checkpoint_policy flush. Everything else is one body."""

    driver: type[SyncDriver] | type[AsyncDriver]
    saver: type[_DurableBase]
    pool: type
    connect: Callable[..., Any]
    before_effect: Callable[[], Any]

    def flows(self, ledger: _DurableBase) -> Any:
        """A driver running flows in the caller and their ops on ``ledger``."""
        return self.driver.for_saver(ledger)


SYNC = Mode(SyncDriver, DurablePostgresSaver, ConnectionPool, connect, granularity.before_effect)
ASYNC = Mode(AsyncDriver, AsyncDurablePostgresSaver, AsyncConnectionPool, aconnect, granularity.abefore_effect)


@_telemetry.instrument("ledger_run")
def _enter(call: _Call) -> contextvars.Token[_Parent | None]:
    outer = _PARENT.get()
    chain = (outer.chain if outer is not None else frozenset()) | {call.key}
    return _PARENT.set(_Parent(call.key, call.thread_id, call.origin, call.ttl, chain=chain))


def within(enter: Callable[[], Callable[[], None]], fn: Callable[[], Any]) -> Any:
    """``fn()`` between ``enter()`` and the exit it returns: its value, or, when ``fn``
    is async, a coroutine doing the same around its ``await`` (in the awaiting task's
    context, so a context variable set by ``enter`` is seen by the call's code)."""
    leave = enter()
    try:
        result = fn()
    except BaseException:
        leave()
        raise
    if not inspect.iscoroutine(result):
        leave()
        return result

    async def finish() -> Any:
        try:
            return await result
        finally:
            leave()

    return finish()


def _invoking(call: _Call, *, renew: bool) -> Callable[[Any], Any]:
    """The user's function for a Hook/Call: nested calls key from this one while it
    runs; a plain call's claim is renewed meanwhile."""

    def enter() -> Callable[[], None]:
        if renew:
            _RENEWER.add(call)
        token = _enter(call)

        def leave() -> None:
            _PARENT.reset(token)
            if renew:
                _RENEWER.remove(call)

        return leave

    return lambda conn: within(enter, lambda: call.invoke(conn))


@_telemetry.instrument("idempotent")
def _run(call: _Call) -> Any:
    return SYNC.flows(call.ledger).run_flow(_call_flow(call, SYNC))


@_telemetry.instrument("idempotent")
async def _arun(call: _Call) -> Any:
    return await ASYNC.flows(call.ledger).run_flow(_call_flow(call, ASYNC))


def _pooled(ledger: _DurableBase, pool_type: type) -> bool:
    """Whether a transaction may hold one of the saver's connections for the whole call.

    Only from a pool with room for more: the function may call the saver, or another
    idempotent function, whose ops need a connection of the saver while the transaction
    holds its own. On a single connection (or a pool of one) they would wait for the
    transaction's connection for ever (the driver's lock is not reentrant, the pool
    never gets it back). Such a saver's transactions get a connection of their own,
    like its renewers do, so nested calls commit on their own exactly as with a pool:
    a nested plain call's claim and record are never rolled back with the outer
    transaction (reusing its connection would do that and repeat a nested external
    effect after a crash)."""
    conn = getattr(ledger, "conn", None)
    return isinstance(conn, pool_type) and int(getattr(conn, "max_size", 1)) > 1


def _prepare_threshold(ledger: _DurableBase) -> int | None:
    """The saver's own setting (None behind a pgbouncer in transaction mode, which
    cannot keep prepared statements), for the connection opened like its own."""
    conn = getattr(ledger, "conn", None)
    if isinstance(conn, psycopg.Connection | psycopg.AsyncConnection):
        return conn.prepare_threshold
    kwargs = getattr(conn, "kwargs", None) or {}
    return cast("int | None", kwargs.get("prepare_threshold", 0))


def _run_tx(call: _Call, mode: Mode) -> Any:
    """Run ``_tx_protocol`` in one transaction: on one of the saver's connections when
    its pool has room (``_pooled``), else (a single-connection saver, or a saver of the
    other kind, whose connections cannot serve this function) on one opened like them.
    The driver retries on a fresh connection when the connection itself failed (a
    failover, a restart, an idle kill). Always safe: the claim, the function's writes
    and the record are one transaction, so a failure before COMMIT left nothing, and a
    COMMIT whose reply was lost left a completed claim that the retry replays. Returns
    the outcome (a coroutine of it for ``ASYNC``)."""
    ledger = call.ledger
    source: Callable[[], Any]
    if isinstance(ledger, mode.saver) and _pooled(ledger, mode.pool):
        source = cast(Any, ledger).connection
    else:
        conninfo, threshold = cast(Any, ledger)._conninfo, _prepare_threshold(ledger)
        schema = session_schema(ledger)

        def source() -> Any:
            return mode.connect(conninfo, prepare_threshold=threshold, schema=schema)

    pool = getattr(ledger, "conn", None)
    driver = mode.driver(cast(Any, pool) if isinstance(pool, mode.pool) else None, None, source=source)
    return driver.run_op(lambda: _tx_protocol(call, time.monotonic()))




