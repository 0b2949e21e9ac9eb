"""Operator decisions on threads and the workers that run them (issue 25).

What an operator decides, each a sync function with an ``a``-prefixed async twin over
the same op, each recorded in ``durable_audit`` (action in parentheses) in the
decision's own transaction, each refusing with a typed error where it does not apply
(never a silent no-op):

* :func:`queue_resume` (``resume``): queue a thread for the recovery workers, and say
  which live workers serve its graph version (none: nobody will pick it up).
* :func:`queue_answer` (``answer``): store ``Command(resume=value)`` for a thread that
  waits on an interrupt, the value encoded by the saver's serde (an encrypting serde
  encrypts it), and queue it; the worker that claims the thread runs the command
  instead of ``None``, exactly once (see ``recovery``). :func:`answer_now` runs it in
  this process instead, for a console started with the graph.
* :func:`request_cancel` (``cancel``): ask the run holding the live lease to stop; it
  learns it from its next put (the put's own statement returns the flag) or lease
  renewal, and stops at the step boundary after that with ``RunCancelledError``,
  status ``stopped``, resumable. Workers leave a cancelled thread alone until it is
  resumed (``invoke(None)``, :func:`queue_resume`).
* :func:`fork` (``fork``): copy the state at a checkpoint into a new thread (time
  travel); the source is untouched.
* :func:`delete_thread` (``delete``): delete a thread, archived first when an archive
  URL is given or configured (``LANGGRAPH_DURABLE_ARCHIVE_URL``).

And the workers: :func:`list_workers`, :func:`workers_serving` (``durable_workers``,
written by ``RecoveryWorker.run``/``arun``).
"""

from __future__ import annotations

import datetime as _dt
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

from langchain_core.runnables import RunnableConfig

from langgraph_durable import audit as _audit
from langgraph_durable._io import AfterCommit, Batch, Flow, Hook, Op, Stmt, Tx, op_memo
from langgraph_durable._view import SaverView
from langgraph_durable.errors import (
    ArchiveError,
    CheckpointNotFoundError,
    ControlRefusedError,
    ThreadBusyError,
)
from langgraph_durable.leases.owners import owner_is_dead
from langgraph_durable.sql.threads import (
    CONTROL_HEAD_SQL,
    CONTROL_THREAD_SQL,
    EXPIRE_DEAD_LEASE_SQL,
    QUEUE_ANSWER_SQL,
    REQUEST_CANCEL_SQL,
)
from langgraph_durable.sql.workers import WORKER_LIST_SQL

ARCHIVE_URL_ENV = "LANGGRAPH_DURABLE_ARCHIVE_URL"
# A worker's versions entry meaning "any version" (version_policy warn / auto-upgrade).
ANY_VERSION = "*"


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class WorkerInfo:
    """One row of ``durable_workers``. ``alive``: a heartbeat younger than its ttl, not
    stopped, and (a worker of this host and pid namespace) its process still there.
    ``versions``: the stored graph versions it can resume (``*``: any)."""

    worker_id: str
    host: str
    pid: int
    started_at: _dt.datetime
    heartbeat_at: _dt.datetime
    last_poll_at: _dt.datetime | None
    versions: tuple[str, ...]
    graph_names: tuple[str, ...]
    concurrency: int
    claimed: int
    alive: bool
    name: str = ""
    stopped_at: _dt.datetime | None = None

    def serves(self, graph_version: str | None) -> bool:
        return ANY_VERSION in self.versions or (graph_version is not None and graph_version in self.versions)

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        for k in ("started_at", "heartbeat_at", "last_poll_at", "stopped_at"):
            if out[k] is not None:
                out[k] = out[k].isoformat()
        out["versions"], out["graph_names"] = list(self.versions), list(self.graph_names)
        return out


@dataclass(frozen=True)
class ResumeQueued:
    """A thread queued for the workers. ``served_by``: the live workers that serve its
    graph version now; empty: nobody will pick it up until such a worker starts."""

    thread_id: str
    graph_version: str | None
    served_by: tuple[WorkerInfo, ...]


# --------------------------------------------------------------------------- workers


