"""Operator tools for quarantined (poisoned) threads: list, show, release, rewind.

The counting and the quarantine itself live in the saver's run lifecycle (see
``saver._DurableBase._flow_run_start``): every root run start from a checkpoint counts
one attempt in ``durable_threads`` before any node runs, a run that ends done or waiting
on an interrupt resets the count, and the start that finds more than
``max_resume_attempts`` failed attempts at the same checkpoint quarantines the thread
(``durable_threads.status = 'quarantined'`` plus a row in ``durable_quarantine``) and
raises ``PoisonCheckpointError``. This module is what an operator does next, the DBOS
dead-letter queue / Restate paused-invocation workflow:

* ``list_quarantined`` / ``show``: what is stuck, where, why (SQL only: works on a
  thread whose checkpoint cannot be decoded).
* ``release``: lift the quarantine and reset the count; the next ``invoke`` runs the same
  checkpoint again with ``max_resume_attempts`` fresh attempts (DBOS ``resume``).
* ``rewind``: make a copy of an earlier checkpoint the thread's head (a fork: nothing is
  deleted, history keeps the poisoned branch), reset the count, lift the quarantine; the
  next ``invoke(None, ...)`` continues from there (DBOS ``fork_workflow``, Restate
  restart-from-prefix).

Every function takes a saver (``DurablePostgresSaver`` or ``AsyncDurablePostgresSaver``)
and has an async twin prefixed ``a``. Statements are written once as ops (see ``_io``)
and run by the saver's own driver.

Retention and recovery code must skip threads whose ``durable_threads.status`` is
``QUARANTINED``; a run started on one anyway (by a worker, a user, Studio) raises
``PoisonCheckpointError`` before any node runs, whoever starts it.
"""

from __future__ import annotations

import datetime as _dt
import logging
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base.id import uuid6

from langgraph_durable import _sealing
from langgraph_durable import audit as _audit
from langgraph_durable._io import Batch, Op, Stmt, op_memo
from langgraph_durable._view import SaverView
from langgraph_durable.core.jsonb import jsonb as _jsonb
from langgraph_durable.errors import (
    CheckpointNotFoundError,
    NotQuarantinedError,
    ThreadBusyError,
)
from langgraph_durable.sql.quarantine import (
    FORK_CHECKPOINT_SQL,
    POISON_HISTORY_SQL,
    POISON_LOCK_THREAD_SQL,
    POISON_THREAD_ROW_SQL,
    QUARANTINE_ENTRY_SQL,
    QUARANTINE_LIST_SQL,
    RELEASE_QUARANTINE_SQL,
    RESET_QUARANTINED_THREAD_SQL,
    ROOT_HEAD_SQL,
)
from langgraph_durable.versioning import VERSION_KEY

logger = logging.getLogger("langgraph_durable")

QUARANTINED = "quarantined"

# LangGraph's channel for a task's exception (langgraph._internal._constants.ERROR).
_ERROR_CHANNEL = "__error__"

@dataclass(frozen=True)
class QuarantineEntry:
    """One quarantined thread, as ``durable_quarantine`` records it.

    ``attempts``: failed runs from ``checkpoint_id``. ``reason``: ``max_attempts`` (a
    crash or error loop: fix the cause, then release) or ``load_error`` (the stored
    checkpoint cannot be decoded: rewind). ``head_checkpoint_id``: the thread's newest
    checkpoint now (differs from ``checkpoint_id`` after an ``update_state``)."""

    thread_id: str
    checkpoint_id: str | None
    attempts: int
    last_error: str | None
    graph_version: str | None
    reason: str
    quarantined_at: _dt.datetime
    head_checkpoint_id: str | None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["quarantined_at"] = self.quarantined_at.isoformat()
        return d


@dataclass(frozen=True)
class CheckpointSummary:
    """A root checkpoint of a thread, read without decoding any value."""

    checkpoint_id: str
    parent_checkpoint_id: str | None
    step: int | None
    source: str | None
    graph_version: str | None
    ts: str | None
    writes: int
    errors: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ThreadReport:
    """What ``show`` returns: the thread's lifecycle row, its quarantine record (if it
    is quarantined) and its newest root checkpoints, newest first."""

    thread_id: str
    status: str | None
    attempts: int
    attempts_checkpoint_id: str | None
    last_error: str | None
    graph_version: str | None
    lease_owner: str | None
    quarantine: QuarantineEntry | None
    history: list[CheckpointSummary] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "thread_id": self.thread_id,
            "status": self.status,
            "attempts": self.attempts,
            "attempts_checkpoint_id": self.attempts_checkpoint_id,
            "last_error": self.last_error,
            "graph_version": self.graph_version,
            "lease_owner": self.lease_owner,
            "quarantine": self.quarantine.to_dict() if self.quarantine else None,
            "history": [c.to_dict() for c in self.history],
        }


