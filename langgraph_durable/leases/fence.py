"""The fence: which lease a write is checked against, the guard parameters folded into
a put's own statements, and the typed errors for a refused write."""

from __future__ import annotations

import json
import logging
from typing import Any

from langchain_core.runnables import RunnableConfig

from langgraph_durable import telemetry as _telemetry
from langgraph_durable._compat import RUNTIME_KEY as _RUNTIME_KEY
from langgraph_durable._io import Stmt
from langgraph_durable.core.idclock import _advance_id_clock, _uuid6_ticks
from langgraph_durable.core.view import FenceView
from langgraph_durable.errors import (
    AcknowledgedWorkLostError,
    ClockSkewError,
    DurableError,
    LeaseLostError,
    ThreadBusyError,
)
from langgraph_durable.leases.model import _RUN_LEASE, Lease
from langgraph_durable.sql.checkpoints import (
    ORDER_SKEW_STATE,
    PARENT_GONE_STATE,
    GuardMode,
    guard_params,
)
from langgraph_durable.sql.threads import (
    FENCE_BUSY_STATE,
    FENCE_LOST_STATE,
    FOREIGN_LEASE_RAISING_SQL,
    FOREIGN_LEASE_SQL,
    LEASE_FENCE_RAISING_SQL,
    LEASE_FENCE_SQL,
)

logger = logging.getLogger("langgraph_durable")

# The parent check of a run's puts (issue 23), on. A list so the failover test's child
# can switch it off, to show what it prevents (tests/test_failover_async.py); never a
# saver option: no deployment wants a run writing on top of a history that is gone.
PARENT_CHECK = [True]


def checks_parent(lease: Lease | None, ns: str, parent_id: str | None) -> bool:
    """Whether a put under ``lease`` checks that its parent is on the server: not the
    first root put of a run that started fresh (``Lease.fresh``), whose parent is the
    caller's checkpoint id, never stored for this thread (the stock saver starts fresh)."""
    if not PARENT_CHECK[0] or lease is None or parent_id is None:
        return False
    return not (lease.fresh and ns == "" and "" not in lease.acked)


def report_work_lost(err: AcknowledgedWorkLostError, lease: Lease | None, where: str) -> None:
    """Tell the operator, once per run: one ERROR line, the counter
    ``langgraph_durable_acknowledged_work_lost_total{where}``; the run's lease keeps the
    error (its next writes raise it, its release records it in durable_audit)."""
    if lease is not None:
        if lease.work_lost is not None:
            return
        lease.work_lost = err
    logger.error(
        "ACKNOWLEDGED WORK LOST on thread %s: checkpoint %s (namespace %r) was stored and "
        "acknowledged but is not on the server (asynchronous replication, failover?); the "
        "run stops here and the thread resumes from its real head %s, re-running the lost steps",
        err.thread_id, err.missing_checkpoint_id, err.checkpoint_ns, err.head_checkpoint_id,
    )
    _telemetry.count("acknowledged_work_lost", where=where)