def _worker(row: dict[str, Any]) -> WorkerInfo:
    alive = (
        row["stopped_at"] is None
        and float(row["age_s"]) < float(row["ttl_s"])
        # Same host and pid namespace, pid gone (or reused): dead now, not after ttl.
        and not owner_is_dead(f"{row['identity']}:w")
    )
    return WorkerInfo(
        worker_id=row["worker_id"],
        host=row["host"],
        pid=int(row["pid"]),
        started_at=row["started_at"],
        heartbeat_at=row["heartbeat_at"],
        last_poll_at=row["last_poll_at"],
        versions=tuple(row["versions"] or ()),
        graph_names=tuple(row["graph_names"] or ()),
        concurrency=int(row["concurrency"]),
        claimed=int(row["claimed"]),
        alive=alive,
        name=row["name"],
        stopped_at=row["stopped_at"],
    )


def _op_list_workers(include_dead: bool, limit: int) -> Op[list[WorkerInfo]]:
    rows = yield Batch([Stmt(WORKER_LIST_SQL, {"include_dead": include_dead, "limit": int(limit)}, fetch=True)])
    workers = [_worker(r) for r in rows[0]]
    return workers if include_dead else [w for w in workers if w.alive]


def list_workers(saver: SaverView, *, include_dead: bool = False, limit: int = 100) -> list[WorkerInfo]:
    """The registered recovery workers, newest heartbeat first: live ones only unless
    ``include_dead`` (stopped and dead rows too, until pruned)."""
    return cast("list[WorkerInfo]", saver.run_op(lambda: _op_list_workers(include_dead, limit), transaction=False))


async def alist_workers(saver: SaverView, *, include_dead: bool = False, limit: int = 100) -> list[WorkerInfo]:
    return cast(
        "list[WorkerInfo]", await saver.arun_op(lambda: _op_list_workers(include_dead, limit), transaction=False)
    )


def workers_serving(saver: SaverView, graph_version: str | None) -> list[WorkerInfo]:
    """The live workers that would resume a thread stamped ``graph_version``."""
    return [w for w in list_workers(saver, limit=1000) if w.serves(graph_version)]


async def aworkers_serving(saver: SaverView, graph_version: str | None) -> list[WorkerInfo]:
    return [w for w in await alist_workers(saver, limit=1000) if w.serves(graph_version)]


# --------------------------------------------------------------------------- the thread


@dataclass(frozen=True)
class _Thread:
    thread_id: str
    status: str | None  # None: no durable_threads row (untracked)
    leased: bool
    owner: str | None
    expires_in: float | None
    head: str | None
    interrupted: bool
    graph_version: str | None
    answer_queued: bool = False  # an answer stored for the workers, not consumed yet


def _op_thread(thread_id: str, *, decide: bool = True) -> Op[_Thread]:
    """The thread's row (locked FOR UPDATE: a run start or claim waits for the
    decision's commit) and head root checkpoint. For a decision (``decide``), a live
    lease whose owner is a provably dead process of this machine is ended first, in
    the decision's transaction, as a run start would take it over
    (``EXPIRE_DEAD_LEASE_SQL``): the views call such a thread recoverable, so resume,
    answer, fork or delete of it is not refused as busy for the rest of lease_ttl."""
    rows = yield Batch(
        [Stmt(CONTROL_THREAD_SQL, (thread_id,), fetch=True), Stmt(CONTROL_HEAD_SQL, (thread_id,), fetch=True)]
    )
    row = rows[0][0] if rows[0] else None
    head = rows[1][0] if rows[1] else None
    if decide and row and row["leased"] and owner_is_dead(row["lease_owner"]):
        yield Batch([Stmt(EXPIRE_DEAD_LEASE_SQL, (thread_id, row["lease_owner"]))])
        row = {**row, "leased": False}
    return _Thread(
        thread_id=thread_id,
        status=row["status"] if row else None,
        leased=bool(row and row["leased"]),
        owner=row["lease_owner"] if row else None,
        expires_in=row["expires_in"] if row else None,
        head=head["checkpoint_id"] if head else None,
        interrupted=bool(head and head["interrupted"]),
        graph_version=(head["graph_version"] if head else None) or (row["graph_version"] if row else None),
        answer_queued=bool(row and row.get("answer_checkpoint_id")),
    )