@dataclass(frozen=True)
class RewindResult:
    """``checkpoint_id``: the new head (a copy of ``rewound_to``); ``rewound_from``: the
    head before; ``released``: whether a quarantine was lifted."""

    thread_id: str
    checkpoint_id: str
    rewound_to: str
    rewound_from: str | None
    released: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------- ops
def _opened(text: str | None, thread_id: str) -> str | None:
    """An error text as stored, opened with the running saver's keyring (issue 27);
    ``"<encrypted>"`` for a saver without one."""
    return _sealing.open_text(_sealing.RING.get(), text, thread_id=thread_id, where="last_error", strict=False, lenient=True)


def _entry(row: dict[str, Any]) -> QuarantineEntry:
    return QuarantineEntry(
        thread_id=row["thread_id"],
        checkpoint_id=row["checkpoint_id"],
        attempts=int(row["attempts"]),
        last_error=_opened(row["last_error"], row["thread_id"]),
        graph_version=row["graph_version"],
        reason=row["reason"],
        quarantined_at=row["quarantined_at"],
        head_checkpoint_id=row["head_checkpoint_id"],
    )


def _op_list(limit: int | None) -> Op[list[QuarantineEntry]]:
    rows = yield Batch([Stmt(QUARANTINE_LIST_SQL, (limit,), fetch=True)])
    return [_entry(r) for r in rows[0]]


def _op_show(thread_id: str, history: int) -> Op[ThreadReport]:
    rows = yield Batch(
        [
            Stmt(POISON_THREAD_ROW_SQL, (thread_id,), fetch=True),
            Stmt(QUARANTINE_ENTRY_SQL, (thread_id,), fetch=True),
            Stmt(POISON_HISTORY_SQL, (VERSION_KEY, _ERROR_CHANNEL, thread_id, history), fetch=True),
        ]
    )
    thread, entry, hist = rows
    if not thread and not hist:
        raise CheckpointNotFoundError(thread_id, None)
    t = thread[0] if thread else {}
    status = t.get("status")
    return ThreadReport(
        thread_id=thread_id,
        status=status,
        attempts=int(t.get("attempts") or 0),
        attempts_checkpoint_id=t.get("attempts_checkpoint_id"),
        last_error=_opened(t.get("last_error"), thread_id),
        graph_version=t.get("graph_version"),
        lease_owner=t.get("lease_owner") if (t.get("expires_in") or 0) > 0 else None,
        quarantine=_entry(entry[0]) if entry and status == QUARANTINED else None,
        history=[
            CheckpointSummary(
                checkpoint_id=r["checkpoint_id"],
                parent_checkpoint_id=r["parent_checkpoint_id"],
                step=int(r["step"]) if r["step"] is not None else None,
                source=r["source"],
                graph_version=r["graph_version"],
                ts=r["ts"],
                writes=int(r["writes"]),
                errors=int(r["errors"]),
            )
            for r in hist
        ],
    )


@_audit.audited("quarantine.release", _audit.describe_release)
def _op_release(thread_id: str) -> Op[QuarantineEntry]:
    rows = yield Batch(
        [Stmt(POISON_LOCK_THREAD_SQL, (thread_id,), fetch=True), Stmt(QUARANTINE_ENTRY_SQL, (thread_id,), fetch=True)]
    )
    thread, entry = rows
    status = thread[0]["status"] if thread else None
    memo = op_memo()
    if status != QUARANTINED or not entry:
        if "released" in memo and status != QUARANTINED and not entry:
            return cast(QuarantineEntry, memo["released"])  # retry of a committed release
        raise NotQuarantinedError(thread_id, status)
    yield Batch(
        [
            Stmt(RELEASE_QUARANTINE_SQL, (thread_id,)),
            Stmt(RESET_QUARANTINED_THREAD_SQL, {"thread_id": thread_id, "checkpoint_id": None}),
        ]
    )
    released = _entry(entry[0])
    memo["released"] = released
    logger.warning(
        "thread %s released from quarantine (checkpoint %s, %d failed attempts): the next "
        "run starts from it again",
        thread_id, released.checkpoint_id, released.attempts,
    )
    return released


def _next_id(head: str | None) -> str:
    """A checkpoint id newer than ``head``: LangGraph's own uuid6, or, when this
    machine's clock is behind the one that wrote ``head``, ``head`` plus 409.6 us (one
    unit of uuid6's time_mid field; the version nibble below it is left untouched)."""
    new = str(uuid6())
    if head is not None and new <= head:
        new = str(uuid.UUID(int=uuid.UUID(head).int + (1 << 80)))
    return new


