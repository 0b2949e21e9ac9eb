"""Quarantine, the saver side: a thread whose run start failed too often (or whose
checkpoint cannot be decoded) is set aside with its ``PoisonRecord``; the ``on_poison``
hook runs once. The operator side (list, release) is ``poison.py``."""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from langgraph_durable import _sealing
from langgraph_durable import telemetry as _telemetry
from langgraph_durable._io import (
    Batch,
    Flow,
    Hook,
    Op,
    Stmt,
    Tx,
)
from langgraph_durable.core.view import QuarantineView
from langgraph_durable.errors import (
    IdempotencyConflictError,
    IdempotentCallFailedError,
    OutcomeUnknownError,
    PoisonCheckpointError,
)
from langgraph_durable.leases.model import Lease
from langgraph_durable.sql.quarantine import QUARANTINE_ROW_SQL, QUARANTINE_THREAD_SQL

logger = logging.getLogger("langgraph_durable")


PoisonHook = Callable[["PoisonRecord"], Any]


# Errors that stop a run on a decision only an operator can make: the ledger's answer
# for one key (Ledger.resolve / forget, `langgraph-durable ledger resolve|forget`). Such
# a run is no failed attempt at its checkpoint: no retry could change its outcome and
# no node's code is at fault. Counted, a SIGKILL inside an @idempotent tool and two
# resumes quarantined the thread, and the documented answer (resolve, then
# invoke(None)) met PoisonCheckpointError. The run ends with status 'error' (the error
# is last_error) and its attempt undone; the run after the answer counts as usual.
OPERATOR_DECISIONS: tuple[type[BaseException], ...] = (
    OutcomeUnknownError,
    IdempotencyConflictError,
    IdempotentCallFailedError,
)


def needs_operator(exc: BaseException | None) -> bool:
    """Whether ``exc`` stops a run on a decision only an operator can make."""
    return isinstance(exc, OPERATOR_DECISIONS)


@dataclass(frozen=True)
class PoisonRecord:
    """What ``on_poison`` receives when a thread is quarantined.

    ``attempts``: failed runs from ``checkpoint_id`` (a SIGKILL counts like an
    exception). ``last_error``: the last exception text, ``None`` when every failure was
    a dead process. ``reason``: ``"max_attempts"`` (more than ``max_resume_attempts``
    failures) or ``"load_error"`` (the checkpoint could not be decoded: fail closed)."""

    thread_id: str
    checkpoint_id: str | None
    attempts: int
    last_error: str | None
    graph_version: str | None
    reason: str = "max_attempts"


class QuarantineOps(QuarantineView):
    """Quarantining a thread at a run start (see ``lifecycle``)."""

    def _op_quarantine_row(self, thread_id: str) -> Op[dict[str, Any] | None]:
        rows = yield Batch(
            [Stmt(QUARANTINE_ROW_SQL, (thread_id,), fetch=True)]
        )
        return rows[0][0] if rows[0] else None

    def _op_quarantine(self, record: PoisonRecord) -> Op[None]:
        params = dict(record.__dict__)
        params["last_error"] = _sealing.seal_text(_sealing.keyring_of(self.serde), record.last_error)
        yield Batch([Stmt(QUARANTINE_THREAD_SQL, params)])

    def _fire_on_poison(self, record: PoisonRecord) -> Any:
        logger.error(
            "thread %s quarantined at checkpoint %s after %d attempts (graph version %s): %s",
            record.thread_id, record.checkpoint_id, record.attempts, record.graph_version,
            record.last_error,
        )
        if self.on_poison is None:
            return None
        try:
            result = self.on_poison(record)
        except Exception:
            logger.exception("on_poison hook failed for thread %s", record.thread_id)
            return None
        if inspect.isawaitable(result):
            # The driver awaits what a Hook returns: guard it too, so a failing async
            # hook is logged and the caller still gets PoisonCheckpointError.
            async def guarded() -> Any:
                try:
                    return await result
                except Exception:
                    logger.exception("on_poison hook failed for thread %s", record.thread_id)
                    return None

            return guarded()
        return result

    @_telemetry.instrument("quarantine")
    def _flow_quarantine(
        self, lease: Lease, record: PoisonRecord, cause: BaseException | None = None
    ) -> Flow[None]:
        """Quarantine the thread (lease dropped in the same statement), run the hook
        once (at most once: after the commit), raise. Later run starts see the status
        and raise without the hook."""
        yield Tx(lambda: self._op_quarantine(record))
        self._leases.remove(lease)
        lease.released = True
        # The error text as stored may be sealed (issue 27): the hook and the error get
        # it in the clear (or "<encrypted>" when this saver has no key for it).
        shown = _sealing.open_text(
            _sealing.keyring_of(self.serde), record.last_error, thread_id=record.thread_id,
            where="last_error", strict=False,
        )
        if shown != record.last_error:
            record = dataclasses.replace(record, last_error=shown)
        yield Hook(self._fire_on_poison, (record,))
        raise PoisonCheckpointError(
            record.thread_id, record.checkpoint_id, record.attempts, record.last_error,
            reason=record.reason,
        ) from cause