ANSWER_QUEUED = "an answer is already queued for it: the worker that claims it runs it"


def _refuse_queued_answer(t: _Thread, action: str) -> None:
    """A waiting thread answered from the console or CLI is ``queued`` with the answer
    stored until a worker runs it: a second answer (or a resume) is refused as such,
    never as "it does not wait on an interrupt"."""
    if t.answer_queued and t.status == "queued":
        raise ControlRefusedError(
            t.thread_id, action, f"{ANSWER_QUEUED} (graph version {t.graph_version!r}: "
            "`langgraph-durable workers` lists the live workers)", t.status, t.head,
        )


def answer_queued(saver: SaverView, thread_id: str) -> bool:
    """Whether ``thread_id`` is queued with an answer a worker has not run yet."""
    t = saver.run_op(lambda: _op_thread(str(thread_id), decide=False))
    return bool(t.answer_queued and t.status == "queued")


def _refuse_live(t: _Thread) -> None:
    if t.leased:
        raise ThreadBusyError(t.thread_id, t.owner, t.expires_in)


def _refuse_unknown(t: _Thread, action: str) -> None:
    if t.head is None:
        reason = "no such thread" if t.status is None else "it has no checkpoint to run from"
        raise ControlRefusedError(t.thread_id, action, reason, t.status)


def _audit_stmt(action: str, record: _audit.AuditRecord) -> Stmt:
    from langgraph_durable.sql.audit import AUDIT_INSERT_SQL

    memo = op_memo()
    event_id = memo.setdefault("audit_event_id", str(uuid.uuid4()))
    return Stmt(AUDIT_INSERT_SQL, _audit._params(action, record, event_id))


# --------------------------------------------------------------------------- resume


def _op_queue_resume(thread_id: str) -> Op[tuple[str, str | None]]:
    from langgraph_durable.sql.recovery import RECOVERY_QUEUE_SQL

    t = yield from _op_thread(thread_id)
    _refuse_unknown(t, "resume")
    _refuse_live(t)
    _refuse_queued_answer(t, "resume")
    if t.status == "quarantined":
        raise ControlRefusedError(thread_id, "resume", "it is quarantined: release or rewind it", t.status, t.head)
    if t.status == "done":
        raise ControlRefusedError(thread_id, "resume", "it finished: nothing left to run", t.status, t.head)
    if t.status == "waiting" or (t.status is None and t.interrupted):
        raise ControlRefusedError(
            thread_id, "resume", "it waits on an interrupt: answer it instead", t.status, t.head
        )
    rows = yield Batch(
        [Stmt(RECOVERY_QUEUE_SQL, {"thread_id": thread_id, "version": t.graph_version}, fetch=True)]
    )
    if not rows[0]:  # the row lock above makes this a race with nothing: kept as a guard
        raise ThreadBusyError(thread_id, t.owner, t.expires_in)
    record = _audit.AuditRecord(
        thread_id=thread_id, before_id=t.head, after_id=t.head,
        detail={"status": [t.status, "queued"], "graph_version": t.graph_version},
    )
    yield Batch([_audit_stmt("resume", record)])
    return thread_id, t.graph_version


def queue_resume(saver: SaverView, thread_id: str) -> ResumeQueued:
    """Queue ``thread_id`` for the recovery workers (status ``queued``; a cancel hold is
    lifted). Refused: a live lease (``ThreadBusyError``), quarantined (release or
    rewind it), done, waiting on an interrupt (answer it), no such thread
    (``ControlRefusedError``)."""
    tid, version = saver.run_op(lambda: _op_queue_resume(str(thread_id)))
    return ResumeQueued(tid, version, tuple(workers_serving(saver, version)))


async def aqueue_resume(saver: SaverView, thread_id: str) -> ResumeQueued:
    tid, version = await saver.arun_op(lambda: _op_queue_resume(str(thread_id)))
    return ResumeQueued(tid, version, tuple(await aworkers_serving(saver, version)))


# --------------------------------------------------------------------------- answer


def _check_answer(thread_id: str, value: Any) -> None:
    if value is None:
        # LangGraph reads Command(resume=None) as "no resume" (and fails on it).
        raise ControlRefusedError(
            thread_id, "answer", "the answer is null: LangGraph's Command(resume=None) "
            "resumes nothing; answer with a value (e.g. {} or false)",
        )


