"""Run lifecycle. LangGraph tells a checkpointer nothing about runs. The saver recognises
the ``get_tuple`` a ``PregelLoop`` makes when a root run starts (``_find_run_context``),
and registers a callback on that loop's exit stack, so it knows when the run ends and
how (done, interrupted, failed, cancelled). That is where the lease is taken and
released, the resume attempt is counted (poison detection) and the graph version is
checked. Reads that are not run starts never take a lease or raise a version error."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack, ExitStack
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
)

from langgraph_durable import _sealing, _values
from langgraph_durable import telemetry as _telemetry
from langgraph_durable._acked import restore_stmts
from langgraph_durable._compat import DURABILITY_KEY
from langgraph_durable._compat import RUNTIME_KEY as _RUNTIME_KEY
from langgraph_durable._io import (
    Flow,
    Op,
    Sleep,
    Stmt,
    SyncDriver,
    Tx,
)
from langgraph_durable._sealing import Keyring
from langgraph_durable.config import OnBusy as OnBusy
from langgraph_durable.config import OnUnrecognisedRun as OnUnrecognisedRun
from langgraph_durable.core.view import RunLifecycleView
from langgraph_durable.errors import (
    AcknowledgedWorkLostError,
    CheckpointLoadError,
    PoisonCheckpointError,
    RunCancelledError,
    ThreadBusyError,
    UnsupportedLangGraphError,
)
from langgraph_durable.granularity import ExitFlush
from langgraph_durable.leases.fence import report_work_lost
from langgraph_durable.leases.model import _RUN_LEASE, Lease, _Handoff
from langgraph_durable.leases.owners import _owner_id
from langgraph_durable.pooler import session_schema
from langgraph_durable.quarantine import PoisonRecord, needs_operator
from langgraph_durable.sql.audit import AUDIT_INSERT_SQL
from langgraph_durable.sql.checkpoints import PARENT_GONE_STATE
from langgraph_durable.sql.threads import (
    ATTEMPT_AT_HEAD_SQL,
    ATTEMPT_UNCOUNTED_AT_HEAD_SQL,
    MARK_CANCELLED_SQL,
    RECORD_FAILURE_SQL,
)
from langgraph_durable.versioning import (
    POLICY_KEY,
    RUN_GRAPH,
    VERSION_KEY,
    graph_fingerprint,
)

if TYPE_CHECKING:
    from langgraph_durable.core.base import _DurableBase

logger = logging.getLogger("langgraph_durable")

# Configurable keys LangGraph sets on a run's config (see langgraph._internal._constants;
# the Runtime key is _compat.RUNTIME_KEY).
_TASK_ID_KEY = "__pregel_task_id"
_INTERRUPT = "__interrupt__"


@dataclass
class _RunContext:
    loop: Any
    graph: Any


_PREGEL: tuple[type, type] | None = None  # (PregelLoop, Pregel), imported on first use


def _pregel_types() -> tuple[type, type]:
    global _PREGEL
    if _PREGEL is None:
        from langgraph.pregel import Pregel
        from langgraph.pregel._loop import PregelLoop

        _PREGEL = (PregelLoop, Pregel)
    return _PREGEL


def _has_self(code: Any) -> bool:
    """Whether a frame of ``code`` can have a local ``self`` (argument, local, cell or
    free variable): only then is its ``f_locals`` built, a dict of every local (issue
    14: LangGraph's ``stream`` has 40, and this walk runs at every get_tuple of a run)."""
    return "self" in code.co_varnames or "self" in code.co_cellvars or "self" in code.co_freevars


def _find_run_context() -> _RunContext | None:
    """The PregelLoop (and its graph) whose ``__enter__`` is calling us, if any."""
    loop_type, pregel_type = _pregel_types()
    frame = sys._getframe(2)
    loop = None
    for _ in range(12):
        if frame is None:
            return None
        code = frame.f_code
        candidate = frame.f_locals.get("self") if _has_self(code) else None
        if loop is None:
            if frame.f_globals.get("__name__") == "langgraph.pregel._checkpoint":
                # checkpoint_superseded(): __enter__ reading the latest checkpoint after
                # it loaded the one a replay asked for. The run started already; taking
                # a second lease here would make the replay refuse itself (busy).
                return None
            if isinstance(candidate, loop_type):
                if code.co_name not in ("__enter__", "__aenter__"):
                    return None
                loop = candidate
        elif isinstance(candidate, pregel_type):
            return _RunContext(loop, candidate)
        frame = frame.f_back  # type: ignore[assignment]
    return _RunContext(loop, None) if loop is not None else None


def _check_runnable(saved: CheckpointTuple | None) -> None:
    """What a run start needs beyond a read: PregelLoop.__enter__ computes
    ``metadata["step"] + 1`` before any handler of ours can see a failure."""
    if saved is None:
        return
    step = saved.metadata.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        cfg = saved.config["configurable"]
        raise CheckpointLoadError(
            f"checkpoint {cfg.get('checkpoint_id')!r} of thread {cfg.get('thread_id')!r} "
            f"cannot be run from: its metadata has no integer 'step' ({step!r})",
            thread_id=cfg.get("thread_id", ""),
            checkpoint_ns=cfg.get("checkpoint_ns", ""),
            checkpoint_id=cfg.get("checkpoint_id"),
        )


def _raise_work_lost(lease: Lease, exc: BaseException | None) -> None:
    """A run that otherwise succeeded but whose stored history lost acknowledged work
    (issue 23: its final checkpoint, gone in a failover) does not report success."""
    if exc is None and lease.work_lost is not None:
        raise AcknowledgedWorkLostError(**lease.work_lost.fields)


class RunLifecycle(RunLifecycleView):
    """Run start and run end of the saver."""

    def _current_version(self, config: RunnableConfig, ctx: _RunContext | None) -> str | None:
        # The running graph, for a migration at this run start (new task ids, pending
        # work left for nodes it lacks). Set on every start so none sees a stale one.
        RUN_GRAPH.set(ctx.graph if ctx is not None else None)
        configured = config["configurable"].get(VERSION_KEY)
        if configured:
            return str(configured)
        if self.graph_version:
            return self.graph_version
        if ctx is not None and ctx.graph is not None:
            try:
                return graph_fingerprint(ctx.graph)
            except Exception:  # a graph we cannot describe runs unversioned
                logger.debug("could not fingerprint %r", ctx.graph, exc_info=True)
        return None

    @_telemetry.instrument("run_start")
    def _flow_run_start(
        self, config: RunnableConfig, ctx: _RunContext, handoff: _Handoff | None = None
    ) -> Flow[tuple[CheckpointTuple | None, Lease]]:
        thread_id = str(config["configurable"]["thread_id"])
        requested = get_checkpoint_id(config)
        _values.check_ids(thread_id, config["configurable"].get("checkpoint_ns", ""), requested)
        version = self._current_version(config, ctx)
        policy = config["configurable"].get(POLICY_KEY, self.version_policy)
        lease, loaded = yield from self._flow_take_lease(thread_id, version, requested, handoff, config)
        # The run's own writes during its start (a migration rewriting the checkpoint)
        # are fenced with this lease: _fence reads it from the context only.
        outer = _RUN_LEASE.get()
        _RUN_LEASE.set(lease)
        try:
            saved = yield from self._flow_enter_run(config, ctx, lease, version, policy, loaded)
            lease.fresh = saved is None
            return saved, lease
        except PoisonCheckpointError:
            _RUN_LEASE.set(outer)
            raise
        except BaseException:
            _RUN_LEASE.set(outer)
            # The run never started: hand the thread back as it was (status, version).
            self._leases.remove(lease)
            lease.released = True
            with contextlib.suppress(Exception):
                yield Tx(lambda: self._op_abandon(lease))
            raise

    def _flow_take_lease(
        self,
        thread_id: str,
        version: str | None,
        requested: str | None,
        handoff: _Handoff | None,
        config: RunnableConfig,
    ) -> Flow[tuple[Lease, list[Any] | None]]:
        """Step 1 of a run start: take the thread's lease (waiting while busy if
        ``on_busy="wait"``); a quarantined thread raises ``PoisonCheckpointError``.
        Returns the lease and the rows of the checkpoint to run from, read in the
        acquisition's own pipeline (``_op_acquire``'s ``load``), or None when they
        were not (the lease was taken on a later try): step 2 then reads them."""
        # A recovery worker may hold the lease (handoff, from claim_handoff in the caller's
        # context): ACQUIRE_SQL takes it over from that owner and token without a gap.
        owner = _owner_id()
        deadline = time.monotonic() + self.busy_timeout
        # Only the first try carries the read: a run waiting on a busy thread polls every
        # 0.25 s, and each try would read (and throw away) the whole state again.
        load: Stmt | None = self._get_tuple_stmt(config)
        while True:
            started = time.monotonic()
            res = yield Tx(
                partial(self._op_acquire, thread_id, owner, version, requested, handoff, load)
            )
            load = None
            if res.get("contended"):
                res = yield Tx(
                    lambda: self._op_acquire_contended(thread_id, owner, version, requested, handoff)
                )
            if res["ok"]:
                break
            if res.get("status") == "quarantined":
                q = yield Tx(lambda: self._op_quarantine_row(thread_id))
                q = q or {}
                raise PoisonCheckpointError(
                    thread_id, q.get("checkpoint_id"), q.get("attempts") or res.get("attempts", 0),
                    _sealing.open_text(
                        _sealing.keyring_of(self.serde), q.get("last_error") or res.get("last_error"),
                        thread_id=thread_id, where="last_error", strict=False,
                    ),
                    reason=q.get("reason") or "max_attempts",
                )
            if self.on_busy == "wait" and time.monotonic() < deadline:
                yield Sleep(0.25)
                continue
            raise ThreadBusyError(thread_id, res.get("lease_owner"), res.get("expires_in"))
        lease = Lease(
            thread_id=thread_id,
            owner=owner,
            token=int(res["lease_token"]),
            attempts=int(res["attempts"]),
            checkpoint_id=res["checkpoint_id"],
            version=version,
            last_error=res.get("last_error"),
            renewed_at=started,
            prev_status=res.get("prev_status"),
            prev_version=res.get("prev_version"),
        )
        self._leases.add(lease)
        return lease, res.get("loaded")

    def _flow_enter_run(
        self,
        config: RunnableConfig,
        ctx: _RunContext,
        lease: Lease,
        version: str | None,
        policy: str,
        loaded: list[Any] | None = None,
    ) -> Flow[CheckpointTuple | None]:
        """Step 2, the lease held: record the graph's topology, refuse a poisoned
        checkpoint, load the one to run from (fail closed), check its version.
        ``loaded``: its rows, read with the lease (step 1), decoded only here, after
        the poison check: a poisoned checkpoint is never decoded."""
        thread_id = lease.thread_id
        yield from self._flow_record_version(version, ctx)
        if lease.attempts > self.max_resume_attempts and lease.checkpoint_id is not None:
            # This is start number max+1 from the same checkpoint: the max runs before
            # it all failed there (exception or dead process). It never runs a node.
            record = PoisonRecord(
                thread_id, lease.checkpoint_id, lease.attempts - 1, lease.last_error, version
            )
            yield from self._flow_quarantine(lease, record)
        try:
            # No BEGIN/COMMIT, as in get_tuple outside a run: each statement has its
            # own snapshot either way (READ COMMITTED) and artifacts are immutable;
            # with the lease held no other run writes the thread meanwhile.
            if loaded is None:
                saved = yield Tx(lambda: self._op_get_tuple(config), transaction=False)
            else:
                # Artifacts, if any, are fetched here (immutable, no snapshot needed).
                # A checkpoint without any (or none: a new thread) needs no statement:
                # decoded right here, not through the driver (issue 14: a Tx, run_op and
                # its memo per run start for nothing). The op is run to its first
                # statement here; what precedes that is pure, so when it has one the op
                # is closed and run again, whole, by the driver.
                op = self._op_tuple_of(loaded)
                try:
                    op.send(None)
                except StopIteration as stop:
                    saved = stop.value
                else:
                    op.close()
                    saved = yield Tx(partial(self._op_tuple_of, loaded), transaction=False)
            _check_runnable(saved)
        except CheckpointLoadError as exc:
            # Fail closed: a checkpoint we cannot read is never run on half a state,
            # and retrying cannot fix stored bytes: quarantine at once.
            record = PoisonRecord(
                thread_id, lease.checkpoint_id, lease.attempts,
                f"{type(exc).__name__}: {exc}"[:4000], version, "load_error",
            )
            # Its traceback too (issue 25), while the lease is held: the quarantine
            # below drops it.
            yield Tx(partial(_op_record_failure, lease, exc, lease.checkpoint_id, _sealing.keyring_of(self.serde)))
            yield from self._flow_quarantine(lease, record, exc)
        if saved is not None:
            saved = yield from self._flow_check_version(thread_id, saved, version, policy)
        return saved

    @staticmethod
    def _exit_outcome(loop: Any, exc: BaseException | None) -> tuple[str, bool, bool, str | None]:
        """(status, reset attempts, undo this attempt, error text) for a finished run."""
        from langgraph.errors import GraphInterrupt

        if exc is None or isinstance(exc, GraphInterrupt):
            status = getattr(loop, "status", None)
            if status == "done":
                return "done", True, False, None
            writes = getattr(loop, "checkpoint_pending_writes", None) or []
            if (
                isinstance(exc, GraphInterrupt)
                or (isinstance(status, str) and status.startswith("interrupt"))
                or any(w[1] == _INTERRUPT for w in writes)
            ):
                return "waiting", True, False, None
            return "stopped", False, True, None
        if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | GeneratorExit | RunCancelledError):
            return "stopped", False, True, None
        text = f"{type(exc).__name__}: {exc}"[:4000]
        # An operator's decision pending (an unknown outcome): not an attempt.
        return "error", False, needs_operator(exc), text

    def _head(self, loop: Any) -> str | None:
        cfg = getattr(loop, "checkpoint_config", None) or {}
        return cast("str | None", cfg.get("configurable", {}).get("checkpoint_id"))

    def _release_op(
        self, lease: Lease, loop: Any, exc: BaseException | None, failed: ExitFlush | None = None
    ) -> Callable[[], Op[None]]:
        """The run end: forget ``lease`` here and return its release (an op factory,
        one autocommit pipeline). Run by the exit callback as an op, not through a
        flow: one driver layer less on every run end (issue 14). ``failed``: the exit
        flush of deferred checkpoints failed: the run failed with its error, at the
        last head it stored (the loop's head was never stored)."""
        self._leases.remove(lease)
        lease.released = True
        if lease.work_lost is not None:
            return self._work_lost_release(lease)
        if failed is not None:
            exc = failed.error
            head = failed.stored_head
        else:
            head = self._head(loop)
        status, reset, undo, error = self._exit_outcome(loop, exc)
        if isinstance(exc, RunCancelledError):
            # An operator's cancel (issue 25): 'stopped', and workers leave it so.
            mark = Stmt(MARK_CANCELLED_SQL, (lease.thread_id, lease.token, lease.owner))
            return partial(
                self._op_release, lease, status, reset=reset, undo=undo, error=None, first=(mark,)
            )
        acked = lease.acked.get("")
        if status in ("done", "waiting") and acked is not None:
            return partial(self._op_release_checked, lease, acked, status, reset=reset, undo=undo)
        first: tuple[Stmt, ...] = ()
        if error is not None and exc is not None:
            first = _failure_first(lease, exc, head or lease.checkpoint_id, _sealing.keyring_of(self.serde))
        if error is not None and head is not None and head != lease.checkpoint_id:
            # The failure happened past the checkpoint the run started from: it is the
            # first failed attempt at the new head (none, if an operator must decide).
            moved_to = Stmt(
                ATTEMPT_UNCOUNTED_AT_HEAD_SQL if undo else ATTEMPT_AT_HEAD_SQL,
                (head, lease.thread_id, lease.token, lease.owner),
            )
            return partial(
                self._op_release, lease, status, reset=False, undo=False, error=error,
                first=(moved_to, *first),
            )
        return partial(
            self._op_release, lease, status, reset=reset, undo=undo, error=error, first=first
        )

    def _op_release_checked(
        self, lease: Lease, acked: str, status: str, *, reset: bool, undo: bool
    ) -> Op[None]:
        """A finished run's release, refused (AcknowledgedWorkLostError, the release
        not applied) when its last acknowledged checkpoint is not on the server: the
        exit then hands the thread back instead (``_work_lost_release``)."""
        try:
            yield from self._op_release(lease, status, reset=reset, undo=undo, error=None, head=acked)
        except psycopg.Error as exc:
            if getattr(exc, "sqlstate", None) != PARENT_GONE_STATE:
                raise
            diag = getattr(exc, "diag", None)
            head = json.loads(getattr(diag, "message_detail", None) or "{}").get("head")
            err = AcknowledgedWorkLostError(lease.thread_id, "", acked, head)
            report_work_lost(err, lease, "release")
            raise err from None

    def _work_lost_release(self, lease: Lease) -> Callable[[], Op[None]]:
        """The release of a run that found acknowledged work lost (issue 23): handed
        back as 'stopped' at the server's real head (a recovery worker takes it at once,
        ``invoke(None)`` resumes it), the attempt not counted (the graph did not fail),
        and one durable_audit row (action 'work_lost') in the same round trip, for the
        console's audit page and ``list_audit``. Before the hand-back, the ``@idempotent``
        records of the thread this process had stored are written again where the
        server lost them (``_acked``): the worker that resumes it replays those
        calls instead of meeting their claims as unknown outcomes."""
        err = lease.work_lost
        restore = restore_stmts(lease.thread_id, self.serde)
        record = Stmt(
            AUDIT_INSERT_SQL,
            {
                "event_id": str(uuid.uuid4()),
                "actor": lease.owner,
                "via": "saver",
                "action": "work_lost",
                "thread_id": lease.thread_id,
                "before_id": err.missing_checkpoint_id,
                "after_id": err.head_checkpoint_id,
                "detail": json.dumps(
                    {"checkpoint_ns": err.checkpoint_ns, "refused_checkpoint_id": err.checkpoint_id,
                     "ledger_records_kept": len(restore)}
                ),
            },
        )
        return partial(
            self._op_release, lease, "stopped", reset=False, undo=True, error=None, first=(*restore, record)
        )

    def _release_flow(self, lease: Lease, loop: Any, exc: BaseException | None) -> Flow[None]:
        """``_release_op`` as a flow (for drivers that run flows)."""
        yield Tx(self._release_op(lease, loop, exc))

    def _run_started(
        self,
        config: RunnableConfig,
        ctx: _RunContext,
        lease: Lease,
        outer: Lease | None,
        saved: CheckpointTuple | None,
    ) -> None:
        """After a recognised run start took its lease: attach the run end, start the
        checkpoint deferral, and make ``lease`` the run's (context and Runtime)."""
        self._attach_exit(ctx, lease, outer)
        if self._granularity is not None:
            self._granularity.start(lease, ctx, saved)
        lease.exit_durability = (config.get("configurable") or {}).get(DURABILITY_KEY) == "exit"
        _RUN_LEASE.set(lease)
        self._bind_run(config, lease)

    def _attach_exit(self, ctx: _RunContext, lease: Lease, outer: Lease | None = None) -> None:
        """Run end: release ``lease`` when the run's loop exits (``_push_exit``), or
        hand the thread back when the loop fails before it starts (``_guard_first``)."""
        self._ensure_renewer()

        def restore() -> None:
            # A root run started inside another run's node (another thread) hands the
            # context back to the outer run's lease: writes fence only with _RUN_LEASE.
            if _RUN_LEASE.get() is lease:
                _RUN_LEASE.set(outer if outer is not None and not outer.released else None)

        self._push_exit(ctx, lease, restore)
        self._guard_first(ctx, lease, restore)

    def _push_exit(self, ctx: _RunContext, lease: Lease, restore: Callable[[], None]) -> None:
        """Register the run-end callback on the loop's exit stack (sync or async).

        Deferred checkpoints are flushed first, before the release. A failed flush
        (an unencodable value, the lease lost meanwhile) is what the un-deferred put
        would have raised inside the run: the release records it (status 'error',
        counted at the last stored head, never 'done'), then it is raised from
        invoke/stream (issue 23, defect 2). A cancellation stays a cancellation: the
        flush failure is then logged, and the release still records it."""
        stack = ctx.loop.stack
        # granularity takes the composed saver (self is one: this is its component).
        saver = cast("_DurableBase", self)
        deferrals = self._granularity

        def sync_exit(exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
            failed: ExitFlush | None = None
            try:
                # .runs: runs with something deferred (start() registers one before
                # the run's first step; empty: the usual case, no flow to run).
                if deferrals is not None and deferrals.runs:
                    failed = self._run_flow(deferrals.exit_flow(saver, lease))
            except BaseException as error:  # the flush did not finish (cancelled)
                failed = ExitFlush(error, None)
                raise
            finally:
                try:
                    self._run_op(self._release_op(lease, ctx.loop, exc, failed))
                except AcknowledgedWorkLostError:
                    with contextlib.suppress(Exception):  # else the lease expires: the same hand-back
                        self._run_op(self._work_lost_release(lease))
                except Exception:
                    logger.exception("could not release the lease on thread %s", lease.thread_id)
                finally:
                    restore()
            self._raise_failed_flush(lease, exc, failed)
            _raise_work_lost(lease, exc)
            return False

        async def async_exit(exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
            failed: ExitFlush | None = None
            try:
                if deferrals is not None and deferrals.runs:
                    failed = await self._arun_flow(deferrals.exit_flow(saver, lease))
            except BaseException as error:
                failed = ExitFlush(error, None)
                raise
            finally:
                try:
                    await self._arun_op(self._release_op(lease, ctx.loop, exc, failed))
                except AcknowledgedWorkLostError:
                    with contextlib.suppress(Exception):
                        await self._arun_op(self._work_lost_release(lease))
                except Exception:
                    logger.exception("could not release the lease on thread %s", lease.thread_id)
                finally:
                    restore()
            self._raise_failed_flush(lease, exc, failed)
            _raise_work_lost(lease, exc)
            return False

        if isinstance(stack, AsyncExitStack):
            stack.push_async_exit(async_exit)
        elif isinstance(stack, ExitStack):
            stack.push(sync_exit)

    @staticmethod
    def _raise_failed_flush(lease: Lease, exc: BaseException | None, failed: ExitFlush | None) -> None:
        if failed is None:
            return
        if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt):
            logger.error(
                "thread %s: the deferred checkpoint could not be stored at the run's "
                "cancellation (%s: %s); the thread resumes from checkpoint %s",
                lease.thread_id, type(failed.error).__name__, failed.error, failed.stored_head,
            )
            return
        raise failed.error

    def _guard_first(self, ctx: _RunContext, lease: Lease, restore: Callable[[], None]) -> None:
        """LangGraph calls loop._first() after this get_tuple, still inside __enter__. If
        it raises (EmptyInputError on invoke(None) of a new thread, an input or Command
        the thread cannot take) the `with` never reaches __exit__, so the callbacks
        above never run: the lease would stay held, and renewed, for the life of the
        process (every other run of the thread: ThreadBusyError). Hand the thread back
        there as a run that never started: the attempt is not counted."""
        first = ctx.loop._first

        def guarded_first(*args: Any, **kwargs: Any) -> Any:
            try:
                return first(*args, **kwargs)
            except BaseException:
                restore()
                self._abandon_now(lease)
                raise

        ctx.loop._first = guarded_first

    def _abandon_now(self, lease: Lease) -> None:
        self._leases.remove(lease)
        lease.released = True
        if _RUN_LEASE.get() is lease:
            _RUN_LEASE.set(None)
        try:
            try:
                self._run_op(lambda: self._op_abandon(lease))
            except asyncio.InvalidStateError:
                # On the async saver's own event loop (inside __aenter__, where nothing
                # can be awaited): one statement on a short-lived connection of its own.
                with self._renew_connect() as conn:
                    SyncDriver(conn, session_schema(self)).run_op(lambda: self._op_abandon(lease))
        except Exception:
            logger.exception("could not release the lease on thread %s", lease.thread_id)

    def _run_context(self, config: RunnableConfig) -> _RunContext | None:
        if not self.leases_enabled:
            return None
        configurable = config.get("configurable", {})
        if _RUNTIME_KEY not in configurable or configurable.get("checkpoint_ns"):
            return None
        if "thread_id" not in configurable:
            return None
        ctx = _find_run_context()
        if ctx is None:
            self._check_unrecognised_start(config)
            return None
        if getattr(ctx.loop, "is_nested", False):
            return None
        return ctx

    # --- fail closed
    # The run-start recognition (_find_run_context) walks LangGraph's private call stack.
    # A LangGraph release that changes it would make every run go without a lease,
    # fencing, poison counting and version check, silently. These checks notice a root
    # run the saver did not recognise and refuse it (on_unrecognised_run="raise") or log
    # an error ("log"). Only root runs of savers with leases are concerned: update_state,
    # copy_thread, nested graphs, subgraphs and leases=False savers are never refused.

    def _run_config(self, configurable: Mapping[str, Any]) -> bool:
        """Whether ``configurable`` is LangGraph's config for a root run of a thread:
        set by a PregelLoop (runtime key), root namespace, not nested in another run's
        task (a graph invoked inside a node carries its task id: never leased)."""
        return (
            self.leases_enabled
            and _RUNTIME_KEY in configurable
            and not configurable.get("checkpoint_ns")
            and "thread_id" in configurable
            and _TASK_ID_KEY not in configurable
        )

    def _check_unrecognised_start(self, config: RunnableConfig) -> None:
        """LangGraph is loading a root run's checkpoint and no PregelLoop run start was
        recognised. The one such load in a recognised run is ``checkpoint_superseded``
        inside ``__enter__``, right after the start took its lease: a live lease of this
        thread in this context. Runs before any node (``__enter__``), in every
        durability mode."""
        configurable = config.get("configurable", {})
        if not self._run_config(configurable):
            return
        thread_id = str(configurable["thread_id"])
        lease = _RUN_LEASE.get()
        if lease is not None and not lease.released and lease.thread_id == thread_id:
            return
        self._unrecognised_run(thread_id, "the run's first checkpoint load (get_tuple)")

    def _check_unrecognised_put(self, config: RunnableConfig, metadata: CheckpointMetadata) -> None:
        """The backstop, should a LangGraph release load the run's state some other way:
        a checkpoint of a root run (source "input" or "loop") with no lease of this
        thread in this context or this process. An ``update_state`` ("update"),
        a fork or a copy is not a run and is never refused."""
        configurable = config.get("configurable", {})
        if not self._run_config(configurable):
            return
        if (metadata or {}).get("source") not in ("input", "loop"):
            return
        thread_id = str(configurable["thread_id"])
        lease = _RUN_LEASE.get()
        if lease is not None and lease.thread_id == thread_id:
            return  # this run's (under durability="exit" the last put may follow release)
        if self._leases.get(thread_id) is not None:
            return
        self._unrecognised_run(thread_id, "the run's first checkpoint write (put)")

    def _unrecognised_run(self, thread_id: str, where: str) -> None:
        from langgraph_durable import _compat

        version = _compat.langgraph_version()
        message = (
            f"thread {thread_id!r}: a LangGraph run started that langgraph-durable did not "
            f"recognise (detected at {where}; installed: {_compat.describe_versions()}). "
            "Run starts are recognised through LangGraph internals that this release "
            "seems to have changed; running on would skip the lease, fencing, poison "
            "counting and the graph-version check. Install a LangGraph version this "
            "package supports (see its pyproject/README), or pass "
            "on_unrecognised_run='log' to run such graphs unprotected."
        )
        if self.on_unrecognised_run == "log":
            if thread_id not in self._unrecognised_logged:
                if len(self._unrecognised_logged) < 10_000:
                    self._unrecognised_logged.add(thread_id)
                logger.error("%s Running it unprotected (on_unrecognised_run='log').", message)
            return
        raise UnsupportedLangGraphError(
            message, langgraph_version=version, what=f"run start not recognised at {where}",
            thread_id=thread_id,
        )

    def _bind_run(self, config: RunnableConfig, lease: Lease | None) -> None:
        """Tie this call's LangGraph Runtime to ``lease`` (a root run start) or, for a
        subgraph's start inside a run, to the run lease of the calling context."""
        runtime = (config.get("configurable") or {}).get(_RUNTIME_KEY)
        if runtime is None:
            return
        if lease is None:
            lease = _RUN_LEASE.get()
            if lease is None or lease.released:
                return
            if lease.thread_id != str(config["configurable"].get("thread_id")):
                return
        self._leases.bind_runtime(runtime, lease)


# --- console25 branch: the last failure with its traceback (issue 25) -----------------
FAILURE_TRACEBACK_MAX = 16 * 1024
_TASK_NOTE = re.compile(r"During task with name '(.*)' and id '([^']*)'")


def failure_record(exc: BaseException, checkpoint_id: str | None) -> dict[str, Any]:
    """What the console shows of a run's failure: the failing node (from the note
    LangGraph adds to a node's exception), the exception type and message, and the
    traceback, its tail kept within ``FAILURE_TRACEBACK_MAX`` characters (the cut said:
    the innermost frames, where it raised, are the ones an operator reads first)."""
    import datetime as _dt
    import traceback

    node = task_id = None
    for note in getattr(exc, "__notes__", None) or ():
        m = _TASK_NOTE.search(str(note))
        if m:
            node, task_id = m.group(1), m.group(2)
    try:
        text = "".join(traceback.format_exception(exc))
    except Exception as fmt_exc:  # a hostile __str__: never fail a run's release on it
        text = f"(traceback unavailable: {type(fmt_exc).__name__})"
    cut = max(0, len(text) - FAILURE_TRACEBACK_MAX)
    try:
        message = str(exc)[:4000]
    except Exception:
        message = "(unprintable)"
    return {
        "node": _clean(node),
        "task_id": _clean(task_id),
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": _clean(message),
        "traceback": _clean(text[cut:]),
        "traceback_cut": cut,
        "checkpoint_id": checkpoint_id,
        "at": _dt.datetime.now(_dt.UTC).isoformat(),
    }


def _clean(text: str | None) -> str | None:
    """JSONB-safe text: no NUL (PostgreSQL refuses it), no lone surrogate (no UTF-8)."""
    if text is None:
        return None
    return text.replace("\x00", "\\x00").encode("utf-8", "replace").decode("utf-8")


def _failure_first(
    lease: Lease, exc: BaseException, checkpoint_id: str | None, ring: Keyring | None = None
) -> tuple[Stmt, ...]:
    """The failure record's statement for the release pipeline; none if the exception
    cannot even be described (the release itself must never fail on it)."""
    try:
        return (_failure_stmt(lease, exc, checkpoint_id, ring),)
    except Exception:
        logger.debug("could not record the failure of %s", lease.thread_id, exc_info=True)
        return ()


def _op_record_failure(
    lease: Lease, exc: BaseException, checkpoint_id: str | None, ring: Keyring | None = None
) -> Op[None]:
    from langgraph_durable._io import Batch

    yield Batch([_failure_stmt(lease, exc, checkpoint_id, ring)])


# What of a failure record stays in the clear with an encrypting serializer (issue 27):
# code names, ids and the time; the message and traceback (they quote values) are sealed.
FAILURE_CLEAR = frozenset({"node", "task_id", "type", "traceback_cut", "checkpoint_id", "at"})


def _failure_stmt(lease: Lease, exc: BaseException, checkpoint_id: str | None, ring: Keyring | None = None) -> Stmt:
    from psycopg.types.json import Jsonb

    return Stmt(
        RECORD_FAILURE_SQL,
        {
            "failure": Jsonb(_sealing.seal_json(ring, failure_record(exc, checkpoint_id), FAILURE_CLEAR)),
            "thread_id": lease.thread_id,
            "token": lease.token,
            "owner": lease.owner,
        },
    )