class FenceOps(FenceView):
    """The fence checks of the saver's writes."""

    def _fence(
        self, thread_id: str, *, raising: bool = False, config: RunnableConfig | None = None
    ) -> tuple[Stmt, Lease | None]:
        """The fence statement of a write and the lease it checks. ``raising``: the
        variant that fails server-side (SQLSTATE LGD01/LGD02, see ``_fence_error``),
        for batches sent as one implicit transaction (``Batch(final=True)``)."""
        # Only the run executing in this context writes with its lease. No fallback to
        # this process's lease registry: that let any write of the process (update_state
        # from another request of a web server) pass the fence with the running run's
        # token, and the run then silently overwrote it. Every other writer, in this
        # process or not, is checked against the live lease (ThreadBusyError).
        lease = _RUN_LEASE.get()
        if lease is not None and (lease.released or lease.thread_id != thread_id):
            lease = None
        if lease is None and config is not None:
            # A write LangGraph submitted outside the run's context (see bind_runtime).
            runtime = (config.get("configurable") or {}).get(_RUNTIME_KEY)
            lease = self._leases.for_runtime(runtime, thread_id)
        if lease is not None:
            if lease.lost:
                raise LeaseLostError(thread_id, lease.token)
            sql = LEASE_FENCE_RAISING_SQL if raising else LEASE_FENCE_SQL
            return Stmt(sql, (thread_id, lease.token, lease.owner), fetch=True), lease
        if raising and self.leases_enabled:
            return Stmt(FOREIGN_LEASE_RAISING_SQL, (thread_id,), fetch=True), None
        return Stmt(FOREIGN_LEASE_SQL, (thread_id,), fetch=True), None

    def _guard(
        self,
        thread_id: str,
        config: RunnableConfig,
        checkpoint_ns: str | None,
        checkpoint_id: str | None,
        parent_id: str | None = None,
    ) -> tuple[GuardMode, tuple[Any, ...], Lease | None]:
        """The guard of a put/put_writes (the fence folded into the write's own
        statement, see sql.checkpoints._guard): its mode (the statement text to use),
        its parameters and the lease it checks. The run's lease (same rule as
        ``_fence``), else the foreign-lease check when leases are on, else none.
        ``checkpoint_id``: the order check (puts); ``parent_id``: the parent check,
        with a lease only (sql.checkpoints._GUARD_PARENT; off only through ``PARENT_CHECK``)."""
        lease = _RUN_LEASE.get()
        if lease is not None and (lease.released or lease.thread_id != thread_id):
            lease = None
        if lease is None:
            runtime = (config.get("configurable") or {}).get(_RUNTIME_KEY)
            lease = self._leases.for_runtime(runtime, thread_id)
        if lease is not None:
            if lease.lost:
                raise LeaseLostError(thread_id, lease.token)
            if lease.work_lost is not None:
                # Nothing more is written on top of a lost history (a fresh instance:
                # this run's tasks may raise it from several threads at once).
                raise AcknowledgedWorkLostError(**lease.work_lost.fields)
            params = guard_params(
                "lease", thread_id, lease.token, lease.owner, checkpoint_ns, checkpoint_id,
                parent_id if checks_parent(lease, checkpoint_ns or "", parent_id) else None,
            )
            return "lease", params, lease
        mode: GuardMode = "foreign" if self.leases_enabled else "none"
        return mode, guard_params(mode, thread_id, None, None, checkpoint_ns, checkpoint_id), None

    @_telemetry.instrument("fence_error")
    def _fence_error(self, thread_id: str, lease: Lease | None, exc: BaseException) -> DurableError | None:
        """The typed error for a raising fence's failure (None: not a fence failure)."""
        state = getattr(exc, "sqlstate", None)
        if state == FENCE_LOST_STATE and lease is not None:
            lease.lost = True
            return LeaseLostError(thread_id, lease.token)
        if state == FENCE_BUSY_STATE:
            diag = getattr(exc, "diag", None)
            info = json.loads(getattr(diag, "message_detail", None) or "{}")
            return ThreadBusyError(thread_id, info.get("owner"), info.get("expires_in"))
        return None

    def _gone_error(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str, parent_id: str | None,
        lease: Lease | None, exc: BaseException,
    ) -> AcknowledgedWorkLostError | None:
        """AcknowledgedWorkLostError for a put refused by the parent check (LGD04, else
        None), reported to the operator (``report_work_lost``)."""
        if getattr(exc, "sqlstate", None) != PARENT_GONE_STATE or parent_id is None:
            return None
        diag = getattr(exc, "diag", None)
        head = json.loads(getattr(diag, "message_detail", None) or "{}").get("head")
        err = AcknowledgedWorkLostError(thread_id, checkpoint_ns, parent_id, head, checkpoint_id)
        report_work_lost(err, lease, "put")
        return err

    @staticmethod
    def _order_error(
        thread_id: str, checkpoint_ns: str, checkpoint_id: str, exc: BaseException
    ) -> DurableError | None:
        """ClockSkewError for a put refused by the order check (LGD03, else None). The
        id clock is moved past the head first, so the caller's retry is ordered."""
        if getattr(exc, "sqlstate", None) != ORDER_SKEW_STATE:
            return None
        diag = getattr(exc, "diag", None)
        head = str(json.loads(getattr(diag, "message_detail", None) or "{}").get("head") or "")
        _advance_id_clock(head)
        ahead, mine = _uuid6_ticks(head), _uuid6_ticks(checkpoint_id)
        skew = (ahead - mine) / 1e7 if ahead is not None and mine is not None else None
        return ClockSkewError(thread_id, checkpoint_ns, checkpoint_id, head, skew)

    @_telemetry.instrument("check_fence")
    def _check_fence(self, thread_id: str, lease: Lease | None, rows: list[Any]) -> None:
        if lease is not None:
            if not rows:
                lease.lost = True
                raise LeaseLostError(thread_id, lease.token)
        elif rows and self.leases_enabled:
            raise ThreadBusyError(thread_id, rows[0]["lease_owner"], rows[0]["expires_in"])