def _encode_answer(saver: SaverView, value: Any) -> tuple[str, bytes]:
    try:
        tag, data = saver.serde.dumps_typed(value)
    except Exception as exc:
        from langgraph_durable.errors import UnencodableValueError

        raise UnencodableValueError(
            thread_id="", checkpoint_ns="", checkpoint_id=None, path="answer",
            value_type=type(value).__name__, reason=f"{type(exc).__name__}: {exc}",
        ) from exc
    return tag, bytes(data)


def _op_check_waiting(thread_id: str, action: str, checkpoint_id: str | None = None) -> Op[_Thread]:
    t = yield from _op_thread(thread_id)
    _refuse_unknown(t, action)
    _refuse_live(t)
    _refuse_queued_answer(t, action)
    if t.status not in ("waiting", None) or not t.interrupted:
        raise ControlRefusedError(
            thread_id, action, "it does not wait on an interrupt", t.status, t.head
        )
    if checkpoint_id is not None and t.head != checkpoint_id:
        # The operator answered the question asked at checkpoint_id (the confirmation
        # page); the thread moved on to another one since (rev25): never answer a
        # question nobody has read.
        raise ControlRefusedError(
            thread_id, action, f"it moved on since the answer was confirmed: the question asked at "
            f"{checkpoint_id} is no longer pending (the head is {t.head}): read the new one and answer again",
            t.status, t.head,
        )
    return t


def _interrupt_ids(pending_writes: Any) -> list[str]:
    """The ids of the interrupts pending at a checkpoint (its ``__interrupt__`` writes)."""
    ids: list[str] = []
    for _task, channel, value in pending_writes or ():
        if channel == "__interrupt__":
            for item in value if isinstance(value, list | tuple) else [value]:
                iid = getattr(item, "id", None)
                if isinstance(iid, str):
                    ids.append(iid)
    return ids


def _addressed(value: Any, ids: list[str]) -> Any:
    """``Command(resume=...)``'s value: addressed to the one pending interrupt by id
    (``{id: value}``), so a dict answer is never read as a resume map (LangGraph reads
    ``{}``, or a dict keyed by ids, as "resume these interrupts": ``{}`` resumed none)."""
    return {ids[0]: value} if len(ids) == 1 else value


def _check_addressable(thread_id: str, value: Any, ids: list[str], head: str | None) -> None:
    """Several interrupts pending (parallel nodes): LangGraph refuses a plain
    ``Command(resume=value)`` ("you must specify the interrupt id"), so a queued one
    failed on every claim, never counted as an attempt, claimed again at every poll
    (rev25). Only a map of pending interrupt ids to answers applies."""
    if len(ids) > 1 and not (isinstance(value, dict) and value and set(value) <= set(ids)):
        raise ControlRefusedError(
            thread_id, "answer", f"it waits on {len(ids)} interrupts ({', '.join(ids)}): answer with "
            "a map of interrupt id to answer", "waiting", head,
        )


def _op_queue_answer(
    saver: SaverView, thread_id: str, value: Any, checkpoint_id: str | None = None
) -> Op[tuple[str, str | None]]:
    t = yield from _op_check_waiting(thread_id, "answer", checkpoint_id)
    if t.status is None:
        raise ControlRefusedError(
            thread_id, "answer", "it has no durable_threads row (written without leases): "
            "answer it with answer_now", t.status, t.head,
        )
    at: RunnableConfig = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": t.head}}
    saved = yield from saver._op_get_tuple(at)
    ids = _interrupt_ids(saved.pending_writes if saved else ())
    _check_addressable(thread_id, value, ids, t.head)
    tag, data = _encode_answer(saver, _addressed(value, ids))
    rows = yield Batch(
        [Stmt(QUEUE_ANSWER_SQL, {"thread_id": thread_id, "type": tag, "blob": data, "checkpoint_id": t.head}, fetch=True)]
    )
    if not rows[0]:
        raise ThreadBusyError(thread_id, t.owner, t.expires_in)
    # The value itself is never audited (audit rows outlive the thread and hold no
    # state values): its type and the checkpoint it answers.
    record = _audit.AuditRecord(
        thread_id=thread_id, before_id=t.head, after_id=t.head,
        detail={"status": ["waiting", "queued"], "value_type": type(value).__name__, "run_by": "worker"},
    )
    yield Batch([_audit_stmt("answer", record)])
    return thread_id, t.graph_version