@_audit.audited("quarantine.rewind", _audit.describe_rewind)
def _op_rewind(saver: SaverView, thread_id: str, to: str) -> Op[RewindResult]:
    rows = yield Batch(
        [Stmt(POISON_LOCK_THREAD_SQL, (thread_id,), fetch=True), Stmt(ROOT_HEAD_SQL, (thread_id,), fetch=True)]
    )
    thread, head_rows = rows
    if thread and thread[0]["lease_owner"] and (thread[0]["expires_in"] or 0) > 0:
        raise ThreadBusyError(thread_id, thread[0]["lease_owner"], thread[0]["expires_in"])
    head = head_rows[0]["checkpoint_id"] if head_rows else None
    memo = op_memo()
    done = memo.get("rewind")
    if done is not None and head == done.checkpoint_id:
        # A retry whose first attempt committed (lost COMMIT reply): its fork is the
        # head. Forking again would add a second copy and report no released quarantine.
        return cast(RewindResult, done)
    new_id = _next_id(head)
    extra = {"source": "fork", "rewound_to": to, "rewound_from": head}
    params = {
        "thread_id": thread_id,
        "to": to,
        "new_id": new_id,
        "ts": _dt.datetime.now(_dt.UTC).isoformat(),
        "extra": _jsonb(extra),
    }
    rows = yield Batch([Stmt(FORK_CHECKPOINT_SQL, params, fetch=True)])
    if not rows[0]:
        raise CheckpointNotFoundError(thread_id, to)
    # Read the fork back in the same transaction, as the next run will: a chosen
    # checkpoint that does not decode raises CheckpointLoadError and the transaction
    # rolls back (nothing written). Only what the fork carries is checked: the chosen
    # checkpoint's own pending writes (not copied) may be the broken part.
    yield from saver._op_get_tuple(_target_config(thread_id, new_id))
    rows = yield Batch(
        [
            Stmt(RELEASE_QUARANTINE_SQL, (thread_id,), fetch=True),
            Stmt(RESET_QUARANTINED_THREAD_SQL, {"thread_id": thread_id, "checkpoint_id": new_id}),
        ]
    )
    released = bool(rows[0])
    memo["rewind"] = RewindResult(thread_id, new_id, to, head, released)
    logger.warning(
        "thread %s rewound to checkpoint %s (new head %s, previous head %s)%s",
        thread_id, to, new_id, head, "; quarantine lifted" if released else "",
    )
    return cast(RewindResult, memo["rewind"])


def _target_config(thread_id: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}
    }


# ---------------------------------------------------------------------- public API
def list_quarantined(saver: SaverView, *, limit: int | None = None) -> list[QuarantineEntry]:
    """Quarantined threads, most recently quarantined first."""
    return list(saver.run_op(lambda: _op_list(limit)))


async def alist_quarantined(saver: SaverView, *, limit: int | None = None) -> list[QuarantineEntry]:
    return list(await saver.arun_op(lambda: _op_list(limit)))


def show(saver: SaverView, thread_id: str, *, history: int = 10) -> ThreadReport:
    """A thread's lifecycle row, quarantine record and newest ``history`` root
    checkpoints. Raises ``CheckpointNotFoundError`` for a thread never seen."""
    tid = str(thread_id)
    report: ThreadReport = saver.run_op(lambda: _op_show(tid, history))
    return report


async def ashow(saver: SaverView, thread_id: str, *, history: int = 10) -> ThreadReport:
    tid = str(thread_id)
    report: ThreadReport = await saver.arun_op(lambda: _op_show(tid, history))
    return report


def release(saver: SaverView, thread_id: str) -> QuarantineEntry:
    """Lift the quarantine of ``thread_id`` and reset its attempt count; the next run
    starts from the same checkpoint with ``max_resume_attempts`` fresh attempts. Returns
    the record that was lifted. Raises ``NotQuarantinedError`` otherwise."""
    tid = str(thread_id)
    entry: QuarantineEntry = saver.run_op(lambda: _op_release(tid))
    return entry


async def arelease(saver: SaverView, thread_id: str) -> QuarantineEntry:
    tid = str(thread_id)
    entry: QuarantineEntry = await saver.arun_op(lambda: _op_release(tid))
    return entry


def rewind(saver: SaverView, thread_id: str, to: str) -> RewindResult:
    """Fork ``thread_id`` from its earlier root checkpoint ``to``: a copy of it becomes
    the head (history is kept), the count is reset and a quarantine lifted; the next
    ``invoke(None, {"configurable": {"thread_id": ...}})`` continues from there. Works
    on any thread no run holds (``ThreadBusyError`` otherwise). ``to`` must exist
    (``CheckpointNotFoundError``) and decode (``CheckpointLoadError``)."""
    tid, cid = str(thread_id), str(to)
    result: RewindResult = saver.run_op(lambda: _op_rewind(saver, tid, cid))
    return result


async def arewind(saver: SaverView, thread_id: str, to: str) -> RewindResult:
    tid, cid = str(thread_id), str(to)
    result: RewindResult = await saver.arun_op(lambda: _op_rewind(saver, tid, cid))
    return result


__all__ = [
    "QUARANTINED",
    "CheckpointSummary",
    "QuarantineEntry",
    "RewindResult",
    "ThreadReport",
    "alist_quarantined",
    "arelease",
    "arewind",
    "ashow",
    "list_quarantined",
    "release",
    "rewind",
    "show",
]
