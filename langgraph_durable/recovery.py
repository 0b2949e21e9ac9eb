"""Recovery workers: find threads whose last run did not finish and resume them.

Any number of worker processes, on any number of machines, point at one Postgres. All
coordination lives in ``durable_threads``; a worker keeps no state that another needs:

* **Claim.** One statement selects a candidate with ``FOR UPDATE SKIP LOCKED`` (workers
  never queue behind each other's row locks) and writes a lease for this worker on it
  (owner, fencing token + 1, expiry). A candidate is a thread with a root checkpoint to
  resume from, no live lease, and status

  - ``running`` with an expired lease: its process died (crash, SIGKILL, lost machine);
  - ``stopped``: handed back (a worker shut down at a step boundary, a cancelled run);
  - ``queued``: new work submitted with :func:`submit`;
  - ``error`` (``retry_errors=True``, the default): retried after an exponential
    backoff; poison detection (``max_resume_attempts`` on the saver) quarantines the
    thread once that many attempts at the same checkpoint failed, which bounds the loop.

  Never ``waiting`` (an interrupt waits for a human), ``quarantined`` or ``done``.
  The latest checkpoint's ``graph_version`` stamp must be one the worker's graph can
  run: its own version, or one with a registered migration path to it (``refuse``
  policy), any version (``warn`` / ``auto-upgrade``), unstamped threads only when the
  saver adopts them.
* **Resume.** ``graph.stream(None, config)`` (``astream`` in :meth:`RecoveryWorker.arun`)
  with the claim handed to the run: the run's own lease acquisition takes it over from
  the same owner, so there is no window where the thread is free. From there the saver's
  run lifecycle applies (renewal, fencing, release with done / waiting / stopped / error).
* **Shutdown.** :meth:`RecoveryWorker.stop` (SIGTERM / SIGINT in :meth:`RecoveryWorker.run`)
  stops claiming; running threads stop at their next superstep boundary (the step in
  flight finishes and is checkpointed), their leases are released with status
  ``stopped`` and any other worker resumes them at once. ``shutdown="finish"`` lets runs
  complete instead. A second signal exits at once: leases then expire after ``lease_ttl``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import random
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, cast

from langchain_core.runnables import RunnableConfig

from langgraph_durable import _sealing
from langgraph_durable import telemetry as _telemetry
from langgraph_durable._io import AsyncDriver, Batch, Flow, Hook, Op, Stmt, SyncDriver, Tx
from langgraph_durable._sealing import Keyring
from langgraph_durable._view import SaverView
from langgraph_durable.core.base import _DurableBase
from langgraph_durable.core.reader import ReadOnlyView
from langgraph_durable.errors import (
    AnswerDecodeError,
    ConfigurationError,
    GraphVersionMismatchError,
    LeaseLostError,
    MigrationError,
    PoisonCheckpointError,
    ReadOnlyViewError,
    RunCancelledError,
    ThreadBusyError,
)
from langgraph_durable.leases.dead import op_dead_leases
from langgraph_durable.leases.model import claim_handoff
from langgraph_durable.leases.owners import process_identity
from langgraph_durable.quarantine import needs_operator
from langgraph_durable.sql.recovery import (
    CLAIM_PLAN_SQL,
    RECOVERY_FINISH_SQL,
    RECOVERY_QUEUE_SQL,
    RECOVERY_THREAD_STATE_SQL,
    STATUS_COUNTS_SQL,
    STATUS_FOLD_ROWS,
    STATUS_FOLD_SQL,
    STATUS_PLAN_SQL,
    STATUS_ROWS_SQL,
    claim_sql,
    claim_version_params,
)
from langgraph_durable.sql.threads import CLEAR_ANSWER_SQL
from langgraph_durable.sql.workers import (
    WORKER_HEARTBEAT_SQL,
    WORKER_PRUNE_SQL,
    WORKER_REGISTER_SQL,
    WORKER_STOPPED_SQL,
)
from langgraph_durable.versioning import VERSION_KEY, MigrationRegistry, graph_fingerprint

logger = logging.getLogger("langgraph_durable.recovery")

Shutdown = Literal["step", "finish"]

# Statuses a claim may pick up (besides 'error', which is opt-in with a backoff).
RECOVERABLE = ("running", "stopped", "queued")

# Rows of stopped or dead workers kept in durable_workers (newest first), at most.
WORKER_ROWS_KEPT = 200

STATUS_KINDS = ("running", "recoverable", "waiting", "quarantined", "done", "error", "orphaned")


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Claim:
    """A thread this worker holds a lease on and is about to resume."""

    thread_id: str
    owner: str
    token: int
    checkpoint_id: str
    graph_version: str | None
    previous_status: str
    attempt: int
    # A queued answer (ops.control.queue_answer): the serde's (type, bytes) of the
    # Command(resume=...) value, and the waiting checkpoint it answers.
    answer: tuple[str, bytes] | None = None
    answer_checkpoint_id: str | None = None


@dataclass(frozen=True)
class RecoveryResult:
    """How one recovery ended. ``status`` is the thread's status afterwards (done,
    waiting, stopped, error, quarantined, ...); ``outcome`` says what happened to this
    run: ``finished`` (the run ended on its own), ``handed_back`` (stopped at a step
    boundary on shutdown), ``lease_lost`` (fenced out by a takeover), ``refused``
    (poison / version / busy before any node ran), ``needs_operator`` (an
    ``@idempotent`` call's outcome is unknown, or kin: ``quarantine.needs_operator``;
    not counted toward poison) or ``failed`` (the graph raised)."""

    thread_id: str
    checkpoint_id: str
    attempt: int
    previous_status: str
    status: str | None
    outcome: str
    error: str | None
    seconds: float
    worker: str


@dataclass
class WorkerStats:
    claimed: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)

    def add(self, result: RecoveryResult) -> None:
        self.claimed += 1
        self.outcomes[result.outcome] = self.outcomes.get(result.outcome, 0) + 1


# --------------------------------------------------------------------------- graphs


def durable_saver_of(graph: Any) -> _DurableBase:
    """The durable saver a compiled graph checkpoints with, or ``ConfigurationError``."""
    saver = getattr(graph, "checkpointer", None)
    if not isinstance(saver, _DurableBase):
        raise ConfigurationError(
            "recovery needs a graph compiled with a DurablePostgresSaver or "
            f"AsyncDurablePostgresSaver checkpointer, got {type(saver).__name__}",
            checkpointer=type(saver).__name__,
        )
    return saver


def graph_version_of(graph: Any) -> str | None:
    """The version the saver stamps runs of ``graph`` with (see ``_current_version``)."""
    saver = durable_saver_of(graph)
    if saver.graph_version:
        return saver.graph_version
    try:
        return graph_fingerprint(graph)
    except Exception:  # a graph we cannot describe runs unversioned, as in the saver
        return None


def runnable_versions(version: str | None, migrations: MigrationRegistry) -> set[str]:
    """Stored versions a graph at ``version`` can resume: its own and every version with
    a registered migration path to it."""
    if version is None:
        return set()
    return migrations.sources(version)


@dataclass(frozen=True)
class _Target:
    graph: Any
    saver: _DurableBase
    version: str | None
    versions: frozenset[str]
    any_version: bool
    adopt: bool


def _target(graph: Any) -> _Target:
    saver = durable_saver_of(graph)
    version = graph_version_of(graph)
    any_version = saver.version_policy in ("warn", "auto-upgrade") or version is None
    return _Target(
        graph=graph,
        saver=saver,
        version=version,
        versions=frozenset(runnable_versions(version, saver.migrations)),
        any_version=any_version,
        adopt=saver.unversioned_policy == "adopt",
    )


def _owner(name: str) -> str:
    return f"{name}:{uuid.uuid4().hex[:12]}"


# --------------------------------------------------------------------------- ops


def _op_claim(
    targets: Sequence[_Target],
    owner: str,
    ttl: float,
    *,
    retry_errors: bool,
    backoff: float,
    max_backoff: float,
    statuses: Sequence[str],
    skip: Iterable[str],
) -> Op[Claim | None]:
    versions = sorted({v for t in targets for v in t.versions})
    any_version = any(t.any_version for t in targets)
    params = {
        "statuses": list(statuses),
        "retry_errors": retry_errors,
        "backoff": float(backoff),
        "max_backoff": float(max_backoff),
        "any_version": any_version,
        "versions": versions,
        **({} if any_version else claim_version_params(versions)),
        # Unstamped threads belong to no graph in particular: only a worker with one
        # graph may take them (which graph would it pick otherwise?).
        "adopt": len(targets) == 1 and targets[0].adopt,
        "skip": sorted(skip),
        "limit": 1,
        "owner": owner,
        "ttl": float(ttl),
    }
    # A worker of some versions walks only theirs (issue 26): claim_sql keyed by how many.
    count = None if any_version else len(versions)
    sql = claim_sql(statuses, retry_errors, versions=count)
    found: list[dict[str, Any]] = []
    for _ in range(CLAIM_REPAIRS_PER_POLL):
        # The plan settings first (CLAIM_PLAN_SQL: jit off, the ordered ready-index walk
        # whatever the statistics say; issue 14), in the same transaction as the claim.
        rows = yield Batch(
            [Stmt(CLAIM_PLAN_SQL), Stmt(sql, params, fetch=True, prepare=False, name="claim")]
        )
        found = rows["claim"]
        if not found or found[0]["claimed"]:
            break
        _log_repaired(found[0])
        found = []  # the row named the wrong version: corrected, poll again
    if not found and any(t.saver.takeover_dead_owners for t in targets):
        found = yield from _op_claim_dead(params, statuses, retry_errors, count)
    if not found:
        return None
    r = found[0]
    blob = r.get("answer_blob")
    return Claim(
        thread_id=r["thread_id"],
        owner=owner,
        token=int(r["lease_token"]),
        checkpoint_id=r["checkpoint_id"],
        graph_version=r["graph_version"],
        previous_status=r["prev_status"],
        attempt=int(r["attempt"]),
        answer=None if blob is None else (str(r["answer_type"]), bytes(blob)),
        answer_checkpoint_id=r.get("answer_checkpoint_id"),
    )


# How many rows naming the wrong version one poll corrects before it gives up for now
# (each is one claim statement; the next poll goes on).
CLAIM_REPAIRS_PER_POLL = 16


def _log_repaired(row: Mapping[str, Any]) -> None:
    logger.info(
        "thread %s: its row named another graph version than its latest checkpoint (%s); corrected",
        row["thread_id"], row["graph_version"],
    )


def _op_claim_dead(
    params: dict[str, Any], statuses: Sequence[str], retry_errors: bool, versions: int | None = None
) -> Op[list[dict[str, Any]]]:
    """Nothing else to claim: the live leases of this machine whose owner is a dead
    process, judged as a run start judges them (``leases.dead``, ``owner_is_dead``),
    claimed now instead of after ``lease_ttl`` (the takeover bumps the fencing token
    like any claim). Only on a poll that found nothing: a busy worker's claim stays one
    statement; a dead owner's thread waits at most until the worker's queue runs dry,
    never longer than its lease would have."""
    dead = yield from op_dead_leases()
    if not dead:
        return []
    owners = sorted({r["lease_owner"] for r in dead})
    rows = yield Batch(
        [Stmt(claim_sql(statuses, retry_errors, dead=True, versions=versions), {**params, "dead": owners},
              fetch=True, prepare=False)]
    )
    claimed = [r for r in rows[0] if r["claimed"]]
    for r in rows[0]:
        if not r["claimed"]:
            _log_repaired(r)
    for r in claimed:
        holder = next((d["lease_owner"] for d in dead if d["thread_id"] == r["thread_id"]), None)
        logger.warning(
            "thread %s: lease holder %s is a dead process of this machine and pid namespace; "
            "claiming it now", r["thread_id"], holder,
        )
        _telemetry.count("leases_taken_over", reason="dead_owner")
    return claimed


def _op_finish(claim: Claim, clear_answer: bool = False) -> Op[dict[str, Any] | None]:
    params = {"thread_id": claim.thread_id, "owner": claim.owner, "token": claim.token}
    clear = (
        [Stmt(CLEAR_ANSWER_SQL, {"thread_id": claim.thread_id, "checkpoint_id": claim.answer_checkpoint_id})]
        if clear_answer and claim.answer_checkpoint_id is not None
        else []
    )
    rows = yield Batch(
        [
            Stmt(RECOVERY_FINISH_SQL, params),
            *clear,
            Stmt(RECOVERY_THREAD_STATE_SQL, (claim.thread_id,), fetch=True, name="thread"),
        ]
    )
    return rows["thread"][0] if rows["thread"] else None


def _op_register(params: dict[str, Any]) -> Op[None]:
    """Register a worker (durable_workers), pruning old stopped / dead rows first (the
    table stays bounded: a day of history, at most WORKER_ROWS_KEPT such rows)."""
    yield Batch(
        [
            Stmt(WORKER_PRUNE_SQL, {"keep_s": 86400.0, "keep": WORKER_ROWS_KEPT}),
            Stmt(WORKER_REGISTER_SQL, params),
        ]
    )


def _op_heartbeat(params: dict[str, Any]) -> Op[bool]:
    rows = yield Batch([Stmt(WORKER_HEARTBEAT_SQL, params, fetch=True)], final=True)
    return bool(rows[0])


def _op_worker_stopped(worker_id: str) -> Op[None]:
    yield Batch([Stmt(WORKER_STOPPED_SQL, {"worker_id": worker_id})], final=True)


def _op_status_counts() -> Op[dict[str, int]]:
    rows = yield Batch(
        [
            Stmt(STATUS_PLAN_SQL),
            Stmt(STATUS_ROWS_SQL, (STATUS_FOLD_ROWS + 1,), fetch=True, name="rows"),
            Stmt(STATUS_COUNTS_SQL, fetch=True, name="counts"),
        ]
    )
    counts = dict.fromkeys(STATUS_KINDS, 0)
    orphans = 0
    for r in rows["counts"]:
        status, n, live = r["status"], int(r["n"]), int(r["live"])
        orphans = int(r["orphans"])  # the same on every row
        if status in ("done", "waiting", "quarantined"):
            counts[status] += n
        elif status in ("running", "stopped", "queued", "error"):
            counts["running"] += live  # a live lease: running whatever the status
            counts["error" if status == "error" else "recoverable"] += n - live
        else:  # a status no code writes: counted as the old CASE did one with no checkpoint
            counts["orphaned"] += n
    # Orphaned (no checkpoint to resume) among the recoverable-looking ones.
    counts["recoverable"] -= orphans
    counts["orphaned"] += orphans
    if rows["rows"][0]["n"] > STATUS_FOLD_ROWS:
        yield Batch([Stmt(STATUS_FOLD_SQL)])
    return counts


def status_counts(saver: SaverView) -> dict[str, int]:
    """Threads by lifecycle: running (live lease), recoverable (a worker would resume
    it: crashed, handed back or queued), waiting (on an interrupt), quarantined, done,
    error (the last run raised; retried with backoff when workers retry errors) and
    orphaned (its run died before writing a first checkpoint: nothing to resume)."""
    return cast("dict[str, int]", saver.run_op(_op_status_counts))


async def astatus_counts(saver: SaverView) -> dict[str, int]:
    return cast("dict[str, int]", await saver.arun_op(_op_status_counts))


# --------------------------------------------------------------------------- submit


def _submit_config(graph: Any, config: RunnableConfig) -> tuple[RunnableConfig, str, str | None]:
    configurable = dict(config.get("configurable") or {})
    if "thread_id" not in configurable:
        raise ConfigurationError("submit() needs config['configurable']['thread_id']")
    version = configurable.get(VERSION_KEY) or graph_version_of(graph)
    if version:
        # Stamps the input checkpoint, so the claim's version filter sees it.
        configurable[VERSION_KEY] = version
    cfg = cast(RunnableConfig, {**config, "configurable": configurable})
    return cfg, str(configurable["thread_id"]), version


def _op_check_submittable(thread_id: str, ring: Keyring | None = None) -> Op[None]:
    rows = yield Batch([Stmt(RECOVERY_THREAD_STATE_SQL, (thread_id,), fetch=True)])
    row = rows[0][0] if rows[0] else None
    if row is not None and row["status"] == "quarantined":
        # Refused before anything is written: the operator releases or rewinds it first.
        q = yield Batch(
            [Stmt("SELECT * FROM durable_quarantine WHERE thread_id = %s", (thread_id,), fetch=True)]
        )
        info = q[0][0] if q[0] else {}
        raise PoisonCheckpointError(
            thread_id, info.get("checkpoint_id"), int(info.get("attempts") or row["attempts"]),
            _sealing.open_text(
                ring, info.get("last_error") or row["last_error"], thread_id=thread_id,
                where="last_error", strict=False,
            ),
        )


def _op_queue(thread_id: str, version: str | None) -> Op[bool]:
    rows = yield Batch(
        [Stmt(RECOVERY_QUEUE_SQL, {"thread_id": thread_id, "version": version}, fetch=True)]
    )
    return bool(rows[0])


def submit(graph: Any, input: Any, config: RunnableConfig) -> RunnableConfig:
    """Queue new work for the workers instead of running it here: the input is saved as
    the thread's next checkpoint (``update_state(..., as_node="__input__")``, the same
    checkpoint ``invoke`` would write first) and the thread is marked ``queued``; a
    worker running ``graph`` picks it up. Raises ``ThreadBusyError`` while a run holds
    the thread, ``PoisonCheckpointError`` if it is quarantined (nothing written). Returns
    the config of the input checkpoint."""
    flow = _submit_flow(graph, input, config, graph.update_state)
    return cast(RunnableConfig, SyncDriver.for_saver(durable_saver_of(graph)).run_flow(flow))


async def asubmit(graph: Any, input: Any, config: RunnableConfig) -> RunnableConfig:
    flow = _submit_flow(graph, input, config, graph.aupdate_state)
    return cast(RunnableConfig, await AsyncDriver.for_saver(durable_saver_of(graph)).run_flow(flow))


def _submit_flow(
    graph: Any, input: Any, config: RunnableConfig, update_state: Callable[..., Any]
) -> Flow[Any]:
    """submit's one body; ``update_state``: the graph's ``update_state`` or ``aupdate_state``."""
    cfg, thread_id, version = _submit_config(graph, config)
    ring = _sealing.keyring_of(durable_saver_of(graph).serde)
    yield Tx(lambda: _op_check_submittable(thread_id, ring))
    out = yield Hook(functools.partial(update_state, as_node="__input__"), (cfg, input))
    if not (yield Tx(lambda: _op_queue(thread_id, version))):
        raise ThreadBusyError(thread_id, None, None)
    logger.info("queued thread=%s graph_version=%s", thread_id, version)
    return out


# --------------------------------------------------------------------------- worker


@dataclass(frozen=True)
class _Mode:
    """What a sync and an async worker do differently: the driver that runs their
    flows (ops on the saver), how a claimed thread's graph is streamed, how a slot
    pauses (interruptible by stop())."""

    driver: type[SyncDriver] | type[AsyncDriver]
    stream: Callable[[RecoveryWorker, _Target, Claim], Any]
    pause: Callable[[RecoveryWorker, float], Any]

    def flows(self, worker: RecoveryWorker) -> Any:
        return self.driver.for_saver(worker.saver)


class RecoveryWorker:
    """Resumes unfinished threads of the given graphs; see the module docstring.

    ``graphs``: one compiled graph or several (each compiled with a durable saver on
    the same database; several graphs must have distinct versions, which route each
    thread to the graph that wrote it). ``concurrency``: threads resumed at once (OS
    threads in :meth:`run`, asyncio tasks in :meth:`arun`). ``config``: extra config
    for every resumed run (e.g. ``recursion_limit``)."""

    # How run()/recover_one() and arun()/arecover_one() drive the one body (set below).
    _sync: ClassVar[_Mode]
    _async: ClassVar[_Mode]

    def __init__(
        self,
        graphs: Any,
        *,
        concurrency: int = 1,
        poll_interval: float = 1.0,
        retry_errors: bool = True,
        error_backoff: float = 5.0,
        max_error_backoff: float = 300.0,
        recover_stopped: bool = True,
        shutdown: Shutdown = "step",
        config: RunnableConfig | None = None,
        name: str | None = None,
        on_recovery: Callable[[RecoveryResult], Any] | None = None,
        heartbeat_interval: float | None = None,
        register: bool = True,
    ) -> None:
        graph_list = _mapping_or_list(graphs)
        if not graph_list:
            raise ConfigurationError("RecoveryWorker needs at least one graph")
        if concurrency < 1:
            raise ConfigurationError("concurrency must be >= 1", concurrency=concurrency)
        if poll_interval <= 0:
            raise ConfigurationError("poll_interval must be > 0", poll_interval=poll_interval)
        if error_backoff < 0 or max_error_backoff < 0:
            raise ConfigurationError("error backoffs must be >= 0")
        if shutdown not in ("step", "finish"):
            raise ConfigurationError(f"unknown shutdown mode {shutdown!r}", shutdown=shutdown)
        self.targets = [_target(g) for g in graph_list]
        self._check_targets()
        self.saver = self.targets[0].saver
        self.concurrency = concurrency
        self.poll_interval = poll_interval
        self.retry_errors = retry_errors
        self.error_backoff = error_backoff
        self.max_error_backoff = max_error_backoff
        self.statuses = RECOVERABLE if recover_stopped else ("running", "queued")
        self.shutdown = shutdown
        self.config: dict[str, Any] = dict(config or {})
        self.name = name or process_identity()
        self.on_recovery = on_recovery
        self.stats = WorkerStats()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        # Threads a run refused before starting (version / migration / busy): not
        # re-claimed by this worker for a while, so a bad thread cannot spin it. Pure
        # optimisation: another worker may still try, and a restart forgets it.
        self._skip: dict[str, float] = {}
        self._aio_stop: asyncio.Event | None = None
        # The registry (durable_workers, issue 25): run()/arun() register, heartbeat
        # every heartbeat_interval (one UPDATE, from a thread / task of its own: a
        # worker whose slots are all busy still shows alive) and mark the row stopped.
        if heartbeat_interval is not None and heartbeat_interval <= 0:
            raise ConfigurationError("heartbeat_interval must be > 0", heartbeat_interval=heartbeat_interval)
        self.heartbeat_interval = heartbeat_interval or min(10.0, max(1.0, self.saver.lease_ttl / 3))
        self.register = register
        self.worker_id = uuid.uuid4().hex
        self._in_flight = 0
        self._last_poll: float | None = None

    def _check_targets(self) -> None:
        for t in self.targets:
            if isinstance(t.saver, ReadOnlyView):
                # A graph compiled with saver.reader() (the listing idiom): every claim
                # would fail on the read-only view and the worker retry it for ever
                # (review32b). Refused here, before any poll.
                raise ReadOnlyViewError("RecoveryWorker")
        if len(self.targets) > 1:
            seen: dict[str | None, Any] = {}
            for t in self.targets:
                if t.any_version or t.version is None:
                    raise ConfigurationError(
                        "with several graphs each needs its own version and version_policy "
                        "'refuse' (threads are routed to graphs by version)"
                    )
                if t.version in seen:
                    raise ConfigurationError(
                        f"two graphs have the same version {t.version!r}: bind them to "
                        "distinct versions (saver.bind(graph_version=...))",
                        version=t.version,
                    )
                seen[t.version] = t.graph

    # ----------------------------------------------------------------- routing
    def _target_for(self, version: str | None) -> _Target | None:
        for t in self.targets:
            if version is not None and version in t.versions:
                return t
        for t in self.targets:
            if t.any_version or (version is None and t.adopt):
                return t
        return None

    def _skip_list(self) -> list[str]:
        now = time.monotonic()
        with self._lock:
            for tid in [k for k, until in self._skip.items() if until <= now]:
                del self._skip[tid]
            return list(self._skip)

    def _claim_op(self) -> Callable[[], Op[Claim | None]]:
        owner = _owner(self.name)
        skip = self._skip_list()
        return lambda: _op_claim(
            self.targets,
            owner,
            self.saver.lease_ttl,
            retry_errors=self.retry_errors,
            backoff=self.error_backoff,
            max_backoff=self.max_error_backoff,
            statuses=self.statuses,
            skip=skip,
        )

    def _run_config(self, claim: Claim) -> RunnableConfig:
        configurable = dict(self.config.get("configurable") or {})
        configurable["thread_id"] = claim.thread_id
        return cast(RunnableConfig, {**self.config, "configurable": configurable})

    @_telemetry.instrument("worker_claim")
    def _log_start(self, claim: Claim) -> None:
        logger.info(
            "recovering thread=%s checkpoint=%s attempt=%d previous_status=%s "
            "graph_version=%s worker=%s",
            claim.thread_id, claim.checkpoint_id, claim.attempt, claim.previous_status,
            claim.graph_version, self.name,
        )

    @_telemetry.instrument("worker_result")
    def _result(
        self,
        claim: Claim,
        row: dict[str, Any] | None,
        exc: BaseException | None,
        handed_back: bool,
        started: float,
    ) -> RecoveryResult:
        error = None if exc is None else f"{type(exc).__name__}: {exc}"
        if exc is None:
            outcome = "handed_back" if handed_back else "finished"
        elif isinstance(exc, LeaseLostError):
            outcome = "lease_lost"
        elif isinstance(exc, RunCancelledError):
            outcome = "cancelled"  # an operator's cancel: 'stopped', held until resumed
        elif isinstance(
            exc,
            PoisonCheckpointError | GraphVersionMismatchError | MigrationError | ThreadBusyError | AnswerDecodeError,
        ) or needs_operator(exc):
            # needs_operator: an unknown outcome of an @idempotent call (and kin) waits
            # for `ledger resolve` / `forget`; its runs do not count toward poison, so
            # do not spin on it either.
            outcome = "needs_operator" if needs_operator(exc) else "refused"
            with self._lock:
                self._skip[claim.thread_id] = time.monotonic() + max(60.0, self.poll_interval)
        else:
            outcome = "failed"
        result = RecoveryResult(
            thread_id=claim.thread_id,
            checkpoint_id=claim.checkpoint_id,
            attempt=claim.attempt,
            previous_status=claim.previous_status,
            status=None if row is None else row["status"],
            outcome=outcome,
            error=error,
            seconds=time.monotonic() - started,
            worker=self.name,
        )
        level = logging.INFO if exc is None else logging.WARNING
        logger.log(
            level,
            "recovered thread=%s checkpoint=%s attempt=%d outcome=%s status=%s in %.2fs%s",
            result.thread_id, result.checkpoint_id, result.attempt, result.outcome,
            result.status, result.seconds, f" error={error}" if error else "",
        )
        with self._lock:
            self.stats.add(result)
        if self.on_recovery is not None:
            try:
                self.on_recovery(result)
            except Exception:
                logger.exception("on_recovery hook failed for thread %s", claim.thread_id)
        return result

    # ----------------------------------------------------------------- registry
    def _registration(self) -> dict[str, Any]:
        from langgraph_durable.core.rewrite import graph_name
        from langgraph_durable.ops.control import ANY_VERSION

        versions: set[str] = set()
        names: set[str] = set()
        for t in self.targets:
            versions |= set(t.versions)
            if t.version is not None:
                versions.add(t.version)
            if t.any_version:
                versions.add(ANY_VERSION)
            name = graph_name(t.graph, self.config)
            if name:
                names.add(name)
        identity = process_identity()
        return {
            "worker_id": self.worker_id,
            "name": self.name,
            "host": identity.split(":", 1)[0],
            "pid": os.getpid(),
            "identity": identity,
            # Dead once three heartbeats and a poll are missed.
            "ttl": 3 * self.heartbeat_interval + self.poll_interval,
            "versions": sorted(versions),
            "graph_names": sorted(names),
            "concurrency": self.concurrency,
        }

    def _heartbeat_params(self) -> dict[str, Any]:
        with self._lock:
            claimed = self._in_flight
        last = self._last_poll
        return {
            "worker_id": self.worker_id,
            "claimed": claimed,
            "poll_ago": None if last is None else max(0.0, time.monotonic() - last),
        }

    def _heartbeat_flow(self, mode: _Mode) -> Flow[None]:
        """Register, then one UPDATE per heartbeat interval until stop(); re-registers
        if the row was pruned meanwhile (a worker paused past its ttl)."""
        registration = self._registration()
        try:
            yield Tx(lambda: _op_register(registration))
        except Exception as exc:
            logger.warning("worker %s: could not register in durable_workers: %s", self.name, exc)
        while not self._stop.is_set():
            yield Hook(mode.pause, (self, self.heartbeat_interval))
            if self._stop.is_set():
                break
            params = self._heartbeat_params()
            try:
                found = yield Tx(functools.partial(_op_heartbeat, params))
                if not found:
                    yield Tx(lambda: _op_register(registration))
            except Exception as exc:  # database down: keep beating
                logger.warning("worker %s: heartbeat failed: %s", self.name, exc)

    def _stopped_flow(self) -> Flow[None]:
        worker_id = self.worker_id
        try:
            yield Tx(lambda: _op_worker_stopped(worker_id))
        except Exception as exc:
            logger.warning("worker %s: could not mark itself stopped: %s", self.name, exc)

    # ----------------------------------------------------------------- sync
    def stop(self) -> None:
        """Stop claiming; running threads stop at their next step boundary (or finish,
        with ``shutdown="finish"``). Safe to call from any thread or a signal handler."""
        self._stop.set()
        aio, loop = self._aio_stop, getattr(self, "_aio_loop", None)
        if aio is not None and loop is not None:
            loop.call_soon_threadsafe(aio.set)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def recover_one(self) -> RecoveryResult | None:
        """Claim one recoverable thread and resume it in this thread; ``None`` when
        there is nothing to do."""
        return cast("RecoveryResult | None", self._sync.flows(self).run_flow(self._recover_flow(self._sync)))

    # One body for both kinds of worker: flows whose ops go to the saver and whose
    # Hooks (the graph's stream, the pause between polls) come from a _Mode.
    def _recover_flow(self, mode: _Mode) -> Flow[RecoveryResult | None]:
        self._last_poll = time.monotonic()
        claim = yield Tx(self._claim_op())
        if claim is None:
            return None
        return (yield from self._resume_flow(claim, mode))

    def _resume_flow(self, claim: Claim, mode: _Mode) -> Flow[RecoveryResult]:
        started = time.monotonic()
        with self._lock:
            self._in_flight += 1
        self._log_start(claim)
        target = self._target_for(claim.graph_version)
        exc: BaseException | None = None
        handed_back = False
        try:
            if target is None:  # the claim filtered on versions: only a race gets here
                raise GraphVersionMismatchError(claim.thread_id, claim.graph_version, None)
            handed_back = yield Hook(mode.stream, (self, target, claim))
        except Exception as e:
            exc = e
        finally:
            with self._lock:
                self._in_flight -= 1
        row = None
        try:
            # A queued answer is cleared here once consumed (CLEAR_ANSWER_SQL decides).
            row = yield Tx(lambda: _op_finish(claim, clear_answer=True))
        except Exception:
            logger.exception("could not read back thread %s", claim.thread_id)
        return self._result(claim, row, exc, handed_back, started)

    def _input(self, target: _Target, claim: Claim) -> Any:
        """What the claimed thread runs: ``Command(resume=answer)`` when an operator's
        queued answer is for the checkpoint the thread is still at (a worker killed
        before the answer was consumed left it: running it again upserts the same
        resume write), else ``None`` (the head moved on: the answer was consumed)."""
        if claim.answer is None or claim.answer_checkpoint_id != claim.checkpoint_id:
            return None
        from langgraph.types import Command

        serde = target.saver.serde
        try:
            value = serde.loads_typed(claim.answer)
        except Exception as exc:
            # Before the run: never an attempt, so without a skip every poll of this
            # worker claimed it again, forever (rev25). Left for an operator (the right
            # key, or a new answer); another worker (with the key) may still take it.
            with self._lock:
                self._skip[claim.thread_id] = time.monotonic() + max(60.0, self.poll_interval)
            # A wrong key (or none) for the encrypted answer: the typed refusal naming
            # the thread (issue 27), not pycryptodome's bare "MAC check failed".
            typed = _sealing.decrypt_failure(
                serde, str(claim.answer[0]), exc, thread_id=claim.thread_id,
                where="durable_threads.answer_blob", checkpoint_id=claim.answer_checkpoint_id,
            )
            if typed is None:
                raise AnswerDecodeError(
                    claim.thread_id, claim.answer_checkpoint_id, f"{type(exc).__name__}: {exc}"
                ) from exc
            raise typed from exc
        logger.info("thread %s: running the queued answer to checkpoint %s", claim.thread_id, claim.checkpoint_id)
        return Command(resume=value)

    def _stream(self, target: _Target, claim: Claim) -> bool:
        """Run the claimed thread to its end (or, stopping, to a step boundary): True
        when it was handed back at a step boundary."""
        stream = target.graph.stream(self._input(target, claim), self._run_config(claim), stream_mode="values")
        # Closed explicitly: the run's exit (lease release) happens in close(). The
        # claim reaches the run's lease acquisition through the context, not config.
        with claim_handoff(claim.thread_id, claim.owner, claim.token), contextlib.closing(stream):
            for _ in stream:
                # A "values" chunk is emitted after a superstep's writes are applied
                # and its checkpoint submitted, before the next step's tasks start:
                # closing here ends the run at a step boundary (status 'stopped').
                if self._stop.is_set() and self.shutdown == "step":
                    return True
        return False

    async def _astream(self, target: _Target, claim: Claim) -> bool:
        astream = target.graph.astream(self._input(target, claim), self._run_config(claim), stream_mode="values")
        # An abandoned async generator is only finalized later (by the event loop),
        # after the worker may have closed its pool: close it here, at the boundary.
        try:
            with claim_handoff(claim.thread_id, claim.owner, claim.token):
                async for _ in astream:
                    if self._stop.is_set() and self.shutdown == "step":
                        return True
        finally:
            await astream.aclose()
        return False

    def _slot_flow(self, mode: _Mode, until_idle: bool, max_recoveries: int | None) -> Flow[None]:
        while not self._stop.is_set():
            if max_recoveries is not None and self.stats.claimed >= max_recoveries:
                return
            try:
                result = yield from self._recover_flow(mode)
            except Exception as exc:  # database down: back off, keep the worker alive
                logger.warning("claim failed: %s", exc)
                yield Hook(mode.pause, (self, self.poll_interval))
                continue
            if result is None:
                if until_idle:
                    return
                # Jitter spreads the polls of many idle workers.
                yield Hook(mode.pause, (self, self.poll_interval * random.uniform(0.5, 1.5)))

    def _slot(self, until_idle: bool, max_recoveries: int | None) -> None:
        self._sync.flows(self).run_flow(self._slot_flow(self._sync, until_idle, max_recoveries))

    def run(
        self,
        *,
        until_idle: bool = False,
        max_recoveries: int | None = None,
        install_signal_handlers: bool = True,
    ) -> WorkerStats:
        """Run ``concurrency`` recovery slots on OS threads until :meth:`stop` (SIGTERM
        or SIGINT when called from the main thread), or, with ``until_idle``, until
        nothing is left to claim."""
        restore = self._install_signals() if install_signal_handlers else None
        logger.info(
            "worker %s started: concurrency=%d graphs=%s",
            self.name, self.concurrency, [t.version for t in self.targets],
        )
        beat = None
        if self.register:
            beat = threading.Thread(
                target=lambda: self._sync.flows(self).run_flow(self._heartbeat_flow(self._sync)),
                name="langgraph-durable-worker-heartbeat", daemon=True,
            )
            beat.start()
        try:
            slots = [
                threading.Thread(
                    target=self._slot, args=(until_idle, max_recoveries),
                    name=f"langgraph-durable-recovery-{i}", daemon=True,
                )
                for i in range(self.concurrency)
            ]
            for s in slots:
                s.start()
            for s in slots:
                # join() in slices keeps the main thread responsive to signals.
                while s.is_alive():
                    s.join(0.2)
        finally:
            if beat is not None:
                self._stop.set()
                beat.join(10)
                self._sync.flows(self).run_flow(self._stopped_flow())
            if restore is not None:
                restore()
        logger.info("worker %s stopped: %s", self.name, self.stats)
        return self.stats

    def _install_signals(self) -> Callable[[], None] | None:
        if threading.current_thread() is not threading.main_thread():
            return None
        previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

        def handler(signum: int, frame: Any) -> None:
            if self._stop.is_set():
                logger.warning("second signal %d: exiting now; leases expire on their own", signum)
                os._exit(128 + signum)
            logger.info("signal %d: stop claiming, hand back running threads", signum)
            self.stop()

        for s in previous:
            signal.signal(s, handler)

        def restore() -> None:
            for s, h in previous.items():
                signal.signal(s, h)

        return restore

    # ----------------------------------------------------------------- async
    async def arecover_one(self) -> RecoveryResult | None:
        flow = self._recover_flow(self._async)
        return cast("RecoveryResult | None", await self._async.flows(self).run_flow(flow))

    async def _aslot(self, until_idle: bool, max_recoveries: int | None) -> None:
        assert self._aio_stop is not None
        flow = self._slot_flow(self._async, until_idle, max_recoveries)
        await self._async.flows(self).run_flow(flow)

    async def _apause(self, seconds: float) -> None:
        assert self._aio_stop is not None
        try:
            await asyncio.wait_for(self._aio_stop.wait(), seconds)
        except TimeoutError:
            pass

    async def arun(
        self,
        *,
        until_idle: bool = False,
        max_recoveries: int | None = None,
        install_signal_handlers: bool = True,
    ) -> WorkerStats:
        """The asyncio twin of :meth:`run`: ``concurrency`` tasks on this event loop."""
        loop = asyncio.get_running_loop()
        self._aio_stop = asyncio.Event()
        self._aio_loop = loop
        if self._stop.is_set():
            self._aio_stop.set()
        installed: list[int] = []
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            for s in (signal.SIGTERM, signal.SIGINT):

                def handler(signum: int = s) -> None:
                    if self._stop.is_set():
                        logger.warning("second signal %d: exiting now", signum)
                        os._exit(128 + signum)
                    logger.info("signal %d: stop claiming, hand back running threads", signum)
                    self.stop()

                try:
                    loop.add_signal_handler(s, handler)
                    installed.append(s)
                except (NotImplementedError, RuntimeError):
                    pass
        logger.info("worker %s started (async): concurrency=%d", self.name, self.concurrency)
        beat = None
        if self.register:
            beat = asyncio.create_task(self._async.flows(self).run_flow(self._heartbeat_flow(self._async)))
        try:
            await asyncio.gather(
                *(self._aslot(until_idle, max_recoveries) for _ in range(self.concurrency))
            )
        finally:
            if beat is not None:
                self.stop()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(beat, 10)
                await self._async.flows(self).run_flow(self._stopped_flow())
            for signum in installed:
                loop.remove_signal_handler(signum)
        logger.info("worker %s stopped: %s", self.name, self.stats)
        return self.stats


RecoveryWorker._sync = _Mode(SyncDriver, RecoveryWorker._stream, lambda w, seconds: w._stop.wait(seconds))
RecoveryWorker._async = _Mode(AsyncDriver, RecoveryWorker._astream, RecoveryWorker._apause)


def recover(graph: Any, **options: Any) -> WorkerStats:
    """Resume every thread of ``graph`` that is recoverable now, then return (a one-shot
    sweep, e.g. at application start-up or from a cron job)."""
    concurrency = int(options.pop("concurrency", 1))
    worker = RecoveryWorker(graph, concurrency=concurrency, **options)
    return worker.run(until_idle=True, install_signal_handlers=False)


async def arecover(graph: Any, **options: Any) -> WorkerStats:
    concurrency = int(options.pop("concurrency", 1))
    worker = RecoveryWorker(graph, concurrency=concurrency, **options)
    return await worker.arun(until_idle=True, install_signal_handlers=False)


def _mapping_or_list(graphs: Any) -> list[Any]:
    if isinstance(graphs, Mapping):
        return list(graphs.values())
    return list(graphs) if isinstance(graphs, list | tuple) else [graphs]


__all__ = [
    "Claim",
    "RecoveryResult",
    "RecoveryWorker",
    "WorkerStats",
    "arecover",
    "astatus_counts",
    "asubmit",
    "recover",
    "status_counts",
    "submit",
]