def queue_answer(
    saver: SaverView, thread_id: str, value: Any, *, checkpoint_id: str | None = None
) -> ResumeQueued:
    """Answer the interrupt ``thread_id`` waits on with ``Command(resume=value)``, run by
    the recovery worker that claims it (queued). The value is stored as the saver's
    serde encodes it. Refused unless the thread waits on an interrupt with no live
    lease (``ControlRefusedError`` / ``ThreadBusyError``), or for a null value.
    ``checkpoint_id``: the waiting checkpoint whose question was answered (what the
    operator read); refused when the thread's head is another one now."""
    _check_answer(str(thread_id), value)
    _encode_answer(saver, value)  # an unencodable value fails here, before any I/O
    tid, version = saver.run_op(lambda: _op_queue_answer(saver, str(thread_id), value, checkpoint_id))
    return ResumeQueued(tid, version, tuple(workers_serving(saver, version)))


async def aqueue_answer(
    saver: SaverView, thread_id: str, value: Any, *, checkpoint_id: str | None = None
) -> ResumeQueued:
    _check_answer(str(thread_id), value)
    _encode_answer(saver, value)
    tid, version = await saver.arun_op(lambda: _op_queue_answer(saver, str(thread_id), value, checkpoint_id))
    return ResumeQueued(tid, version, tuple(await aworkers_serving(saver, version)))


def _op_answer_now(thread_id: str, value_type: str, checkpoint_id: str | None = None) -> Op[_Thread]:
    t = yield from _op_check_waiting(thread_id, "answer", checkpoint_id)
    record = _audit.AuditRecord(
        thread_id=thread_id, before_id=t.head, after_id=t.head,
        detail={"status": [t.status, "running"], "value_type": value_type, "run_by": "console"},
    )
    yield Batch([_audit_stmt("answer", record)])
    return t


def _answer_config(thread_id: str, config: RunnableConfig | None) -> RunnableConfig:
    cfg: dict[str, Any] = dict(config or {})
    configurable = dict(cfg.get("configurable") or {})
    configurable["thread_id"] = thread_id
    configurable.pop("checkpoint_id", None)
    cfg["configurable"] = configurable
    return cast(RunnableConfig, cfg)


def _state_checkpoint(state: Any) -> str | None:
    return cast("str | None", (state.config or {}).get("configurable", {}).get("checkpoint_id"))


def _same_question(thread_id: str, state: Any, checkpoint_id: str | None) -> None:
    """answer_now's second look, just before the run (rev25): the interrupts it
    addresses are still those of ``checkpoint_id``. (A run started between this read
    and invoke's lease is the window left: the lease, not this check, orders them.)"""
    now = _state_checkpoint(state)
    if checkpoint_id is not None and now != checkpoint_id:
        raise ControlRefusedError(
            thread_id, "answer", f"it moved on since the answer was confirmed: the question asked at "
            f"{checkpoint_id} is no longer pending (the head is {now}): read the new one and answer again",
            None, now,
        )


def answer_now(
    graph: Any, thread_id: str, value: Any, *, config: RunnableConfig | None = None,
    checkpoint_id: str | None = None,
) -> Any:
    """Answer the interrupt ``thread_id`` waits on by running
    ``graph.invoke(Command(resume=value), config)`` in this process; returns what
    invoke returns. Refused as :func:`queue_answer` (``checkpoint_id`` too)."""
    from langgraph.types import Command

    from langgraph_durable.recovery import durable_saver_of

    _check_answer(str(thread_id), value)
    saver = durable_saver_of(graph)
    cfg = _answer_config(str(thread_id), config)
    # The question read first (refusals before the audit row), the decision checked
    # and audited under the thread's lock at that checkpoint, the question read again.
    state = graph.get_state(cfg)
    _same_question(str(thread_id), state, checkpoint_id)
    at = _state_checkpoint(state)
    ids = [i.id for i in state.interrupts]
    _check_addressable(str(thread_id), value, ids, at)
    saver.run_op(lambda: _op_answer_now(str(thread_id), type(value).__name__, at))
    _same_question(str(thread_id), graph.get_state(cfg), at)
    return graph.invoke(Command(resume=_addressed(value, ids)), cfg)


async def aanswer_now(
    graph: Any, thread_id: str, value: Any, *, config: RunnableConfig | None = None,
    checkpoint_id: str | None = None,
) -> Any:
    from langgraph.types import Command

    from langgraph_durable.recovery import durable_saver_of

    _check_answer(str(thread_id), value)
    saver = durable_saver_of(graph)
    cfg = _answer_config(str(thread_id), config)
    state = await graph.aget_state(cfg)
    _same_question(str(thread_id), state, checkpoint_id)
    at = _state_checkpoint(state)
    ids = [i.id for i in state.interrupts]
    _check_addressable(str(thread_id), value, ids, at)
    await saver.arun_op(lambda: _op_answer_now(str(thread_id), type(value).__name__, at))
    _same_question(str(thread_id), await graph.aget_state(cfg), at)
    return await graph.ainvoke(Command(resume=_addressed(value, ids)), cfg)


# --------------------------------------------------------------------------- cancel


def _op_request_cancel(thread_id: str, token: int | None = None) -> Op[None]:
    rows = yield Batch(
        [
            Stmt(CONTROL_THREAD_SQL, (thread_id,), fetch=True),
            Stmt(REQUEST_CANCEL_SQL, (thread_id, token), fetch=True),
        ]
    )
    if not rows[1]:
        row = rows[0][0] if rows[0] else None
        status = row["status"] if row else None
        if row is not None and row["leased"] and token is not None:
            # The run the operator confirmed ended; another run holds the thread now
            # (rev25): never stop a run nobody asked to stop.
            raise ControlRefusedError(
                thread_id, "cancel", f"the run confirmed (lease token {token}) has ended: another run "
                f"(lease token {row['lease_token']}, {row['lease_owner']}) holds it now; confirm again", status,
            )
        raise ControlRefusedError(
            thread_id, "cancel", "no live lease: nothing is running on it now", status
        )
    got = rows[1][0]
    record = _audit.AuditRecord(
        thread_id=thread_id, detail={"lease_token": int(got["lease_token"]), "owner": got["lease_owner"]}
    )
    yield Batch([_audit_stmt("cancel", record)])


def request_cancel(saver: SaverView, thread_id: str, *, token: int | None = None) -> None:
    """Ask the run holding ``thread_id``'s live lease to stop at its next step boundary
    (it raises ``RunCancelledError``; the thread is ``stopped`` and resumable, and
    workers leave it until resumed). Refused without a live lease
    (``ControlRefusedError``). The request belongs to that run's lease: a run that ends
    first leaves nothing behind for the next. ``token``: the lease token of the run
    the operator means (the confirmation page's); refused when another run holds it."""
    tok = None if token is None else int(token)
    saver.run_op(lambda: _op_request_cancel(str(thread_id), tok))


async def arequest_cancel(saver: SaverView, thread_id: str, *, token: int | None = None) -> None:
    tok = None if token is None else int(token)
    await saver.arun_op(lambda: _op_request_cancel(str(thread_id), tok))


# --------------------------------------------------------------------------- fork

def new_fork_id(thread_id: str) -> str:
    """A fresh id for a fork of ``thread_id`` (``fork``'s default): drawn once by a
    caller that confirms before forking (the console's page), so a repeated request
    is refused as a fork onto an existing id instead of making another fork."""
    return f"{thread_id}-fork-{uuid.uuid4().hex[:8]}"


_fork_id = new_fork_id


def _op_fork(saver: SaverView, thread_id: str, checkpoint_id: str, new_thread_id: str) -> Op[str]:
    from langgraph_durable.sql.threads import FORK_THREAD_INSERT_SQL, THREAD_HAS_CHECKPOINTS_SQL

    memo = op_memo()
    if "fork" in memo:  # a retry whose first attempt committed (lost COMMIT reply)
        return cast(str, memo["fork"])
    t = yield from _op_thread(thread_id)
    _refuse_unknown(t, "fork")
    _refuse_live(t)
    source: RunnableConfig = {
        "configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": checkpoint_id}
    }
    saved = yield from saver._op_get_tuple(source)
    if saved is None:
        raise CheckpointNotFoundError(thread_id, checkpoint_id)
    # The new id is claimed first, by its durable_threads row: 'stopped' and held
    # (cancelled_at), so the console lists the fork and no worker runs it before an
    # operator resumes it (queue_resume, invoke(None)). Inserted before anything is
    # written and refused when the row exists: two forks into one new id at once
    # serialize on its key and the second is refused (rev25: each used to see no
    # checkpoint of the other, uncommitted, and both wrote theirs into one thread);
    # an id in use without a checkpoint yet (a queued row, a run before its first
    # put) is refused too.
    version = saved.metadata.get("graph_version")
    claimed = yield Batch([Stmt(FORK_THREAD_INSERT_SQL, (new_thread_id, version), fetch=True)])
    has = yield Batch([Stmt(THREAD_HAS_CHECKPOINTS_SQL, (new_thread_id,), fetch=True)])
    if not claimed[0] or has[0]:
        raise ControlRefusedError(
            new_thread_id, "fork into", "a thread of that id exists already", None
        )
    # The same checkpoint id in the new thread (copy_thread's way): LangGraph's task ids
    # hash it, so the copied pending writes (completed tasks, interrupts) still belong
    # to the tasks the fork runs next.
    checkpoint: dict[str, Any] = dict(cast(Any, saved.checkpoint))
    new_id = str(checkpoint["id"])
    metadata = dict(saved.metadata)
    metadata.pop("run_id", None)
    metadata["source"] = "fork"
    metadata["forked_from"] = {"thread_id": thread_id, "checkpoint_id": checkpoint_id}
    target: RunnableConfig = {"configurable": {"thread_id": new_thread_id, "checkpoint_ns": ""}}
    put = saver._op_put(target, cast(Any, checkpoint), cast(Any, metadata), dict(checkpoint["channel_versions"]))
    written = yield from _audit._delegate(put)
    # The checkpoint's pending interrupts too (a fork of a waiting thread waits on the
    # same question), not the writes of tasks that completed after it: a fork runs the
    # next step again from this state (time travel), as LangGraph's fork does.
    by_task: dict[str, list[tuple[str, Any]]] = {}
    for task_id, channel, value in saved.pending_writes or ():
        if channel == "__interrupt__":
            by_task.setdefault(task_id, []).append((channel, value))
    for task_id, writes in by_task.items():
        yield from _audit._delegate(saver._op_put_writes(written, writes, task_id, ""))
    record = _audit.AuditRecord(
        thread_id=thread_id, before_id=checkpoint_id, after_id=new_id,
        detail={"new_thread_id": new_thread_id, "new_checkpoint_id": new_id},
    )
    yield Batch([_audit_stmt("fork", record)])
    memo["fork"] = new_thread_id
    return new_thread_id


def fork(saver: SaverView, thread_id: str, checkpoint_id: str, new_thread_id: str | None = None) -> str:
    """Copy the state at ``checkpoint_id`` of ``thread_id`` (with its pending interrupts)
    into a new thread whose head it is (LangGraph's "fork": metadata source ``fork``
    and ``forked_from``); returns the new thread's id. The source is untouched. The new
    thread is ``stopped`` and held: it runs on ``invoke(None)`` or :func:`queue_resume`.
    Refused on a live lease of the source, an existing ``new_thread_id``, an unknown
    checkpoint (``CheckpointNotFoundError``)."""
    new = str(new_thread_id or _fork_id(thread_id))
    return cast(str, saver.run_op(lambda: _op_fork(saver, str(thread_id), str(checkpoint_id), new)))


async def afork(saver: SaverView, thread_id: str, checkpoint_id: str, new_thread_id: str | None = None) -> str:
    new = str(new_thread_id or _fork_id(thread_id))
    return cast(str, await saver.arun_op(lambda: _op_fork(saver, str(thread_id), str(checkpoint_id), new)))


# --------------------------------------------------------------------------- delete


def _op_check_deletable(thread_id: str) -> Op[_Thread]:
    t = yield from _op_thread(thread_id)
    if t.head is None and t.status is None:
        raise ControlRefusedError(thread_id, "delete", "no such thread", None)
    _refuse_live(t)
    return t


def _op_delete(
    saver: SaverView, thread_id: str, manifest: dict[str, Any] | None, archived: str | None
) -> Op[None]:
    from langgraph_durable import archive as _archive
    from langgraph_durable.sql.retention import FREED_ARTIFACTS_SQL, STOCK_TABLE_SIZES
    from langgraph_durable.sql.threads import DELETE_THREAD_ROWS_SQL

    t = yield from _op_check_deletable(thread_id)
    record = _audit.AuditRecord(
        thread_id=thread_id, before_id=t.head,
        detail={"status": t.status, "archived": _audit.redact_url(archived) if archived else None},
    )
    if manifest is None:
        yield from _audit._delegate(saver._op_delete_thread(thread_id))
    else:
        # Delete exactly what the archive holds (retention's checked deletes): a write
        # since the archive was made rolls the delete back (ArchiveError, nothing lost).
        ids = [thread_id]
        out = yield Batch(
            [Stmt(FREED_ARTIFACTS_SQL, {"ids": ids}, fetch=True, prepare=False)]
            + _archive.delete_checked_stmts(ids, [], dict(STOCK_TABLE_SIZES))
            + [Stmt(DELETE_THREAD_ROWS_SQL, ([],))]
        )
        try:
            _archive.check_deleted(out[1:-1], ids, {thread_id: manifest["fingerprint"]})
        except _archive.ChangedSinceArchive as exc:
            raise ArchiveError(
                f"thread {thread_id!r} changed after it was archived to {archived}: not deleted; retry",
                url=archived or "", thread_id=thread_id,
            ) from exc
        yield AfterCommit(partial(saver._known_refs.forget_thread, thread_id))
    yield Batch([_audit_stmt("delete", record)])


def _delete_flow(saver: SaverView, thread_id: str, url: str | None, aio: bool) -> Flow[str | None]:
    yield Tx(lambda: _op_check_deletable(thread_id))
    manifest: dict[str, Any] | None = None
    location: str | None = None
    if url:
        from langgraph_durable.archive import Store, op_archive_batch

        store = yield Hook(lambda: Store(url, None, saver.serde), ())
        done, failed = yield from op_archive_batch(saver, store, [thread_id], aio)
        if thread_id in failed:
            raise failed[thread_id]
        manifest = done.get(thread_id)
        if manifest is None:
            raise ControlRefusedError(thread_id, "delete", "nothing to archive", None)
        location = str(manifest.get("url") or url)
    yield Tx(lambda: _op_delete(saver, thread_id, manifest, location))
    return location


def _archive_url(archive_url: str | None) -> str | None:
    return archive_url or os.environ.get(ARCHIVE_URL_ENV) or None


def delete_thread(saver: SaverView, thread_id: str, *, archive_url: str | None = None) -> str | None:
    """Delete ``thread_id`` whole (every table of the package too). With an archive URL
    (``archive_url``, else ``LANGGRAPH_DURABLE_ARCHIVE_URL``) the thread is written
    there and verified first (``archive.restore`` loads it back) and exactly the
    archived rows are deleted; returns the archive file's location (None: no archive).
    Refused on a live lease (``ThreadBusyError``) or an unknown thread."""
    url = _archive_url(archive_url)
    return cast("str | None", saver.run_flow(_delete_flow(saver, str(thread_id), url, False)))


async def adelete_thread(saver: SaverView, thread_id: str, *, archive_url: str | None = None) -> str | None:
    url = _archive_url(archive_url)
    return cast("str | None", await saver.arun_flow(_delete_flow(saver, str(thread_id), url, True)))


__all__: Sequence[str] = [
    "ANY_VERSION",
    "ARCHIVE_URL_ENV",
    "ResumeQueued",
    "WorkerInfo",
    "aanswer_now",
    "adelete_thread",
    "afork",
    "alist_workers",
    "answer_now",
    "aqueue_answer",
    "aqueue_resume",
    "arequest_cancel",
    "answer_queued",
    "aworkers_serving",
    "delete_thread",
    "fork",
    "list_workers",
    "new_fork_id",
    "queue_answer",
    "queue_resume",
    "request_cancel",
    "workers_serving",
]
