"""The durable savers: ``DurablePostgresSaver`` (sync) and ``AsyncDurablePostgresSaver``.

Why inheritance from the stock ``BasePostgresSaver`` rather than wrapping a stock
``PostgresSaver``: the features need to run *inside* the stock saver's transactions
(the lease's fencing check in the same transaction as the checkpoint write, artifacts
inserted atomically with the blobs that reference them, artifacts fetched in batch
between the row fetch and deserialization). A wrapper cannot reach in there, and the
stock saver never reconnects a dropped connection. So we reuse what the stock package
does well and is pure -- its SQL text, migrations, ``get_next_version``, delta-channel
walk helpers and prune statements -- and own the I/O: one sans-I/O implementation
(``_io``) with a sync and an async driver. Tables are the stock tables (plus ours), so
a database the stock saver created is adopted as is.

Run lifecycle. LangGraph tells a checkpointer nothing about runs. The saver recognises
the ``get_tuple`` a ``PregelLoop`` makes when a root run starts, and registers a
callback on that loop's exit stack, so it knows when the run ends and how (done,
interrupted, failed, cancelled). That is where the lease is taken and released, the
resume attempt is counted (poison detection) and the graph version is checked. Reads
that are not run starts (``get_state``, Studio, the CLI) never take a lease or raise a
version error.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import math
import os
import secrets
import socket
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from concurrent.futures import wait as futures_wait
from contextlib import AsyncExitStack, ExitStack, asynccontextmanager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import partial
from types import SimpleNamespace
from typing import Any, Literal, cast

import orjson
import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.postgres.base import (
    _DELTA_PAGE_SIZE,
    INSERT_CHECKPOINT_WRITES_SQL,
    PRUNE_STRATEGIES,
    SELECT_PENDING_SENDS_SQL,
    SELECT_SQL,
    UPSERT_CHECKPOINT_BLOBS_SQL,
    UPSERT_CHECKPOINT_WRITES_SQL,
    BasePostgresSaver,
    _build_delta_stage1_sql,
    _build_delta_stage2_sql,
    _DeltaStage2Row,
    _keep_latest,
    _refuse_delta_threads,
)
from langgraph.checkpoint.postgres.base import (
    MIGRATIONS as STOCK_MIGRATIONS,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.types import TASKS, _DeltaSnapshot
from psycopg import AsyncConnection, AsyncPipeline, Capabilities, Connection, Pipeline
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_durable import _sql, _values
from langgraph_durable import telemetry as _telemetry
from langgraph_durable._io import (
    AfterCommit,
    AsyncDriver,
    Batch,
    Flow,
    Hook,
    Op,
    Sleep,
    Stmt,
    SyncDriver,
    Tx,
    op_memo,
)
from langgraph_durable._pool import AsyncDurableConnectionPool, DurableConnectionPool
from langgraph_durable.artifacts import (
    ArtifactCodec,
    ArtifactConfig,
    ArtifactsInFlight,
    KnownRefs,
    WriteSession,
)
from langgraph_durable.compat import (
    classify_saved,
    graph_topology,
    op_load_versions,
    op_record_version,
)
from langgraph_durable.embedded import resolve_dsn
from langgraph_durable.errors import (
    CheckpointLoadError,
    ClockSkewError,
    ConfigurationError,
    DurableError,
    GraphVersionMismatchError,
    LeaseLostError,
    MigrationError,
    PoisonCheckpointError,
    SerializationError,
    ThreadBusyError,
    ThreadExistsError,
    UnencodableValueError,
    UnsupportedConnectionError,
    UnsupportedLangGraphError,
)
from langgraph_durable.granularity import CheckpointPolicy, Deferrals
from langgraph_durable.pooler import (
    Pooler,
    check_pooled_conn,
    flow_pooled_setup,
    op_check_schema,
    prepare_threshold,
    resolve_pooler,
    session_schema,
)
from langgraph_durable.retention import op_recompute_refs
from langgraph_durable.versioning import (
    INSERT_LOG_SQL,
    LOCK_CHECKPOINT_SQL,
    LOCK_THREAD_SQL,
    MIGRATION_ID_KEY,
    POLICY_KEY,
    RUN_GRAPH,
    SET_THREAD_VERSION_SQL,
    VERSION_KEY,
    VERSION_POLICIES,
    WRITE_PATHS_SQL,
    MigrationRegistry,
    MigrationResult,
    UnversionedPolicy,
    VersionPolicy,
    flow_migrate,
    graph_fingerprint,
    pending_orphans,
)

logger = logging.getLogger("langgraph_durable")

# Keys _op_load_rows adds to a checkpoint row for _load_checkpoint_tuple (not columns).
_ROW_LOCAL = "__durable_local"
_ROW_SENDS = "__durable_sends"

# The put/put_writes call running in this context (see artifacts.WriteSession). A
# ContextVar: it follows the op into asyncio.to_thread and into the same task, and ops
# run where no call set it (e.g. a sync call of the async saver) simply do not dedup.
_WRITE_SESSION: ContextVar[WriteSession | None] = ContextVar("langgraph_durable_write", default=None)
# How long a write waits for a concurrent write storing the same artifacts before it
# sends them itself (a safety net: the other write normally ends within its statement).
_INFLIGHT_WAIT = 30.0

OnBusy = Literal["raise", "wait"]
# What a root run start the saver did not recognise does (see _check_unrecognised_run).
OnUnrecognisedRun = Literal["raise", "log"]
PoisonHook = Callable[["PoisonRecord"], Any]

# The configurable keys LangGraph sets on a run's config (see langgraph._internal._constants).
_RUNTIME_KEY = "__pregel_runtime"
_TASK_ID_KEY = "__pregel_task_id"
_INTERRUPT = "__interrupt__"


def _jsonb_dumps(obj: Any) -> str:
    try:
        return orjson.dumps(obj).decode()
    except TypeError:
        return json.dumps(obj)


def _jsonb(obj: Any) -> Jsonb:
    return Jsonb(obj, dumps=_jsonb_dumps)


def _as_is(text: Any) -> Any:
    return text


# put_writes with up to this many writes sends the guard with every row (see
# _op_put_writes): one statement text, one executemany, like the stock saver.
_GUARD_EVERY_ROW = 8


def _jsonb_now(obj: Any) -> Jsonb:
    """JSON dumped now, not when psycopg adapts the parameter: an error then, inside a
    pipeline sent as one implicit transaction, would leave the statements sent before
    it to commit (blobs and artifacts without their checkpoint). Same cost, earlier."""
    return Jsonb(_jsonb_dumps(obj), dumps=_as_is)


def _json_problem(value: Any) -> str | None:
    try:
        _jsonb_dumps(value)
    except Exception as exc:
        return f"{type(value).__name__} is not JSON ({type(exc).__name__}: {exc})"
    return None


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


@dataclass
class Lease:
    """A run's hold on a thread. Puts for the thread are fenced by ``token``."""

    thread_id: str
    owner: str
    token: int
    attempts: int
    checkpoint_id: str | None
    version: str | None
    lost: bool = False
    last_error: str | None = None
    # Set when the run's exit released the lease: a context that still carries this
    # lease (see _RUN_LEASE) then falls back to the registry instead of fencing with it.
    released: bool = False
    # Monotonic time just before the lease was last confirmed by the database (acquire
    # or renewal). Used to re-confirm a lease the renewer may have failed to keep alive
    # (process paused, database unreachable) before a new step starts.
    renewed_at: float = field(default_factory=time.monotonic)
    # Status and graph version of the thread before this run took it, restored when the
    # run never started (version mismatch, failed migration): a waiting thread whose
    # resume was refused stays waiting instead of looking crashed.
    prev_status: str | None = None
    prev_version: str | None = None


# The lease of the root run executing in this context. LangGraph copies the context
# into every task and background put it submits (BackgroundExecutor uses
# copy_context(), asyncio tasks copy theirs), so puts, subgraph puts and
# get_next_version calls of a run see exactly that run's lease. A registry lookup by
# thread_id alone would hand a zombie run of this process the lease a newer run of the
# same process took after the zombie's expired, and its late writes would pass the fence.
_RUN_LEASE: ContextVar[Lease | None] = ContextVar("langgraph_durable_run_lease", default=None)


@dataclass(frozen=True)
class _Handoff:
    thread_id: str
    owner: str
    token: int


# The lease a recovery worker claimed, handed to the run it starts in this context (see
# claim_handoff). A ContextVar, never a configurable key: config is user input, and the
# owner string is public (ThreadBusyError.owner, `threads status`), so a key in config
# would let any caller take over a live lease. The fencing token must match too: a
# hand-off is good for the one acquisition that follows the claim.
_HANDOFF: ContextVar[_Handoff | None] = ContextVar("langgraph_durable_handoff", default=None)


@contextmanager
def claim_handoff(thread_id: str, owner: str, token: int) -> Iterator[None]:
    """Runs started in this block on ``thread_id`` take over the lease ``owner`` holds
    with ``token`` (the recovery worker's claim) instead of finding the thread busy."""
    reset = _HANDOFF.set(_Handoff(str(thread_id), str(owner), int(token)))
    try:
        yield
    finally:
        _HANDOFF.reset(reset)


@dataclass
class _RunContext:
    loop: Any
    graph: Any


class _RenewerSlot:
    """The lease renewer shared by a saver and its clones, and the lock guarding it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.renewer: _Renewer | None = None


class _LeaseRegistry:
    """Leases held by this process, shared by a saver and its ``with_allowlist`` clones."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_thread: dict[str, Lease] = {}
        # id(Runtime) -> (that Runtime, kept alive so its id is not reused, lease): the
        # run each LangGraph Runtime object belongs to (see bind_runtime).
        self.by_runtime: dict[int, tuple[Any, Lease]] = {}

    def get(self, thread_id: str) -> Lease | None:
        with self.lock:
            return self.by_thread.get(thread_id)

    def add(self, lease: Lease) -> None:
        with self.lock:
            self.by_thread[lease.thread_id] = lease

    def remove(self, lease: Lease) -> None:
        with self.lock:
            if self.by_thread.get(lease.thread_id) is lease:
                del self.by_thread[lease.thread_id]
            for key in [k for k, (_, held) in self.by_runtime.items() if held is lease]:
                del self.by_runtime[key]

    def bind_runtime(self, runtime: Any, lease: Lease) -> None:
        """Remember that writes whose config carries ``runtime`` are ``lease``'s run.
        LangGraph submits some writes from a finished task's done-callback, on an
        executor thread whose context is not the run's (so _RUN_LEASE is unset there);
        their config still carries the run's ``__pregel_runtime`` object, made anew for
        every invoke/stream call (and for every subgraph call, bound at its start). An
        object in memory, not a value a caller can put into a config from outside."""
        if runtime is None:
            return
        with self.lock:
            if not lease.released:
                self.by_runtime[id(runtime)] = (runtime, lease)

    def for_runtime(self, runtime: Any, thread_id: str) -> Lease | None:
        if runtime is None:
            return None
        with self.lock:
            entry = self.by_runtime.get(id(runtime))
        if entry is None or entry[0] is not runtime:
            return None
        lease = entry[1]
        return None if lease.released or lease.thread_id != thread_id else lease

    def snapshot(self) -> list[Lease]:
        with self.lock:
            return [lease for lease in self.by_thread.values() if not lease.lost]


def _incarnation(pid: int) -> str | None:
    """Boot time + start time of ``pid``: tells a live process from a reused pid."""
    try:
        import psutil

        return f"{int(psutil.boot_time())}.{int(psutil.Process(pid).create_time() * 100)}"
    except Exception:  # no such process, or no permission to look
        return None


_PROCESS_IDENTITY: str | None = None


def _namespace_identity() -> str:
    """``ns<pid-namespace inode>.<boot id>``: which pid namespace of which kernel boot
    this process's pids belong to. Containers sharing the host's hostname (Docker
    ``--network host``, Kubernetes ``hostNetwork``, ``unshare --pid``) share the kernel's
    boot time but not its pid namespace: pid 42 there is not our pid 42. Unknown parts
    are ``0``, which ``owner_is_dead`` never treats as proof of anything."""
    inode = "0"
    try:
        inode = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        if not sys.platform.startswith("linux"):
            inode = "1"  # no pid namespaces on this platform: there is only one
    boot = "0"
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip().replace("-", "") or "0"
    except OSError:
        try:
            import psutil

            boot = f"b{int(psutil.boot_time())}"
        except Exception:  # no way to tell boots apart
            boot = "0"
    return f"ns{inode}.{boot}"


def process_identity() -> str:
    """``host:pid:incarnation:namespace`` of this process, the prefix of every lease
    owner it uses (see ``owner_is_dead`` for how it is judged)."""
    global _PROCESS_IDENTITY
    pid = os.getpid()
    if _PROCESS_IDENTITY is None or f":{pid}:" not in _PROCESS_IDENTITY:  # refreshed after fork
        _PROCESS_IDENTITY = (
            f"{socket.gethostname()}:{pid}:{_incarnation(pid) or '0'}:{_namespace_identity()}"
        )
    return _PROCESS_IDENTITY


def _owner_id() -> str:
    # Not uuid.uuid4(): tests (LangGraph's own, deterministic_uuids) patch it to number
    # message ids, and one draw per run start here shifted every id they expect.
    return f"{process_identity()}:{secrets.token_hex(6)}"


def owner_is_dead(owner: str | None) -> bool:
    """True only when ``owner`` provably belongs to a process that is gone: same host
    name, same pid namespace of the same kernel boot (so its pid means the same process
    here), and no such pid, or the pid now belongs to a younger process. Anything
    uncertain is False and the lease must expire: another machine, another container
    sharing our hostname, an owner id without a namespace (written by an older version
    of this package), a part we could not read. This lets the common single-machine
    case (a crash, then ``invoke(None)`` in a new process) resume at once instead of
    waiting out ``lease_ttl``; the takeover still bumps the fencing token."""
    if not owner:
        return False
    parts = owner.split(":")
    if len(parts) < 5 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return False
    pid, recorded, namespace = int(parts[1]), parts[2], parts[3]
    mine = process_identity().split(":")
    inode, _, boot_id = namespace[2:].partition(".")
    if namespace != mine[3] or not namespace.startswith("ns") or "0" in (inode, boot_id):
        # Another pid namespace (or kernel boot), or one we could not identify: its
        # pid is not ours to look up.
        return False
    if pid == os.getpid():
        return False
    if recorded == "0" or "." not in recorded:
        return False
    boot = recorded.split(".", 1)[0]
    current = _incarnation(pid)
    if current is None:
        # No such process in our (the same) namespace. Conclusive if this is the same
        # boot of the machine too.
        mine_inc = _incarnation(os.getpid())
        return mine_inc is not None and mine_inc.split(".", 1)[0] == boot
    return current != recorded


# --- checkpoint-id clock (issue 11, clock skew) -----------------------------------------
# LangGraph makes checkpoint ids with uuid6 from this machine's clock and the latest
# checkpoint is the greatest id. A resumer whose clock is behind the head's writer would
# write ids that sort before the head, and a later load would resume from the old head
# and run its steps again. So whenever a checkpoint is loaded, LangGraph's uuid6
# generator (which never goes backwards within a process: _last_v6_timestamp) is moved
# past it: every id this process makes afterwards sorts after everything it has read,
# whatever the skew, with no waiting. durable_checkpoint_order (SQL, in every put) is the
# backstop: a put that would still sort before its head is refused (ClockSkewError).
_UUID_EPOCH_100NS = 0x01B21DD213814000
_ID_CLOCK_LOCK = threading.Lock()


def _uuid6_ticks(checkpoint_id: Any) -> int | None:
    """The 100-ns timestamp of a uuid6 checkpoint id (None for any other id)."""
    try:
        u = uuid.UUID(str(checkpoint_id))
    except (ValueError, TypeError):
        return None
    if u.version != 6:
        return None
    n = u.int
    return (((n >> 80) & 0xFFFFFFFFFFFF) << 12) | ((n >> 64) & 0x0FFF)


def _advance_id_clock(checkpoint_id: Any) -> None:
    """Make LangGraph's next uuid6 ids sort after ``checkpoint_id``."""
    ticks = _uuid6_ticks(checkpoint_id)
    if ticks is None:
        return
    now = time.time_ns() // 100 + _UUID_EPOCH_100NS
    if ticks < now:
        return  # our clock is past it already: the common case, nothing to do
    import importlib

    id_module = importlib.import_module("langgraph.checkpoint.base.id")
    with _ID_CLOCK_LOCK:
        last = getattr(id_module, "_last_v6_timestamp", None)
        if last is None or ticks > last:
            id_module._last_v6_timestamp = ticks  # type: ignore[attr-defined]
            if ticks - now > 10_000_000:
                logger.warning(
                    "checkpoint %s was written by a clock %.3f s ahead of this machine's; "
                    "this process's checkpoint ids now continue after it",
                    checkpoint_id, (ticks - now) / 1e7,
                )


def _find_run_context() -> _RunContext | None:
    """The PregelLoop (and its graph) whose ``__enter__`` is calling us, if any."""
    from langgraph.pregel import Pregel
    from langgraph.pregel._loop import PregelLoop

    frame = sys._getframe(2)
    loop = None
    for _ in range(12):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        if loop is None:
            if frame.f_globals.get("__name__") == "langgraph.pregel._checkpoint":
                # checkpoint_superseded(): __enter__ reading the latest checkpoint after
                # it loaded the one a replay asked for. The run started already; taking
                # a second lease here would make the replay refuse itself (busy).
                return None
            if isinstance(candidate, PregelLoop):
                if frame.f_code.co_name not in ("__enter__", "__aenter__"):
                    return None
                loop = candidate
        elif isinstance(candidate, Pregel):
            return _RunContext(loop, candidate)
        frame = frame.f_back  # type: ignore[assignment]
    return _RunContext(loop, None) if loop is not None else None


def _load_error(where: Mapping[str, Any], what: str, exc: BaseException) -> CheckpointLoadError:
    """The typed error for stored bytes that do not decode (the caller chains ``exc``)."""
    return CheckpointLoadError(
        f"cannot decode {what} of checkpoint {where.get('checkpoint_id')!r} of thread "
        f"{where.get('thread_id')!r}: {type(exc).__name__}: {exc}",
        thread_id=where.get("thread_id", ""),
        checkpoint_ns=where.get("checkpoint_ns", ""),
        checkpoint_id=where.get("checkpoint_id"),
    )


_START = "__start__"


@contextmanager
def _canceled_as_typed(operation: str, config: RunnableConfig | None) -> Iterator[None]:
    """A statement the database canceled (statement_timeout...) as a typed error."""
    try:
        yield
    except psycopg.Error as exc:
        conf = (config or {}).get("configurable", {})
        err = _values.canceled_error(
            exc, operation, conf.get("thread_id"), conf.get("checkpoint_ns", ""), conf.get("checkpoint_id")
        )
        if err is None:
            raise
        raise err from exc


def _threads_config(thread_ids: Any) -> RunnableConfig:
    """What a typed error of a maintenance op on ``thread_ids`` names: the thread when
    there is one, else none (a list, or runs whose threads are not known yet)."""
    ids = [thread_ids] if isinstance(thread_ids, str) else list(thread_ids or [])
    return {"configurable": {"thread_id": str(ids[0]) if len(ids) == 1 else None}}


def _root(channel: str) -> str:
    """How an error names a channel's value: the graph input, or the state."""
    return "input" if channel == _START else f"state[{channel!r}]"


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


class _DurableBase(BasePostgresSaver):
    """Everything but I/O. Subclasses provide ``_run_op``/``_arun_op`` and the flow
    equivalents; every public method below is written once for both."""

    # Checkpoint deferral (granularity.py); None: every checkpoint is written (stock).
    # Set per saver by checkpoint_policy (the class default serves savers built
    # without __init__, e.g. by copy).
    _granularity: Deferrals | None = None

    @property
    def checkpoint_policy(self) -> CheckpointPolicy | None:
        """Which checkpoints may be deferred (see langgraph_durable.granularity)."""
        return "always" if self._granularity is None else self._granularity.policy

    @checkpoint_policy.setter
    def checkpoint_policy(self, policy: CheckpointPolicy | None) -> None:
        # None (the default) honours node metadata ({"checkpoint": "defer"}) only;
        # "always" turns deferral off entirely.
        self._granularity = None if policy == "always" else Deferrals(policy)

    def __init__(
        self,
        *,
        serde: SerializerProtocol | None = None,
        schema: str | None = None,
        graph_version: str | None = None,
        version_policy: VersionPolicy = "refuse",
        unversioned_policy: UnversionedPolicy = "adopt",
        migrations: MigrationRegistry | None = None,
        max_resume_attempts: int = 3,
        on_poison: PoisonHook | None = None,
        lease_ttl: float = 30.0,
        on_busy: OnBusy = "raise",
        busy_timeout: float = 60.0,
        artifact_threshold: int | None = 1024,
        compression_level: int = 3,
        artifact_cache_bytes: int = 64 * 1024 * 1024,
        leases: bool = True,
        takeover_dead_owners: bool = True,
        on_unrecognised_run: OnUnrecognisedRun = "raise",
        pooler: str | None = None,
        run_migrations: bool = True,
        checkpoint_policy: CheckpointPolicy | None = None,
    ) -> None:
        super().__init__(serde=serde)
        self.checkpoint_policy = checkpoint_policy
        self.schema = _sql.validate_schema(schema)
        if version_policy not in VERSION_POLICIES:
            raise ConfigurationError(f"unknown version_policy {version_policy!r}")
        if unversioned_policy not in ("adopt", "refuse"):
            raise ConfigurationError(f"unknown unversioned_policy {unversioned_policy!r}")
        if on_busy not in ("raise", "wait"):
            raise ConfigurationError(f"unknown on_busy {on_busy!r}")
        if on_unrecognised_run not in ("raise", "log"):
            raise ConfigurationError(
                f"unknown on_unrecognised_run {on_unrecognised_run!r} (use 'raise' or 'log')",
                on_unrecognised_run=on_unrecognised_run,
            )
        if max_resume_attempts < 1:
            raise ConfigurationError("max_resume_attempts must be >= 1")
        if lease_ttl <= 0.5:
            raise ConfigurationError("lease_ttl must be above 0.5 s")
        self.graph_version = graph_version
        self.version_policy: VersionPolicy = version_policy
        self.unversioned_policy: UnversionedPolicy = unversioned_policy
        self.migrations = migrations if migrations is not None else MigrationRegistry()
        self.max_resume_attempts = max_resume_attempts
        self.on_poison = on_poison
        self.lease_ttl = float(lease_ttl)
        self.on_busy: OnBusy = on_busy
        self.busy_timeout = busy_timeout
        self.leases_enabled = leases
        # A lease held by a process of this machine that is provably dead is taken over
        # at once (see owner_is_dead); leases of other machines always run to expiry.
        self.takeover_dead_owners = takeover_dead_owners
        # A root run start the saver failed to recognise (LangGraph changed how runs
        # start): "raise" refuses the run with UnsupportedLangGraphError before any node
        # runs; "log" logs an error and lets it run without a lease (unprotected).
        self.on_unrecognised_run: OnUnrecognisedRun = on_unrecognised_run
        # Behind a transaction pooler (pooler.py): no session state across transactions.
        self.pooler: Pooler = resolve_pooler(pooler)
        # False: setup() only verifies the schema version (no DDL; SchemaNotReadyError).
        self.run_migrations = bool(run_migrations)
        self.codec = ArtifactCodec(
            ArtifactConfig(
                threshold=artifact_threshold,
                compression_level=compression_level,
                cache_bytes=artifact_cache_bytes,
            )
        )
        self._known_refs = KnownRefs()
        self._leases = _LeaseRegistry()
        self._unrecognised_logged: set[str] = set()
        # Graph versions whose topology this saver (and its bind() views) stored.
        self._recorded_versions: set[str] = set()
        # One renewer for a saver and all its bind()/with_allowlist clones (they share
        # the slot, as they share the lease registry): closing any of them stops it. A
        # clone with a renewer of its own outlived the saver's close by up to 60 s.
        self._renewer_slot = _RenewerSlot()

    @property
    def _renewer(self) -> _Renewer | None:
        return self._renewer_slot.renewer

    @_renewer.setter
    def _renewer(self, value: _Renewer | None) -> None:
        self._renewer_slot.renewer = value

    @property
    def _renewer_lock(self) -> threading.Lock:
        return self._renewer_slot.lock

    # ------------------------------------------------------------------ drivers
    def _run_op(self, factory: Callable[[], Op[Any]], *, transaction: bool = True) -> Any:
        raise NotImplementedError

    async def _arun_op(self, factory: Callable[[], Op[Any]], *, transaction: bool = True) -> Any:
        raise NotImplementedError

    def _run_flow(self, flow: Flow[Any]) -> Any:
        raise NotImplementedError

    async def _arun_flow(self, flow: Flow[Any]) -> Any:
        raise NotImplementedError

    def _renew_connect(self) -> Connection[Any]:
        raise NotImplementedError

    # ------------------------------------------------------------------ views
    def bind(
        self,
        *,
        graph_version: str | None = None,
        graph: Any = None,
        version_policy: VersionPolicy | None = None,
        migrations: MigrationRegistry | None = None,
    ) -> Any:
        """A view of this saver for one graph: same pool, leases and caches, its own
        version. ``saver.bind(graph=builder)`` stamps ``graph_fingerprint(builder)``;
        one saver serves any number of graphs this way."""
        clone = self._clone()
        if graph is not None:
            clone.graph_version = graph_fingerprint(graph)
        if graph_version is not None:
            clone.graph_version = graph_version
        if version_policy is not None:
            clone.version_policy = version_policy
        if migrations is not None:
            clone.migrations = migrations
        return clone

    def _clone(self) -> Any:
        import copy

        return copy.copy(self)

    def with_allowlist(self, extra_allowlist: Any) -> Any:
        """Clone with a derived msgpack allowlist. There is no inner saver to clone:
        the codec reads ``self.serde`` at call time, so the clone's serde is used."""
        return super().with_allowlist(extra_allowlist)

    # ------------------------------------------------------------------ setup
    def _op_setup(self) -> Op[None]:
        """Stock migrations, then ours, under a session advisory lock (several
        processes may call setup() at once). Runs in autocommit: the stock
        migrations create indexes CONCURRENTLY.

        The lock is polled with pg_try_advisory_lock, never waited for in the server:
        CREATE INDEX CONCURRENTLY waits for every session of the database holding a
        snapshot, and a session blocked in pg_advisory_lock() holds one while it waits
        for the lock holder, which is the one running the CREATE INDEX: a deadlock
        (found with 4 processes calling setup() on a fresh database)."""
        while True:
            rows = yield Batch(
                [Stmt("SELECT pg_try_advisory_lock(%s) AS ok", (_sql.SETUP_LOCK_KEY,), fetch=True)]
            )
            if rows[0][0]["ok"]:
                break
            # Between polls this session holds no snapshot for longer than the sleep.
            yield Batch([Stmt("SELECT pg_sleep(0.05)")])
        try:
            if self.schema:
                yield Batch([Stmt(_sql.create_schema(self.schema)), Stmt(_sql.set_search_path(self.schema))])
            yield Batch([Stmt(STOCK_MIGRATIONS[0])])
            rows = yield Batch(
                [Stmt("SELECT v FROM checkpoint_migrations ORDER BY v DESC LIMIT 1", fetch=True)]
            )
            version = rows[0][0]["v"] if rows[0] else -1
            for v in range(version + 1, len(STOCK_MIGRATIONS)):
                yield Batch([Stmt(STOCK_MIGRATIONS[v])])
                yield Batch([Stmt("INSERT INTO checkpoint_migrations (v) VALUES (%s)", (v,))])
            yield Batch([Stmt(_sql.MIGRATIONS[0])])
            rows = yield Batch(
                [Stmt("SELECT v FROM durable_migrations ORDER BY v DESC LIMIT 1", fetch=True)]
            )
            version = rows[0][0]["v"] if rows[0] else -1
            for v in range(version + 1, len(_sql.MIGRATIONS)):
                yield Batch([Stmt(_sql.MIGRATIONS[v])])
                yield Batch([Stmt("INSERT INTO durable_migrations (v) VALUES (%s)", (v,))])
        except Exception:
            # A failed statement is thrown in here by the driver: release the session
            # lock on this connection before it goes back to the pool. (Not a finally:
            # an op closed with GeneratorExit cannot yield.)
            yield Batch([Stmt("SELECT pg_advisory_unlock(%s)", (_sql.SETUP_LOCK_KEY,))])
            raise
        yield Batch([Stmt("SELECT pg_advisory_unlock(%s)", (_sql.SETUP_LOCK_KEY,))])

    def _flow_setup_or_check(self) -> Flow[None]:
        """setup() without DDL (``run_migrations=False``: verify the versions), or
        behind a transaction pooler (one transaction per attempt; see pooler.py)."""
        if not self.run_migrations:
            yield Tx(lambda: op_check_schema(self, STOCK_MIGRATIONS))
            return
        yield from flow_pooled_setup(self, STOCK_MIGRATIONS)

    # setup() is defined by each saver: a plain method on the sync one, a coroutine on
    # the async one (as the stock savers do: ``await checkpointer.setup()``).

    # ------------------------------------------------------------------ loading
    def _op_resolve(
        self,
        pairs: list[tuple[str, bytes]],
        where: Mapping[str, Any],
        locate: Callable[[bytes], Mapping[str, Any] | None] | None = None,
    ) -> Op[dict[bytes, bytes]]:
        """Fetch every artifact the (type, data) pairs need: batched, one round trip
        per nesting level (chunks, then elements). Returns what was fetched (verified),
        which the decode uses whatever the bounded cache has evicted meanwhile."""
        from langgraph_durable.errors import ArtifactNotFoundError

        local: dict[bytes, bytes] = {}
        while True:
            missing = self.codec.missing(pairs, local)
            if not missing:
                return local
            rows = yield Batch(
                [Stmt(_sql.FETCH_ARTIFACTS_SQL, (sorted(missing),), fetch=True, prepare=False)]
            )
            found = [(r["digest"], r["data"]) for r in rows[0]]
            self.codec.accept(found, serde=self.serde, local=local, locate=locate, **where)
            if len(found) < len(missing):
                got = {bytes(d) for d, _ in found}
                lost = min(missing - got)
                at = dict((locate(lost) if locate else None) or where)
                raise ArtifactNotFoundError(lost.hex(), **at)

    def _decode(
        self, tag: str, data: bytes, where: Mapping[str, Any], local: Mapping[bytes, bytes] | None = None
    ) -> Any:
        try:
            return self.codec.decode(self.serde, tag, data, local=local, **where)
        except DurableError:
            raise
        except Exception as exc:  # damaged bytes: msgpack, zstd, the serializer's own
            raise _load_error(where, f"a {tag!r} value", exc) from exc

    def _op_legacy_sends(self, rows: list[Any]) -> Op[dict[tuple[str, str], list[tuple[str, bytes]]]]:
        """Pending sends of checkpoints older than format v4, by (thread, parent id).

        Before v4, LangGraph kept a step's ``Send`` packets as ``TASKS`` writes of the
        parent checkpoint; the stock saver moves them into the child's ``TASKS`` channel
        when it reads the child (``BasePostgresSaver._migrate_pending_sends``, with the
        stock ``SELECT_PENDING_SENDS_SQL``). Same here, so a database the stock saver
        wrote long ago resumes with its sends. One round trip, only when such rows are
        loaded. Unlike the stock ``list()``, which looks only in the first row's thread,
        each thread's rows are looked up in their own thread."""
        by_thread: dict[str, list[str]] = {}
        for row in rows:
            stored = row["checkpoint"]
            v = stored.get("v") if isinstance(stored, dict) else None
            if isinstance(v, int) and v < 4 and row["parent_checkpoint_id"]:
                by_thread.setdefault(row["thread_id"], []).append(row["parent_checkpoint_id"])
        if not by_thread:
            return {}
        threads = sorted(by_thread)
        found = yield Batch(
            [Stmt(SELECT_PENDING_SENDS_SQL, (t, sorted(set(by_thread[t]))), fetch=True) for t in threads]
        )
        out: dict[tuple[str, str], list[tuple[str, bytes]]] = {}
        for thread_id, result in zip(threads, found, strict=True):
            for r in result:
                sends = [(bytes(t).decode(), bytes(b)) for t, b in r["sends"] or ()]
                if sends:
                    out[(thread_id, r["checkpoint_id"])] = sends
        return out

    def _op_load_rows(self, rows: list[Any]) -> Op[list[CheckpointTuple]]:
        legacy = yield from self._op_legacy_sends(rows)
        pairs: list[tuple[str, bytes]] = [p for sends in legacy.values() for p in sends]
        for row in rows:
            for _, t, v in row["channel_values"] or ():
                pairs.append((t.decode(), v))
            for w in row["pending_writes"] or ():
                pairs.append((w[2].decode(), w[3]))
        local: dict[bytes, bytes] | None = None
        if any(self.codec.is_ref(t) for t, _ in pairs):
            first = rows[0]
            where = {
                "thread_id": first["thread_id"],
                "checkpoint_ns": first["checkpoint_ns"],
                "checkpoint_id": first["checkpoint_id"],
            }
            try:
                local = yield from self._op_resolve(pairs, where, partial(self._locate, rows))
            except (DurableError, psycopg.Error):
                raise
            except Exception as exc:  # an envelope that does not parse
                raise _load_error(self._damaged_row(rows) or where, "an artifact envelope", exc) from exc
        for row in rows:
            row[_ROW_LOCAL] = local
            row[_ROW_SENDS] = legacy.get((row["thread_id"], row["parent_checkpoint_id"]))
        return [self._row_tuple(row) for row in rows]

    def _row_tuple(self, row: Any) -> CheckpointTuple:
        """One row to a tuple. The sync saver goes through the stock saver's name,
        ``_load_checkpoint_tuple`` (LangGraph's own tests patch it on an instance to
        alter the row first); the async one cannot (the stock async hook is a coroutine,
        and ops do not await), so it converts directly."""
        return self._load_tuple(row, row.get(_ROW_LOCAL), row.get(_ROW_SENDS))

    def _damaged_row(self, rows: list[Any]) -> Mapping[str, Any] | None:
        """The first of ``rows`` whose envelopes do not parse (error path only)."""
        for row in rows:
            try:
                self.codec.referenced(self._row_pairs(row))
            except Exception:
                return {k: row[k] for k in ("thread_id", "checkpoint_ns", "checkpoint_id")}
        return None

    def _locate(self, rows: list[Any], digest: bytes) -> Mapping[str, Any] | None:
        """The first of ``rows`` (newest first) whose values need ``digest``: names
        the right checkpoint in an integrity error when ``list`` loads many."""
        for row in rows:
            try:
                found, _ = self.codec.referenced(self._row_pairs(row))
            except Exception:  # a damaged envelope: _damaged_row names that one
                continue
            if digest in found:
                return {k: row[k] for k in ("thread_id", "checkpoint_ns", "checkpoint_id")}
        return None

    @staticmethod
    def _row_pairs(row: Any) -> list[tuple[str, bytes]]:
        pairs = [(t.decode(), v) for _, t, v in row["channel_values"] or ()]
        pairs += [(w[2].decode(), w[3]) for w in row["pending_writes"] or ()]
        return pairs

    def _load_tuple(
        self,
        value: Any,
        local: Mapping[bytes, bytes] | None = None,
        legacy_sends: list[tuple[str, bytes]] | None = None,
    ) -> CheckpointTuple:
        where = {
            "thread_id": value["thread_id"],
            "checkpoint_ns": value["checkpoint_ns"],
            "checkpoint_id": value["checkpoint_id"],
        }
        stored, stored_md = value["checkpoint"], value["metadata"]
        problem = _values.checkpoint_problem(stored, stored_md)
        if problem is not None:
            # LangGraph would fail on this later, inside PregelLoop.__enter__ where no
            # exit handler runs: refuse it here, as a load error (fail closed).
            raise CheckpointLoadError(
                f"checkpoint {value['checkpoint_id']!r} of thread {value['thread_id']!r} is "
                f"malformed: {problem}",
                **where,
            )
        try:
            blobs = {
                k.decode(): self._decode(t.decode(), v, where, local)
                for k, t, v in value["channel_values"] or ()
                if t.decode() != "empty"
            }
            if legacy_sends:
                # _migrate_pending_sends: the parent's sends become this checkpoint's
                # TASKS channel, at the highest version it has (or the first version).
                blobs[TASKS] = [self._decode(t, v, where, local) for t, v in legacy_sends]
            writes = [
                (tid.decode(), ch.decode(), self._decode(t.decode(), v, where, local))
                for tid, ch, t, v, _, _ in sorted(
                    value["pending_writes"] or (),
                    key=lambda w: writes_sort_key(w[4].decode(), w[0].decode(), int(w[5])),
                )
            ]
        except DurableError:
            raise
        except Exception as exc:
            raise _load_error(where, "a blob or pending write", exc) from exc
        checkpoint = cast(
            Checkpoint,
            {
                **value["checkpoint"],
                "channel_values": {**(value["checkpoint"].get("channel_values") or {}), **blobs},
            },
        )
        if legacy_sends:
            versions = dict(stored["channel_versions"])
            versions[TASKS] = (
                max(versions.values())
                if versions
                else BasePostgresSaver.get_next_version(self, None, None)
            )
            checkpoint["channel_versions"] = versions
        _advance_id_clock(value["checkpoint_id"])
        return CheckpointTuple(
            {"configurable": {k: where[k] for k in ("thread_id", "checkpoint_ns", "checkpoint_id")}},
            checkpoint,
            value["metadata"],
            (
                {
                    "configurable": {
                        "thread_id": value["thread_id"],
                        "checkpoint_ns": value["checkpoint_ns"],
                        "checkpoint_id": value["parent_checkpoint_id"],
                    }
                }
                if value["parent_checkpoint_id"]
                else None
            ),
            writes,
        )

    def _op_get_tuple(self, config: RunnableConfig) -> Op[CheckpointTuple | None]:
        thread_id = str(config["configurable"]["thread_id"])
        checkpoint_id = get_checkpoint_id(config)
        checkpoint_ns = config["configurable"].get("checkpoint_ns", "")
        _values.check_ids(thread_id, checkpoint_ns, checkpoint_id)
        if checkpoint_id:
            args: tuple[Any, ...] = (thread_id, checkpoint_ns, checkpoint_id)
            where = "WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s"
        else:
            args = (thread_id, checkpoint_ns)
            where = "WHERE thread_id = %s AND checkpoint_ns = %s ORDER BY checkpoint_id DESC LIMIT 1"
        rows = yield Batch([Stmt(SELECT_SQL + where, args, fetch=True)])
        if not rows[0]:
            return None
        loaded = yield from self._op_load_rows(rows[0])
        return loaded[0]

    def _op_list(
        self,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> Op[list[CheckpointTuple]]:
        if config is not None:
            conf = config.get("configurable", {})
            _values.check_ids(conf.get("thread_id"), conf.get("checkpoint_ns"), conf.get("checkpoint_id"))
        where, args = self._search_where(config, filter, before)
        query = SELECT_SQL + where + " ORDER BY checkpoint_id DESC"
        params = list(args)
        if limit is not None:
            query += " LIMIT %s"
            params.append(int(limit))
        rows = yield Batch([Stmt(query, params, fetch=True)])
        if not rows[0]:
            return []
        return (yield from self._op_load_rows(rows[0]))

    # ------------------------------------------------------------------ writing
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
            sql = _sql.FENCE_RAISING_SQL if raising else _sql.FENCE_SQL
            return Stmt(sql, (thread_id, lease.token, lease.owner), fetch=True), lease
        if raising and self.leases_enabled:
            return Stmt(_sql.FOREIGN_LEASE_RAISING_SQL, (thread_id,), fetch=True), None
        return Stmt(_sql.FOREIGN_LEASE_SQL, (thread_id,), fetch=True), None

    def _guard(
        self, thread_id: str, config: RunnableConfig, checkpoint_ns: str | None, checkpoint_id: str | None
    ) -> tuple[tuple[Any, ...], Lease | None]:
        """durable_put_guard's parameters for a put/put_writes (the fence folded into the
        write's own statement, see _sql.GUARDED_UPSERT_CHECKPOINT_SQL) and the lease it
        checks: the run's lease (same rule as ``_fence``), else the foreign-lease check
        when leases are on, else none. ``checkpoint_id``: the order check (puts)."""
        lease = _RUN_LEASE.get()
        if lease is not None and (lease.released or lease.thread_id != thread_id):
            lease = None
        if lease is None:
            runtime = (config.get("configurable") or {}).get(_RUNTIME_KEY)
            lease = self._leases.for_runtime(runtime, thread_id)
        if lease is not None:
            if lease.lost:
                raise LeaseLostError(thread_id, lease.token)
            return (thread_id, lease.token, lease.owner, False, checkpoint_ns, checkpoint_id), lease
        return (thread_id, None, None, self.leases_enabled, checkpoint_ns, checkpoint_id), None

    @_telemetry.instrument("fence_error")
    def _fence_error(self, thread_id: str, lease: Lease | None, exc: BaseException) -> DurableError | None:
        """The typed error for a raising fence's failure (None: not a fence failure)."""
        state = getattr(exc, "sqlstate", None)
        if state == _sql.FENCE_LOST_STATE and lease is not None:
            lease.lost = True
            return LeaseLostError(thread_id, lease.token)
        if state == _sql.FENCE_BUSY_STATE:
            diag = getattr(exc, "diag", None)
            info = json.loads(getattr(diag, "message_detail", None) or "{}")
            return ThreadBusyError(thread_id, info.get("owner"), info.get("expires_in"))
        return None

    @staticmethod
    def _order_error(
        thread_id: str, checkpoint_ns: str, checkpoint_id: str, exc: BaseException
    ) -> DurableError | None:
        """ClockSkewError for a put refused by durable_checkpoint_order (else None). The
        id clock is moved past the head first, so the caller's retry is ordered."""
        if getattr(exc, "sqlstate", None) != _sql.ORDER_SKEW_STATE:
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

    def _artifact_stmts(self, thread_id: str, artifacts: dict[bytes, bytes]) -> tuple[list[Stmt], list[bytes]]:
        """Statements storing a write's artifacts and reference rows, and the digests to
        remember once committed. The first statement is the thread's shared artifact
        lock: send it before the fence (everything that takes both takes the advisory
        lock first, so they cannot deadlock). Artifacts this process stored for the
        thread recently are not compressed and sent again; their reference rows are
        (one index probe each), so a reference never depends on a cache being right."""
        if not artifacts:
            return [], []
        digests = sorted(artifacts)
        session = _WRITE_SESSION.get()
        if session is not None and session.known is self._known_refs:
            # Inside put/put_writes: own the new pairs while storing them, or wait for
            # the concurrent write storing them (raises before anything is sent).
            new = self._known_refs.reserve(session, thread_id, digests, wait=not session.force)
        else:
            new = sorted(self._known_refs.unknown(thread_id, digests))
        _telemetry.count("artifacts_deduplicated", len(digests) - len(new))
        stmts = [Stmt(_sql.ARTIFACT_LOCK_SHARED_SQL, (_sql.ARTIFACT_LOCK_CLASS, thread_id))]
        if new:
            sealed = [self.codec.seal(artifacts[d], self.serde) for d in new]
            stmts.append(Stmt(_sql.UPSERT_ARTIFACT_SQL, (new, [len(artifacts[d]) for d in new], sealed)))
        stmts.append(Stmt(_sql.INSERT_ARTIFACT_REF_SQL, (thread_id, digests)))
        return stmts, digests

    def _write(self, thread_id: str, factory: Callable[[], Op[Any]]) -> Any:
        """Run a put/put_writes op. A foreign-key violation means an artifact this
        process believed stored was garbage-collected meanwhile (its references were
        dropped by prune/retention/delete elsewhere): forget, and write again with
        the data. Nothing was committed by the failed attempt. Artifacts a concurrent
        write of this process is storing are waited for, not sent twice (WriteSession)."""
        session = WriteSession(self._known_refs)
        token = _WRITE_SESSION.set(session)
        committed = False
        try:
            retried_fk = False
            while True:
                try:
                    result = self._run_op(factory)
                except ArtifactsInFlight as busy:
                    session.finish(False)
                    _, pending = futures_wait(busy.futures, timeout=_INFLIGHT_WAIT)
                    session.force = bool(pending)
                    continue
                except psycopg.errors.ForeignKeyViolation:
                    if retried_fk:
                        raise
                    retried_fk = True
                    session.finish(False)
                    logger.info("thread %s: an artifact was collected meanwhile; writing it again", thread_id)
                    self._known_refs.forget_thread(thread_id)
                    continue
                committed = True
                return result
        finally:
            _WRITE_SESSION.reset(token)
            session.finish(committed)

    async def _awrite(self, thread_id: str, factory: Callable[[], Op[Any]]) -> Any:
        session = WriteSession(self._known_refs)
        token = _WRITE_SESSION.set(session)
        committed = False
        try:
            retried_fk = False
            while True:
                try:
                    result = await self._arun_op(factory)
                except ArtifactsInFlight as busy:
                    session.finish(False)
                    waits = [asyncio.wrap_future(f) for f in busy.futures]
                    _, pending = await asyncio.wait(waits, timeout=_INFLIGHT_WAIT)
                    session.force = bool(pending)
                    continue
                except psycopg.errors.ForeignKeyViolation:
                    if retried_fk:
                        raise
                    retried_fk = True
                    session.finish(False)
                    logger.info("thread %s: an artifact was collected meanwhile; writing it again", thread_id)
                    self._known_refs.forget_thread(thread_id)
                    continue
                committed = True
                return result
        finally:
            _WRITE_SESSION.reset(token)
            session.finish(committed)

    def _inline(self, value: Any) -> bool:
        if isinstance(value, float):
            # Only floats JSONB gives back as the same float: nan/inf become null, -0.0
            # becomes 0, and from 1e16 on orjson writes an exponent that numeric prints
            # back as an integer. Those go to a blob (msgpack keeps them exactly).
            negative_zero = value == 0.0 and math.copysign(1.0, value) < 0
            return math.isfinite(value) and abs(value) < 1e15 and not negative_zero
        if value is None or isinstance(value, bool | int):
            return not isinstance(value, int) or isinstance(value, bool) or abs(value) < 2**63
        if isinstance(value, str):
            threshold = self.codec.config.threshold
            return "\x00" not in value and (threshold is None or len(value) < max(threshold, 1))
        return False

    def _stamp(self, config: RunnableConfig, metadata: CheckpointMetadata, lease: Lease | None) -> dict[str, Any]:
        md: dict[str, Any] = dict(get_serializable_checkpoint_metadata(config, metadata))
        if VERSION_KEY not in md:
            version = (lease.version if lease else None) or self.graph_version
            if version:
                md[VERSION_KEY] = version
        return md

    def _encode(self, value: Any, where: Mapping[str, Any], root: str) -> Any:
        """``codec.encode``; on failure, the typed error naming where the value is."""
        try:
            return self.codec.encode(self.serde, value)
        except SerializationError as exc:
            inner = value.value if isinstance(value, _DeltaSnapshot) else value
            found = _values.find_unencodable(inner, _values.serializer_reject(self.serde), root)
            path, culprit, reason = found or (root, inner, str(exc))
            raise UnencodableValueError(
                **where, path=path, value_type=type(culprit).__name__, reason=reason
            ) from exc

    def _check_texts(self, value: Any, where: Mapping[str, Any], root: str) -> None:
        """Refuse a state string with a lone surrogate before anything is sent.
        Inline, PostgreSQL's JSON refuses it (after the node ran); in a blob, LangGraph's
        serializer stores '?' instead (OPT_REPLACE_SURROGATES), so the run would go on
        with a string that differs from the stored one. Checked: a channel's own string
        value, and the graph input's (``{"channel": "text"}``); isascii() answers at
        C speed for nearly every string. Strings nested deeper are the serializer's."""
        texts: Any = ()
        if isinstance(value, str):
            texts = ((root, value),)
        elif root == "input" and isinstance(value, dict):
            texts = ((f"input[{k!r}]", v) for k, v in value.items() if isinstance(v, str))
        for path, text in texts:
            if not text.isascii():
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError as exc:
                    raise UnencodableValueError(
                        **where, path=path, value_type="str",
                        reason=cast(str, _values.surrogate_problem(text)),
                    ) from exc

    def _write_error(
        self, exc: BaseException, operation: str, where: Mapping[str, Any], parts: Mapping[str, Any]
    ) -> DurableError | None:
        """The typed error for a write the database refused (nothing was committed:
        the write is one transaction), or None for errors handled elsewhere."""
        canceled = _values.canceled_error(exc, operation, **where)
        if canceled is not None:
            return cast(DurableError, canceled)
        if not isinstance(exc, psycopg.DataError):
            return None
        # Text PostgreSQL refuses (a NUL or a lone surrogate in metadata or an inline
        # value): find it, on this error path only.
        found = None
        for root, value in parts.items():
            found = found or _values.locate(value, _values.text_reject, root)
        path, culprit, reason = found or (operation, None, str(exc).splitlines()[0])
        return UnencodableValueError(**where, path=path, value_type=type(culprit).__name__, reason=reason)

    def _op_put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> Op[RunnableConfig]:
        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        checkpoint_ns = configurable.get("checkpoint_ns", "")
        parent_id = configurable.get("checkpoint_id")
        _values.check_ids(thread_id, checkpoint_ns, parent_id)
        where = {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint["id"]}
        copy = checkpoint.copy()
        copy["channel_values"] = dict(copy["channel_values"])
        blob_values: dict[str, Any] = {}
        for k, v in checkpoint["channel_values"].items():
            if isinstance(v, _DeltaSnapshot):
                blob_values[k] = copy["channel_values"].pop(k)
                copy["channel_values"][k] = True
            elif not self._inline(v):
                blob_values[k] = copy["channel_values"].pop(k)
            self._check_texts(v, where, _root(k))
        artifacts: dict[bytes, bytes] = {}
        blob_rows = []
        for k, ver in new_versions.items():
            if k in blob_values:
                enc = self._encode(blob_values[k], where, _root(k))
                artifacts.update(enc.artifacts)
                blob_rows.append((thread_id, checkpoint_ns, k, cast(str, ver), enc.type, enc.data))
        guard, lease = self._guard(thread_id, config, checkpoint_ns, checkpoint["id"])
        md = self._stamp(config, metadata, lease)
        try:
            cp_json, md_json = _jsonb_now(copy), _jsonb_now(md)
        except Exception as exc:  # metadata a caller put in config["metadata"]
            found = _values.find_unencodable(md, _json_problem, "metadata")
            path, culprit, reason = found or ("checkpoint", copy, f"{type(exc).__name__}: {exc}")
            raise UnencodableValueError(
                **where, path=path, value_type=type(culprit).__name__, reason=reason
            ) from exc
        _telemetry.checkpoint_bytes(cp_json, blob_rows)
        art_stmts, new_refs = self._artifact_stmts(thread_id, artifacts)
        stmts = list(art_stmts)
        if blob_rows:
            stmts.append(Stmt(UPSERT_CHECKPOINT_BLOBS_SQL, blob_rows, many=True))
        # The checkpoint row carries the guard (issue 14): fence (or foreign-lease check)
        # and order check (never behind the head: clock skew, durable_checkpoint_order)
        # in the upsert itself, so a put sends the stock saver's statements. The order
        # check stays with leases=False too: a writer with a slow clock would otherwise
        # make the next load resume from an older head and run its steps again.
        row: tuple[Any, ...] = (thread_id, checkpoint_ns, checkpoint["id"], parent_id, cp_json, md_json)
        if VERSION_KEY not in md and parent_id:
            # No version known (a write outside a run, e.g. update_state from a script):
            # inherit the parent's, so editing a thread never makes it "unversioned".
            sql = _sql.GUARDED_UPSERT_CHECKPOINT_INHERIT_SQL
            row = (*row, thread_id, checkpoint_ns, parent_id)
        else:
            sql = _sql.GUARDED_UPSERT_CHECKPOINT_SQL
        stmts.append(Stmt(sql, (*row, *guard)))
        try:
            # The only batch: one pipeline, no BEGIN/COMMIT (_io._implicit).
            yield Batch(stmts, final=True)
        except psycopg.Error as exc:
            err = self._fence_error(thread_id, lease, exc)
            if err is not None:
                raise err from None
            err = self._order_error(thread_id, checkpoint_ns, checkpoint["id"], exc) or self._write_error(
                exc, "put", where, {"state": copy["channel_values"], "metadata": md}
            )
            if err is None:
                raise
            raise err from exc
        if new_refs:
            yield AfterCommit(lambda: self._known_refs.add(thread_id, new_refs))
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": checkpoint_ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    def _op_put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> Op[None]:
        if not writes:
            return
        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        checkpoint_ns = configurable.get("checkpoint_ns", "")
        checkpoint_id = configurable["checkpoint_id"]
        _values.check_ids(thread_id, checkpoint_ns, checkpoint_id)
        where = {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id}
        query = (
            UPSERT_CHECKPOINT_WRITES_SQL
            if all(w[0] in WRITES_IDX_MAP for w in writes)
            else INSERT_CHECKPOINT_WRITES_SQL
        )
        artifacts: dict[bytes, bytes] = {}
        rows = []
        for idx, (channel, value) in enumerate(writes):
            root = "input" if channel == _START else f"writes[{channel!r}]"
            self._check_texts(value, where, root)
            enc = self._encode(value, where, root)
            artifacts.update(enc.artifacts)
            rows.append(
                (
                    thread_id,
                    checkpoint_ns,
                    checkpoint_id,
                    task_id,
                    task_path,
                    WRITES_IDX_MAP.get(channel, idx),
                    channel,
                    enc.type,
                    enc.data,
                )
            )
        guard, lease = self._guard(thread_id, config, None, None)
        art_stmts, new_refs = self._artifact_stmts(thread_id, artifacts)
        stmts = list(art_stmts)
        if lease is not None or self.leases_enabled:
            # The rows carry the guard (issue 14, see _sql.GUARDED_UPSERT_WRITE_SQL): it
            # runs before the first write row is inserted or locked. A step's few writes
            # all carry it (one executemany, as stock; re-checking a row this transaction
            # already locked is cheap); a large fan-out only its first row. leases=False:
            # no guard, the stock saver's statements exactly.
            guarded = (
                _sql.GUARDED_UPSERT_WRITE_SQL
                if query is UPSERT_CHECKPOINT_WRITES_SQL
                else _sql.GUARDED_INSERT_WRITE_SQL
            )
            n = len(rows) if len(rows) <= _GUARD_EVERY_ROW else 1
            stmts.append(Stmt(guarded, [(*r, *guard) for r in rows[:n]], many=True))
            rows = rows[n:]
        if rows:
            stmts.append(Stmt(query, rows, many=True))
        try:
            yield Batch(stmts, final=True)
        except psycopg.Error as exc:
            err = self._fence_error(thread_id, lease, exc)
            if err is not None:
                raise err from None
            err = self._write_error(exc, "put_writes", where, {"writes": {w[0]: w[1] for w in writes}})
            if err is None:
                raise
            raise err from exc
        if new_refs:
            yield AfterCommit(lambda: self._known_refs.add(thread_id, new_refs))

    def _op_delete_thread(self, thread_id: str) -> Op[None]:
        tid = str(thread_id)
        stmts = [
            # Exclusive artifact lock: a put adding references to this thread waits, so
            # its reference rows are never deleted under it (see _artifact_stmts).
            Stmt(_sql.ARTIFACT_LOCK_SQL, (_sql.ARTIFACT_LOCK_CLASS, tid)),
            # Then the thread row: a leased put in flight commits first (see the SQL).
            *[Stmt(s, ([tid],)) for s in _sql.LOCK_THREADS_FOR_DELETE_SQL],
            *[Stmt(s, ([tid],)) for s in _sql.DELETE_STOCK_THREADS_SQL],
            *[Stmt(s, (tid,)) for s in _sql.DELETE_THREAD_EXTRA_SQL],
        ]
        yield Batch(stmts)
        yield AfterCommit(lambda: self._known_refs.forget_thread(tid))

    def _forget_threads(self, thread_ids: Sequence[str]) -> None:
        for t in thread_ids:
            self._known_refs.forget_thread(t)

    def _op_delete_for_runs(self, runs: list[str]) -> Op[list[str]]:
        """Delete the runs' checkpoints and writes, the blob rows of their threads that
        no remaining checkpoint uses, and recompute the threads' artifact references;
        a thread left without checkpoints is deleted whole (every table of
        _sql.THREAD_TABLES). One transaction, so a retry after a lost COMMIT reply
        finds nothing left to do. Returns the threads touched.

        A thread a live run holds is refused (``ThreadBusyError``, nothing deleted
        anywhere), not fenced like ``delete_thread`` fences it: delete_thread removes
        the thread, so nothing will resume the fenced run's half-done node, while here
        the thread lives on and its next run would execute that node again (its
        effects twice); and deleting under a live run dropped blob versions the run
        still points to (issue 11, defect 1). LangGraph's rollback calls this after
        the cancelled run has exited, when the lease is free."""
        found = yield Batch([Stmt(_sql.RUN_THREADS_SQL, {"runs": runs}, fetch=True)])
        threads = [r["thread_id"] for r in found[0]]
        created: set[str] = set()
        locked: list[str] = []
        while threads:
            params = {"runs": runs, "threads": threads}
            rows = yield Batch(
                [Stmt(_sql.ARTIFACT_LOCK_SQL, (_sql.ARTIFACT_LOCK_CLASS, t)) for t in threads]
                + [Stmt(_sql.ENSURE_THREAD_ROWS_SQL, params, fetch=True)]
                + [Stmt(_sql.LOCK_THREAD_ROWS_SQL, params, fetch=True)]
            )
            created |= {r["thread_id"] for r in rows[-2]}
            for r in rows[-1]:
                if r["leased"]:
                    raise ThreadBusyError(r["thread_id"], r["lease_owner"], r["expires_in"])
            locked = sorted({*locked, *threads})
            # A run that checkpointed in another thread meanwhile: lock and check it too.
            again = yield Batch([Stmt(_sql.RUN_THREADS_SQL, {"runs": runs}, fetch=True)])
            threads = sorted({r["thread_id"] for r in again[0]} - set(locked))
        if not locked:
            return []
        params = {"runs": runs, "threads": locked}
        yield Batch(
            [Stmt(s, params, fetch="RETURNING" in s) for s in _sql.DELETE_FOR_RUNS_SQL]
            + [Stmt(_sql.DELETE_UNUSED_BLOBS_SQL, params)]
        )
        rows = yield Batch([Stmt(_sql.EMPTY_THREADS_SQL, params, fetch=True)])
        empty = [r["thread_id"] for r in rows[0]]
        if empty:
            yield Batch(
                [Stmt(s, (empty,)) for s in _sql.DELETE_STOCK_THREADS_SQL]
                + [Stmt(s, (empty,)) for s in _sql.DELETE_THREADS_EXTRA_SQL]
            )
            yield AfterCommit(partial(self._forget_threads, empty))
        kept_created = sorted(created - set(empty))
        if kept_created:  # rows made above only to lock: no row stays "no row"
            yield Batch([Stmt("DELETE FROM durable_threads WHERE thread_id = ANY(%s)", (kept_created,))])
        # The threads' reference rows still name what the deleted checkpoints used:
        # recompute them (same transaction, under the exclusive locks taken above) so
        # gc() can free those artifacts.
        for tid in locked:
            if tid not in empty:
                try:
                    yield from op_recompute_refs(self, tid)
                except DurableError as exc:  # a damaged artifact, found in Python
                    # The rows stay a superset (GC frees less, never too much): the
                    # delete the caller asked for still happens.
                    logger.warning("thread %s: references not recomputed: %s", tid, exc)
        return locked

    def _flow_delete_for_runs(self, run_ids: Sequence[str]) -> Flow[None]:
        runs = [str(r) for r in run_ids]
        if not runs:
            return
        deadline = time.monotonic() + self.busy_timeout
        while True:
            try:
                yield Tx(partial(self._op_delete_for_runs, runs))
                return
            except ThreadBusyError:
                if self.on_busy == "wait" and time.monotonic() < deadline:
                    yield Sleep(0.25)
                    continue
                raise

    def _op_copy_thread(self, source: str, target: str) -> Op[None]:
        params = {"source": str(source), "target": str(target)}
        _values.check_ids(params["source"])
        _values.check_ids(params["target"])
        # Copying into a thread with checkpoints would interleave two histories by
        # checkpoint id (ON CONFLICT DO NOTHING keeps the target's rows): refuse. The
        # target's exclusive artifact lock makes a put with artifacts into it wait.
        memo = op_memo()
        try:
            rows = yield Batch(
                [
                    Stmt(_sql.ARTIFACT_LOCK_SQL, (_sql.ARTIFACT_LOCK_CLASS, params["target"])),
                    Stmt(
                        "SELECT EXISTS (SELECT 1 FROM checkpoints WHERE thread_id = %s) AS taken",
                        (params["target"],),
                        fetch=True,
                    ),
                ]
            )
            if rows[1][0]["taken"]:
                if memo.get("copy_sent") and (yield from self._op_copied(params)):
                    return  # a retry after a lost COMMIT reply: the first attempt copied
                raise ThreadExistsError(params["source"], params["target"])
            memo["copy_sent"] = True
            yield Batch([Stmt(s, params) for s in _sql.COPY_THREAD_SQL])
        except psycopg.Error as exc:
            err = _values.canceled_error(exc, "copy_thread", params["target"])
            if err is None:
                raise
            raise err from exc

    @staticmethod
    def _op_copied(params: Mapping[str, str]) -> Op[bool]:
        """Whether the target holds exactly the source's newest checkpoint: the copy a
        retried ``copy_thread`` sent before its COMMIT reply was lost committed."""
        rows = yield Batch(
            [
                Stmt(
                    "SELECT (SELECT max(checkpoint_id) FROM checkpoints WHERE thread_id = %(source)s)"
                    " IS NOT DISTINCT FROM "
                    "(SELECT max(checkpoint_id) FROM checkpoints WHERE thread_id = %(target)s) AS same",
                    params,
                    fetch=True,
                )
            ]
        )
        return bool(rows[0][0]["same"])

    def _op_stock(self, statements: Any) -> Op[None]:
        """Run one of the stock saver's prune statement generators."""
        try:
            sql, params, fetch = next(statements)
            while True:
                rows = yield Batch([Stmt(sql, params, fetch=fetch, prepare=False)])
                sql, params, fetch = statements.send(rows[0] if fetch else [])
        except StopIteration:
            return

    def _flow_prune(self, thread_ids: Sequence[str], strategy: str) -> Flow[None]:
        if isinstance(thread_ids, str):
            raise TypeError("thread_ids must be a sequence of thread IDs, not a str")
        if strategy not in PRUNE_STRATEGIES:
            raise ValueError(f"Unknown prune strategy: {strategy!r}")
        ids = [str(t) for t in thread_ids]
        if not ids:
            return
        if strategy == "delete":

            def delete_all() -> Op[None]:
                yield Batch(
                    [Stmt(_sql.ARTIFACT_LOCK_SQL, (_sql.ARTIFACT_LOCK_CLASS, t)) for t in sorted(set(ids))]
                    + [Stmt(s, (ids,)) for s in _sql.LOCK_THREADS_FOR_DELETE_SQL]
                    + [Stmt(s, (ids,)) for s in _sql.DELETE_STOCK_THREADS_SQL]
                    # Everything delete_thread removes, so no lease, quarantine record
                    # or migration backup outlives the thread it describes.
                    + [Stmt(s, (ids,)) for s in _sql.DELETE_THREADS_EXTRA_SQL]
                )
                yield AfterCommit(partial(self._forget_threads, ids))

            yield Tx(delete_all)
            return
        yield Tx(lambda: self._op_stock(_refuse_delta_threads(ids)))
        for tid in ids:
            yield Tx(partial(self._op_stock, _keep_latest(tid)))
            # The thread's reference rows still name what the pruned checkpoints used:
            # recompute them from what is left, so gc() can free those artifacts.
            yield Tx(partial(op_recompute_refs, self, tid))

    def _op_delta_history(
        self, config: RunnableConfig, channels: Sequence[str]
    ) -> Op[Mapping[str, DeltaChannelHistory]]:
        """The stock two-stage walk (its SQL and pure helpers), with artifact
        resolution between the fetch and the decode."""
        if not channels:
            return {}
        channels = list(channels)
        thread_id = str(config["configurable"]["thread_id"])
        checkpoint_ns = config["configurable"].get("checkpoint_ns", "")
        checkpoint_id = get_checkpoint_id(config)
        if not checkpoint_id:
            target = yield from self._op_get_tuple(config)
            if target is None:
                return {ch: {"writes": []} for ch in channels}
            checkpoint_id = target.config["configurable"]["checkpoint_id"]
        stage1_sql = _build_delta_stage1_sql(channels, paged=True, include_cursor=True)
        parent_of: dict[str, str | None] = {}
        ver: list[dict[str, str | None]] = [{} for _ in channels]
        hb: list[dict[str, bool]] = [{} for _ in channels]
        inline: list[dict[str, Any]] = [{} for _ in channels]
        chain_by_ch: dict[str, list[str]] = {ch: [] for ch in channels}
        seed_ver: dict[str, str | None] = {ch: None for ch in channels}
        seed_inline: dict[str, Any] = {}
        cursors: dict[str, str | None] = {}
        seeded: set[str] = set()
        cursor: str | None = checkpoint_id
        while True:
            params: list[Any] = []
            for ch in channels:
                params.extend([ch, ch, ch, ch])
            params.extend([thread_id, checkpoint_ns, cursor, _DELTA_PAGE_SIZE])
            rows = yield Batch([Stmt(stage1_sql, params, fetch=True)])
            page = rows[0]
            if not page:
                break
            oldest = self._ingest_stage1_page(page, channels, parent_of, ver, hb, inline)
            self._try_advance_walks(
                checkpoint_id, channels, parent_of, ver, hb, inline, chain_by_ch,
                seed_ver, seed_inline, cursors, seeded,
            )
            if len(seeded) == len(channels) or len(page) < _DELTA_PAGE_SIZE:
                break
            cursor = oldest
            stage1_sql = _build_delta_stage1_sql(channels, paged=True)
        with_chain = [ch for ch in channels if chain_by_ch[ch]]
        with_seed = [ch for ch in channels if seed_ver[ch] is not None]
        stage2_sql = _build_delta_stage2_sql(channels_with_chain=with_chain, channels_with_seed=with_seed)
        stage2: list[Any] = []
        if stage2_sql:
            params = []
            for ch in with_chain:
                params.extend([thread_id, checkpoint_ns, ch, chain_by_ch[ch]])
            for ch in with_seed:
                params.extend([thread_id, checkpoint_ns, ch, seed_ver[ch]])
            rows = yield Batch([Stmt(stage2_sql, params, fetch=True)])
            stage2 = rows[0]
        where = {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id}
        pairs = [(r["type"], r["blob"]) for r in stage2 if r["type"] and r["blob"] is not None]
        local: dict[bytes, bytes] | None = None
        if any(self.codec.is_ref(t) for t, _ in pairs):
            try:
                local = yield from self._op_resolve(pairs, where)
            except (DurableError, psycopg.Error):
                raise
            except Exception as exc:  # an envelope that does not parse
                raise _load_error(where, "an artifact envelope", exc) from exc
        # The stock helper only reads ``self.serde``: give it one that resolves refs.
        shim = SimpleNamespace(serde=_ResolvingSerde(self, where, local))
        return BasePostgresSaver._build_delta_channels_writes_history(
            cast(Any, shim),
            channels=channels,
            chain_by_ch=chain_by_ch,
            seed_ver_by_ch=seed_ver,
            seed_inline_by_ch=seed_inline,
            stage2_rows=cast("list[_DeltaStage2Row]", stage2),
        )

    # ------------------------------------------------------------------ run lifecycle
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

    def _acquire_params(
        self, thread_id: str, owner: str, version: str | None, checkpoint_id: str | None,
        handoff: _Handoff | None,
    ) -> dict[str, Any]:
        mine = handoff if handoff is not None and handoff.thread_id == thread_id else None
        return {
            "thread_id": thread_id,
            "owner": owner,
            "version": version,
            "ttl": self.lease_ttl,
            "checkpoint_id": checkpoint_id,
            "dead_owner": None,
            "claim_owner": mine.owner if mine else None,
            "claim_token": mine.token if mine else None,
        }

    @_telemetry.instrument("lease_acquire")
    def _op_acquire(
        self,
        thread_id: str,
        owner: str,
        version: str | None,
        checkpoint_id: str | None,
        handoff: _Handoff | None = None,
    ) -> Op[dict[str, Any]]:
        """Take the lease: one autocommit statement, one round trip (ACQUIRE_SQL looks up
        the latest checkpoint itself). Safe to run again after a lost COMMIT reply (the
        driver retries): ACQUIRE_SQL recognises its own owner and then counts no attempt
        and bumps no token, and reports the thread as it was before the first execution
        (lease_prev_*). Not taken: the contended path, ``_op_acquire_contended``."""
        params = self._acquire_params(thread_id, owner, version, checkpoint_id, handoff)
        rows = yield Batch([Stmt(_sql.ACQUIRE_SQL, params, fetch=True)], final=True)
        if rows[0]:
            return self._acquired(rows[0][0], rows[0][0]["checkpoint_id"])
        return {"ok": False, "checkpoint_id": checkpoint_id, "contended": True}

    @_telemetry.instrument("lease_acquire")
    def _op_acquire_contended(
        self,
        thread_id: str,
        owner: str,
        version: str | None,
        checkpoint_id: str | None,
        handoff: _Handoff | None = None,
    ) -> Op[dict[str, Any]]:
        """The lease is held (or the thread quarantined): who holds it, and a takeover
        when the holder is a provably dead process of this machine."""
        params = self._acquire_params(thread_id, owner, version, checkpoint_id, handoff)
        rows = yield Batch([Stmt(_sql.THREAD_ROW_SQL, (thread_id,), fetch=True)])
        row = rows[0][0] if rows[0] else {}
        holder = row.get("lease_owner")
        if row.get("status") == "quarantined" or not (
            self.takeover_dead_owners and owner_is_dead(holder)
        ):
            return {"ok": False, "checkpoint_id": checkpoint_id, **row}
        logger.warning(
            "thread %s: lease holder %s is a dead process of this machine and pid namespace; "
            "taking over", thread_id, holder,
        )
        params["dead_owner"] = holder
        _telemetry.count("leases_taken_over", reason="dead_owner")
        rows = yield Batch([Stmt(_sql.ACQUIRE_SQL, params, fetch=True)])
        if not rows[0]:
            rows = yield Batch([Stmt(_sql.THREAD_ROW_SQL, (thread_id,), fetch=True)])
            row = rows[0][0] if rows[0] else {}
            return {"ok": False, "checkpoint_id": checkpoint_id, **row}
        return self._acquired(rows[0][0], rows[0][0]["checkpoint_id"])

    @staticmethod
    def _acquired(row: Mapping[str, Any], checkpoint_id: str | None) -> dict[str, Any]:
        res = {"ok": True, "checkpoint_id": checkpoint_id, **row}
        memo = op_memo()
        if res.get("retried") and "prev" in memo:
            res["prev_status"], res["prev_version"] = memo["prev"]
        else:
            memo["prev"] = (res.get("prev_status"), res.get("prev_version"))
        return res

    def _op_quarantine_row(self, thread_id: str) -> Op[dict[str, Any] | None]:
        rows = yield Batch(
            [Stmt("SELECT * FROM durable_quarantine WHERE thread_id = %s", (thread_id,), fetch=True)]
        )
        return rows[0][0] if rows[0] else None

    def _op_quarantine(self, record: PoisonRecord) -> Op[None]:
        yield Batch([Stmt(_sql.QUARANTINE_SQL, record.__dict__)])

    def _op_release(
        self,
        lease: Lease,
        status: str,
        *,
        reset: bool,
        undo: bool,
        error: str | None,
        checkpoint_id: str | None = None,
        first: Sequence[Stmt] = (),
    ) -> Op[None]:
        # One autocommit pipeline (no BEGIN/COMMIT): one round trip at run end. RELEASE
        # matches owner and token, so a retry after a lost reply changes nothing.
        yield Batch(
            [
                *first,
                Stmt(
                    _sql.RELEASE_SQL,
                    {
                        "status": status,
                        "reset": reset,
                        "undo": undo,
                        "error": error,
                        "checkpoint_id": checkpoint_id,
                        "thread_id": lease.thread_id,
                        "token": lease.token,
                        "owner": lease.owner,
                    },
                )
            ],
            final=True,
        )

    def _op_abandon(self, lease: Lease) -> Op[None]:
        yield Batch(
            [
                Stmt(
                    _sql.ABANDON_SQL,
                    {
                        "status": lease.prev_status or "stopped",
                        "version": lease.prev_version,
                        "thread_id": lease.thread_id,
                        "token": lease.token,
                        "owner": lease.owner,
                    },
                )
            ]
        )

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
        yield Hook(self._fire_on_poison, (record,))
        raise PoisonCheckpointError(
            record.thread_id, record.checkpoint_id, record.attempts, record.last_error,
            reason=record.reason,
        ) from cause

    @_telemetry.instrument("run_start")
    def _flow_run_start(
        self, config: RunnableConfig, ctx: _RunContext, handoff: _Handoff | None = None
    ) -> Flow[tuple[CheckpointTuple | None, Lease]]:
        thread_id = str(config["configurable"]["thread_id"])
        requested = get_checkpoint_id(config)
        _values.check_ids(thread_id, config["configurable"].get("checkpoint_ns", ""), requested)
        version = self._current_version(config, ctx)
        policy = config["configurable"].get(POLICY_KEY, self.version_policy)
        # A recovery worker may hold the lease (handoff, from claim_handoff in the caller's
        # context): ACQUIRE_SQL takes it over from that owner and token without a gap.
        owner = _owner_id()
        deadline = time.monotonic() + self.busy_timeout
        while True:
            started = time.monotonic()
            res = yield Tx(
                lambda: self._op_acquire(thread_id, owner, version, requested, handoff)
            )
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
                    q.get("last_error") or res.get("last_error"),
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
        # The run's own writes during its start (a migration rewriting the checkpoint)
        # are fenced with this lease: _fence reads it from the context only.
        outer = _RUN_LEASE.get()
        _RUN_LEASE.set(lease)
        try:
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
                saved = yield Tx(lambda: self._op_get_tuple(config), transaction=False)
                _check_runnable(saved)
            except CheckpointLoadError as exc:
                # Fail closed: a checkpoint we cannot read is never run on half a state,
                # and retrying cannot fix stored bytes: quarantine at once.
                record = PoisonRecord(
                    thread_id, lease.checkpoint_id, lease.attempts,
                    f"{type(exc).__name__}: {exc}"[:4000], version, "load_error",
                )
                yield from self._flow_quarantine(lease, record, exc)
            if saved is not None:
                saved = yield from self._flow_check_version(thread_id, saved, version, policy)
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

    def _flow_check_version(
        self, thread_id: str, saved: CheckpointTuple, current: str | None, policy: str
    ) -> Flow[CheckpointTuple]:
        """Every run start on a thread with a checkpoint (a resume, and also a run with
        new input: its old state would run on the new graph just the same). A registered
        migration path wins over the policy."""
        if policy not in VERSION_POLICIES:
            raise ConfigurationError(
                f"unknown version_policy {policy!r} (use one of {', '.join(VERSION_POLICIES)})",
                policy=policy,
            )
        stored = saved.metadata.get(VERSION_KEY) if saved.metadata else None
        if current is None or stored == current:
            return saved
        graph = RUN_GRAPH.get()
        if stored is None:
            if self.unversioned_policy == "adopt" or policy in ("warn", "auto-upgrade"):
                return saved
            raise GraphVersionMismatchError(thread_id, None, current)
        chain = self.migrations.path(str(stored), current)
        if chain:
            reloaded = yield from flow_migrate(
                self, saved, str(stored), current, chain, graph=graph, origin="run"
            )
            return cast(CheckpointTuple, reloaded)
        if policy == "auto-upgrade":
            return saved
        rows = yield Tx(lambda: op_load_versions([str(stored), current]))
        compat = classify_saved(saved, str(stored), current, rows, graph)
        if policy == "strict":
            raise GraphVersionMismatchError(thread_id, str(stored), current, compat.as_dict())
        if policy == "warn":
            orphans = pending_orphans(saved, graph) if graph is not None else []
            logger.warning(
                "thread %s was written by graph version %s, resuming on %s (version_policy=warn, %s)%s",
                thread_id, stored, current, compat.summary(),
                f"; pending work for missing node(s) {orphans} will be skipped" if orphans else "",
            )
            return saved
        if compat.automatic and compat.verdict in ("identical", "compatible"):
            logger.info(
                "thread %s: graph version %s -> %s is %s; resuming", thread_id, stored, current,
                compat.summary(),
            )
            return saved
        raise GraphVersionMismatchError(thread_id, str(stored), current, compat.as_dict())

    def _flow_record_version(self, version: str | None, ctx: _RunContext) -> Flow[None]:
        """Store the running graph's topology once per version (per saver and its
        views): later mismatches are classified against it. One statement the first
        time a version runs in this process, nothing after, nothing per step."""
        if not version or ctx.graph is None or version in self._recorded_versions:
            return
        try:
            topology = graph_topology(ctx.graph)
        except Exception:  # a graph we cannot describe: its threads classify "unknown"
            logger.debug("could not describe %r", ctx.graph, exc_info=True)
            return
        yield Tx(lambda: op_record_version(version, topology))
        self._recorded_versions.add(version)

    def _op_rewrite(
        self,
        saved: CheckpointTuple,
        result: MigrationResult,
        metadata: dict[str, Any],
        *,
        expected: str,
        origin: str,
    ) -> Op[None]:
        """Replace a checkpoint in place (same id, so task ids and pending writes keep
        matching) with its migrated form, in one transaction, after copying the rows it
        replaces into durable_migration_log. Changed channels get new blob rows under
        new versions; the old blobs stay, so history is not rewritten."""
        cfg = saved.config["configurable"]
        thread_id, ns, cid = str(cfg["thread_id"]), cfg.get("checkpoint_ns", ""), cfg["checkpoint_id"]
        checkpoint = result.checkpoint
        target = metadata.get(VERSION_KEY)
        fence, lease = self._fence(thread_id)
        # In a run we hold the lease (fence); outside one (CLI, batch) lock the thread row
        # so no run takes the lease and reads the checkpoint before this commits.
        first = [fence if lease is not None else Stmt(LOCK_THREAD_SQL, (thread_id,), fetch=True)]
        first.append(Stmt(LOCK_CHECKPOINT_SQL, (thread_id, ns, cid), fetch=True))
        first.append(Stmt(WRITE_PATHS_SQL, (thread_id, ns, cid), fetch=True))
        rows = yield Batch(first)
        if lease is not None:
            self._check_fence(thread_id, lease, rows[0])
        elif rows[0] and self.leases_enabled:
            holder = rows[0][0]
            if holder["lease_owner"] and (holder["expires_in"] or 0) > 0:
                raise ThreadBusyError(thread_id, holder["lease_owner"], holder["expires_in"])
        if not rows[1]:
            raise MigrationError(
                f"checkpoint {cid!r} of thread {thread_id!r} disappeared while migrating",
                thread_id=thread_id, from_version=expected, to_version=target,
            )
        now_version = rows[1][0]["graph_version"]
        if now_version == target:
            return  # migrated meanwhile (another worker, or a retried commit): reloaded next
        if now_version != expected:
            raise MigrationError(
                f"checkpoint {cid!r} of thread {thread_id!r} changed while migrating (its version "
                f"is now {now_version!r}, expected {expected!r}); retry",
                thread_id=thread_id, from_version=expected, to_version=target,
            )
        raw_inline: dict[str, Any] = rows[1][0]["inline_values"] or {}
        paths = {r["task_id"]: r["task_path"] for r in rows[2]}
        old_versions = saved.checkpoint["channel_versions"]
        new_versions = checkpoint["channel_versions"]
        gone = [(k, str(v)) for k, v in old_versions.items() if new_versions.get(k) != v]
        log = yield Batch(
            [
                Stmt(
                    INSERT_LOG_SQL,
                    {
                        "from": expected,
                        "to": target,
                        "steps": _jsonb(result.steps),
                        "origin": origin,
                        "channels": [k for k, _ in gone],
                        "versions": [v for _, v in gone],
                        "thread_id": thread_id,
                        "ns": ns,
                        "cid": cid,
                    },
                    fetch=True,
                )
            ]
        )
        md = {**metadata, MIGRATION_ID_KEY: str(log[0][0]["id"])}
        values_json: dict[str, Any] = {}
        blob_rows = []
        artifacts: dict[bytes, bytes] = {}
        for k, v in checkpoint["channel_values"].items():
            if k in old_versions and old_versions[k] == new_versions.get(k):
                # Unchanged: keep it exactly as stored (inline JSON, or its blob row).
                if k in raw_inline:
                    values_json[k] = raw_inline[k]
                continue
            if isinstance(v, _DeltaSnapshot) or not self._inline(v):
                if isinstance(v, _DeltaSnapshot):
                    values_json[k] = True
                enc = self.codec.encode(self.serde, v)
                artifacts.update(enc.artifacts)
                blob_rows.append((thread_id, ns, k, cast(str, new_versions[k]), enc.type, enc.data))
            else:
                values_json[k] = v
        write_rows = []
        if result.writes_changed:
            by_task: dict[str, int] = {}
            for task_id, channel, value in result.writes:
                idx = WRITES_IDX_MAP.get(channel)
                if idx is None:
                    idx = by_task.get(task_id, 0)
                    by_task[task_id] = idx + 1
                enc = self.codec.encode(self.serde, value)
                artifacts.update(enc.artifacts)
                path = result.task_paths.get(task_id) or paths.get(task_id, "")
                write_rows.append((thread_id, ns, cid, task_id, path, idx, channel, enc.type, enc.data))
        art_stmts, new_refs = self._artifact_stmts(thread_id, artifacts)
        stmts = [*art_stmts]
        if blob_rows:
            stmts.append(Stmt(UPSERT_CHECKPOINT_BLOBS_SQL, blob_rows, many=True))
        stmts.append(
            Stmt(
                "UPDATE checkpoints SET checkpoint = %s, metadata = %s "
                "WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s",
                (_jsonb({**checkpoint, "channel_values": values_json}), _jsonb(md), thread_id, ns, cid),
            )
        )
        if result.writes_changed:
            stmts.append(
                Stmt(
                    "DELETE FROM checkpoint_writes "
                    "WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s",
                    (thread_id, ns, cid),
                )
            )
            if write_rows:
                stmts.append(Stmt(UPSERT_CHECKPOINT_WRITES_SQL, write_rows, many=True))
        if ns == "":
            stmts.append(Stmt(SET_THREAD_VERSION_SQL, (target, thread_id)))
        yield Batch(stmts)
        if new_refs:
            yield AfterCommit(lambda: self._known_refs.add(thread_id, new_refs))

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
        if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | GeneratorExit):
            return "stopped", False, True, None
        text = f"{type(exc).__name__}: {exc}"[:4000]
        return "error", False, False, text

    def _head(self, loop: Any) -> str | None:
        cfg = getattr(loop, "checkpoint_config", None) or {}
        return cast("str | None", cfg.get("configurable", {}).get("checkpoint_id"))

    def _release_flow(self, lease: Lease, loop: Any, exc: BaseException | None) -> Flow[None]:
        self._leases.remove(lease)
        lease.released = True
        status, reset, undo, error = self._exit_outcome(loop, exc)
        head = self._head(loop)
        moved = head is not None and head != lease.checkpoint_id
        if error is not None and moved:
            # The failure happened past the checkpoint the run started from: it is the
            # first failed attempt at the new head.
            moved_to = Stmt(
                "UPDATE durable_threads SET attempts = 1, attempts_checkpoint_id = %s "
                "WHERE thread_id = %s AND lease_token = %s AND lease_owner = %s",
                (head, lease.thread_id, lease.token, lease.owner),
            )
            yield Tx(
                lambda: self._op_release(
                    lease, status, reset=False, undo=False, error=error, first=(moved_to,)
                )
            )
            return
        yield Tx(lambda: self._op_release(lease, status, reset=reset, undo=undo, error=error))

    def _attach_exit(self, ctx: _RunContext, lease: Lease, outer: Lease | None = None) -> None:
        self._ensure_renewer()
        stack = ctx.loop.stack

        def restore() -> None:
            # A root run started inside another run's node (another thread) hands the
            # context back to the outer run's lease: writes fence only with _RUN_LEASE.
            if _RUN_LEASE.get() is lease:
                _RUN_LEASE.set(outer if outer is not None and not outer.released else None)

        def sync_exit(exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
            if self._granularity is not None:  # deferred checkpoints, before the release
                try:
                    self._run_flow(self._granularity.exit_flow(self, lease))
                except Exception:
                    logger.exception("could not flush the deferred checkpoint of thread %s", lease.thread_id)
            try:
                self._run_flow(self._release_flow(lease, ctx.loop, exc))
            except Exception:
                logger.exception("could not release the lease on thread %s", lease.thread_id)
            restore()
            return False

        async def async_exit(exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
            if self._granularity is not None:
                try:
                    await self._arun_flow(self._granularity.exit_flow(self, lease))
                except Exception:
                    logger.exception("could not flush the deferred checkpoint of thread %s", lease.thread_id)
            try:
                await self._arun_flow(self._release_flow(lease, ctx.loop, exc))
            except Exception:
                logger.exception("could not release the lease on thread %s", lease.thread_id)
            restore()
            return False

        if isinstance(stack, AsyncExitStack):
            stack.push_async_exit(async_exit)
        elif isinstance(stack, ExitStack):
            stack.push(sync_exit)

        # LangGraph calls loop._first() after this get_tuple, still inside __enter__. If
        # it raises (EmptyInputError on invoke(None) of a new thread, an input or Command
        # the thread cannot take) the `with` never reaches __exit__, so the callbacks
        # above never run: the lease would stay held, and renewed, for the life of the
        # process (every other run of the thread: ThreadBusyError). Hand the thread back
        # there as a run that never started: the attempt is not counted.
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

    def _ensure_renewer(self) -> None:
        with self._renewer_lock:
            if self._renewer is None or not self._renewer.is_alive():
                self._renewer = _Renewer(self)
                self._renewer.start()

    def _stop_renewer(self) -> None:
        with self._renewer_lock:
            if self._renewer is not None:
                self._renewer.stop()
                self._renewer = None

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

    # ------------------------------------------------------------------ fail closed
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

    def get_next_version(self, current: Any, channel: Any) -> Any:
        """The stock versioning, plus the zombie guard: LangGraph calls this on the
        loop's own thread when it applies a step's writes, before the next step's tasks
        start. A run whose lease was lost stops here with ``LeaseLostError`` instead of
        running further nodes (and their side effects) whose writes would be rejected."""
        lease = _RUN_LEASE.get()
        if lease is not None and not lease.released:
            self._confirm_lease(lease)
        return super().get_next_version(current, channel)

    def _confirm_lease(self, lease: Lease) -> None:
        if not lease.lost and time.monotonic() - lease.renewed_at > self.lease_ttl / 2:
            # The renewer (every ttl/3) fell behind: paused process, database outage.
            # Renew now or learn the lease is gone, before another step runs on it.
            self._ensure_renewer()
            renewer = self._renewer
            if renewer is not None:
                try:
                    renewer.renew_now([lease])
                except Exception as exc:
                    logger.warning("could not confirm the lease on thread %s: %s", lease.thread_id, exc)
                    if time.monotonic() - lease.renewed_at > self.lease_ttl:
                        lease.lost = True
        if lease.lost:
            raise LeaseLostError(lease.thread_id, lease.token)

    # ------------------------------------------------------------------ public API (sync)
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

    @_telemetry.instrument("get")
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        ctx = self._run_context(config)
        with _canceled_as_typed("get_tuple", config):
            if ctx is not None:
                outer = _RUN_LEASE.get()
                saved, lease = self._run_flow(self._flow_run_start(config, ctx, _HANDOFF.get()))
                self._attach_exit(ctx, lease, outer)
                if self._granularity is not None:
                    self._granularity.start(lease, ctx, saved)
                _RUN_LEASE.set(lease)
                self._bind_run(config, lease)
                return cast("CheckpointTuple | None", saved)
            if config.get("configurable", {}).get("checkpoint_ns"):
                self._bind_run(config, None)
            # Reads run without BEGIN/COMMIT: each statement has its own snapshot either
            # way (READ COMMITTED) and artifacts are immutable; two round trips less.
            return cast(
                "CheckpointTuple | None",
                self._run_op(lambda: self._op_get_tuple(config), transaction=False),
            )

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        with _canceled_as_typed("list", config):
            items = self._run_op(lambda: self._op_list(config, filter, before, limit), transaction=False)
        yield from items

    @_telemetry.instrument("put")
    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        self._check_unrecognised_put(config, metadata)
        if self._granularity is not None and (
            flow := self._granularity.put_flow(self, config, checkpoint, metadata, new_versions)
        ) is not None:
            return cast(RunnableConfig, self._run_flow(flow))
        return cast(
            RunnableConfig,
            self._write(
                str(config["configurable"]["thread_id"]),
                lambda: self._op_put(config, checkpoint, metadata, new_versions),
            ),
        )

    @_telemetry.instrument("put_writes")
    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        if self._granularity is not None and (
            flow := self._granularity.writes_flow(self, config, writes, task_id, task_path)
        ) is not None:
            self._run_flow(flow)
            return
        self._write(
            str(config["configurable"]["thread_id"]),
            lambda: self._op_put_writes(config, writes, task_id, task_path),
        )

    def delete_thread(self, thread_id: str) -> None:
        with _canceled_as_typed("delete_thread", _threads_config(thread_id)):
            self._run_op(lambda: self._op_delete_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        with _canceled_as_typed("delete_for_runs", _threads_config(())):
            self._run_flow(self._flow_delete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._run_op(lambda: self._op_copy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        with _canceled_as_typed("prune", _threads_config(thread_ids)):
            self._run_flow(self._flow_prune(thread_ids, strategy))

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return cast(
            "Mapping[str, DeltaChannelHistory]",
            self._run_op(lambda: self._op_delta_history(config, channels), transaction=False),
        )

    # ------------------------------------------------------------------ public API (async)
    @_telemetry.instrument("get")
    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        ctx = self._run_context(config)
        with _canceled_as_typed("get_tuple", config):
            if ctx is not None:
                outer = _RUN_LEASE.get()
                saved, lease = await self._arun_flow(self._flow_run_start(config, ctx, _HANDOFF.get()))
                self._attach_exit(ctx, lease, outer)
                if self._granularity is not None:
                    self._granularity.start(lease, ctx, saved)
                _RUN_LEASE.set(lease)
                self._bind_run(config, lease)
                return cast("CheckpointTuple | None", saved)
            if config.get("configurable", {}).get("checkpoint_ns"):
                self._bind_run(config, None)
            return cast(
                "CheckpointTuple | None",
                await self._arun_op(lambda: self._op_get_tuple(config), transaction=False),
            )

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        with _canceled_as_typed("list", config):
            items = await self._arun_op(
                lambda: self._op_list(config, filter, before, limit), transaction=False
            )
        for item in items:
            yield item

    @_telemetry.instrument("put")
    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        self._check_unrecognised_put(config, metadata)
        if self._granularity is not None and (
            flow := self._granularity.put_flow(self, config, checkpoint, metadata, new_versions)
        ) is not None:
            return cast(RunnableConfig, await self._arun_flow(flow))
        return cast(
            RunnableConfig,
            await self._awrite(
                str(config["configurable"]["thread_id"]),
                lambda: self._op_put(config, checkpoint, metadata, new_versions),
            ),
        )

    @_telemetry.instrument("put_writes")
    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        if self._granularity is not None and (
            flow := self._granularity.writes_flow(self, config, writes, task_id, task_path)
        ) is not None:
            await self._arun_flow(flow)
            return
        await self._awrite(
            str(config["configurable"]["thread_id"]),
            lambda: self._op_put_writes(config, writes, task_id, task_path),
        )

    async def adelete_thread(self, thread_id: str) -> None:
        with _canceled_as_typed("delete_thread", _threads_config(thread_id)):
            await self._arun_op(lambda: self._op_delete_thread(thread_id))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        with _canceled_as_typed("delete_for_runs", _threads_config(())):
            await self._arun_flow(self._flow_delete_for_runs(run_ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._arun_op(lambda: self._op_copy_thread(source_thread_id, target_thread_id))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        with _canceled_as_typed("prune", _threads_config(thread_ids)):
            await self._arun_flow(self._flow_prune(thread_ids, strategy))

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return cast(
            "Mapping[str, DeltaChannelHistory]",
            await self._arun_op(lambda: self._op_delta_history(config, channels), transaction=False),
        )

    # ------------------------------------------------------------------ generic access
    def run_op(self, factory: Callable[[], Op[Any]], *, transaction: bool = True) -> Any:
        """Run a package-internal op (used by the ledger, CLI, retention, recovery)."""
        return self._run_op(factory, transaction=transaction)

    async def arun_op(self, factory: Callable[[], Op[Any]], *, transaction: bool = True) -> Any:
        return await self._arun_op(factory, transaction=transaction)

    def run_flow(self, flow: Flow[Any]) -> Any:
        return self._run_flow(flow)

    async def arun_flow(self, flow: Flow[Any]) -> Any:
        return await self._arun_flow(flow)

    def lease_for(self, thread_id: str) -> Lease | None:
        """The lease this process holds on ``thread_id`` (inside a run), if any."""
        return self._leases.get(str(thread_id))


class _ResolvingSerde:
    """Serde facade for the stock delta helper: resolves artifact envelopes."""

    def __init__(
        self, saver: _DurableBase, where: Mapping[str, Any], local: Mapping[bytes, bytes] | None = None
    ) -> None:
        self.saver = saver
        self.where = where
        self.local = local

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        return self.saver._decode(data[0], data[1], self.where, self.local)

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        return self.saver.serde.dumps_typed(obj)


class _Renewer(threading.Thread):
    """Renews this process's leases every ttl/3 on a dedicated connection, so a busy
    pool or a blocked event loop cannot starve renewal. A lease the database no longer
    confirms is marked lost: the run's next write fails fast with LeaseLostError."""

    def __init__(self, saver: _DurableBase) -> None:
        super().__init__(name="langgraph-durable-lease-renewer", daemon=True)
        self.saver = saver
        self.registry = saver._leases
        self._stop_event = threading.Event()
        self._conn: Connection[Any] | None = None
        # One statement at a time on the renewer's connection: renew_now() is also called
        # from run threads (see _DurableBase._confirm_lease).
        self._conn_lock = threading.Lock()
        self.exiting = False

    def stop(self) -> None:
        self._stop_event.set()

    def is_alive(self) -> bool:
        # A renewer that decided to exit no longer counts: _ensure_renewer starts another.
        return not self.exiting and super().is_alive()

    def renew_now(self, leases: list[Lease]) -> None:
        with self._conn_lock:
            try:
                self._renew(leases)
            except Exception:
                self._close()
                raise

    def run(self) -> None:
        interval = self.saver.lease_ttl / 3
        idle = 0.0
        while not self._stop_event.wait(interval):
            leases = self.registry.snapshot()
            if not leases:
                idle += interval
                if idle > 60:
                    # Decide under the lock _ensure_renewer holds: a lease added after
                    # this check finds exiting=True and gets a new renewer.
                    with self.saver._renewer_lock:
                        if not self.registry.snapshot():
                            self.exiting = True
                            break
                continue
            idle = 0.0
            try:
                self.renew_now(leases)
            except Exception as exc:
                logger.warning("lease renewal failed: %s", exc)
        with self._conn_lock:
            self._close()

    @_telemetry.instrument("lease_renew")
    def _renew(self, leases: list[Lease]) -> None:
        started = time.monotonic()
        if self._conn is None or self._conn.closed:
            self._conn = self.saver._renew_connect()
            self._conn.autocommit = True
            if schema := session_schema(self.saver):
                self._conn.execute(_sql.set_search_path(schema))
        rows = self._conn.execute(
            _sql.RENEW_SQL,
            (
                self.saver.lease_ttl,
                [lease.thread_id for lease in leases],
                [lease.token for lease in leases],
                [lease.owner for lease in leases],
            ),
        ).fetchall()
        renewed = {r[0] for r in rows}
        for lease in leases:
            if lease.thread_id in renewed:
                lease.renewed_at = max(lease.renewed_at, started)
            elif not lease.released:
                lease.lost = True
                logger.error(
                    "lease on thread %s (token %d) was lost (taken over after expiry)",
                    lease.thread_id, lease.token,
                )

    def _close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None


def _configure_schema(schema: str | None) -> Callable[[Connection[Any]], None]:
    def configure(conn: Connection[Any]) -> None:
        if schema:
            conn.execute(_sql.set_search_path(schema))

    return configure


def _aconfigure_schema(schema: str | None) -> Callable[[AsyncConnection[Any]], Any]:
    async def configure(conn: AsyncConnection[Any]) -> None:
        if schema:
            await conn.execute(_sql.set_search_path(schema))

    return configure


_CONN_KWARGS = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}


def _conn_kwargs(pooler: Pooler) -> dict[str, Any]:
    """The saver's connection options; behind a transaction pooler, no prepared
    statements (see pooler.py)."""
    return {**_CONN_KWARGS, "prepare_threshold": prepare_threshold(pooler)}


def _conninfo_of(conn: Any) -> str:
    """A conninfo string that opens another connection like ``conn`` (pool or conn)."""
    if isinstance(conn, ConnectionPool | AsyncConnectionPool):
        return str(conn.conninfo)
    info = conn.info
    params = info.get_parameters()
    if info.password:
        params["password"] = info.password
    return psycopg.conninfo.make_conninfo(**params)


def _check_conn(saver: str, conn: Any, *, asynchronous: bool) -> None:
    """Refuse, with a typed error saying what to pass, a connection object the saver's
    driver cannot use. Some published tutorials hand an ``asyncpg`` pool to the saver:
    it would fail later, on the first query, with an AttributeError."""
    if asynchronous:
        good: tuple[type, ...] = (AsyncConnection, AsyncConnectionPool)
        expected = (
            "a psycopg 3 AsyncConnectionPool or AsyncConnection opened with autocommit=True"
        )
        factory = "AsyncDurablePostgresSaver.from_conn_string(dsn)"
    else:
        good = (Connection, ConnectionPool)
        expected = "a psycopg 3 ConnectionPool or Connection opened with autocommit=True"
        factory = "DurablePostgresSaver.from_conn_string(dsn)"
    if isinstance(conn, good):
        return
    kind = type(conn)
    got = f"{kind.__module__}.{kind.__qualname__}"
    root = (kind.__module__ or "").split(".")[0]
    if root == "asyncpg":
        hint = (
            "asyncpg is another driver; open the pool with psycopg_pool: "
            "AsyncConnectionPool(dsn, kwargs={'autocommit': True}, open=False), then "
            f"`async with pool:`; or let the saver open one: `async with {factory} as saver:`"
        )
    elif isinstance(conn, str | bytes):
        hint = f"For a connection string use `with {factory} as saver:`"
    elif asynchronous and isinstance(conn, Connection | ConnectionPool):
        hint = "That is a synchronous connection: use DurablePostgresSaver with it."
    elif not asynchronous and isinstance(conn, AsyncConnection | AsyncConnectionPool):
        hint = "That is an asynchronous connection: use AsyncDurablePostgresSaver with it."
    elif root in ("psycopg2", "sqlalchemy"):
        hint = f"{root} connections are not supported; use psycopg 3, or {factory}."
    else:
        hint = f"Or let the saver open a pool: {factory}."
    raise UnsupportedConnectionError(saver, got, expected, hint)


def _check_pipe(saver: str, conn: Any, pipe: Any, pool_type: type) -> None:
    """``pipe``: the stock savers take a pipeline of the connection they are given and
    run every statement through it, syncing after each write. The durable driver does
    the same on a connection in pipeline mode: each operation's statements go to the
    server as one batch inside ``pipe`` and are synced before the call returns (a put
    returns once committed), so passing a pipe changes nothing else; without one, each
    operation opens its own pipeline block. As with the stock saver, a pipe only goes
    with a single connection, never a pool."""
    if pipe is None:
        return
    if isinstance(conn, pool_type):
        raise ConfigurationError(
            f"{saver}: a Pipeline should be used only with a single connection, not a pool",
            saver=saver,
        )
    if getattr(pipe, "_conn", conn) is not conn:
        raise ConfigurationError(f"{saver}: pipe is not a pipeline of conn", saver=saver)


class DurablePostgresSaver(_DurableBase):
    """Synchronous durable saver. Thread-safe (LangGraph calls ``put`` from executor
    threads). Its async methods run the same code in a worker thread.

    ``DurablePostgresSaver(conn, pipe=None, serde=None, *, ...)`` takes the stock
    ``PostgresSaver`` arguments in the stock order (see ``_DurableBase`` for the
    package's own keyword-only options). ``conn``: a psycopg 3 ``Connection`` or
    ``ConnectionPool`` (``autocommit=True``; the saver sets its own row factory per
    cursor). ``pipe``: a ``psycopg.Pipeline`` of ``conn``, as the stock saver takes it;
    see ``_check_pipe`` for what it changes."""

    def _load_checkpoint_tuple(self, value: Any) -> CheckpointTuple:
        """The stock ``PostgresSaver``'s row-to-tuple hook, same name and signature;
        what this saver adds (the artifacts a row needs, pre-v4 pending sends) rides in
        the row (``_op_load_rows``)."""
        return super()._row_tuple(value)

    def _row_tuple(self, row: Any) -> CheckpointTuple:
        return self._load_checkpoint_tuple(row)

    def __init__(
        self,
        conn: Connection[Any] | ConnectionPool[Any],
        pipe: Pipeline | None = None,
        serde: SerializerProtocol | None = None,
        *,
        schema: str | None = None,
        graph_version: str | None = None,
        version_policy: VersionPolicy = "refuse",
        unversioned_policy: UnversionedPolicy = "adopt",
        migrations: MigrationRegistry | None = None,
        max_resume_attempts: int = 3,
        on_poison: PoisonHook | None = None,
        lease_ttl: float = 30.0,
        on_busy: OnBusy = "raise",
        busy_timeout: float = 60.0,
        artifact_threshold: int | None = 1024,
        compression_level: int = 3,
        artifact_cache_bytes: int = 64 * 1024 * 1024,
        leases: bool = True,
        takeover_dead_owners: bool = True,
        on_unrecognised_run: OnUnrecognisedRun = "raise",
        pooler: str | None = None,
        run_migrations: bool = True,
        checkpoint_policy: CheckpointPolicy | None = None,
    ) -> None:
        super().__init__(
            serde=serde, schema=schema, graph_version=graph_version,
            version_policy=version_policy, unversioned_policy=unversioned_policy,
            migrations=migrations, max_resume_attempts=max_resume_attempts,
            on_poison=on_poison, lease_ttl=lease_ttl, on_busy=on_busy,
            busy_timeout=busy_timeout, artifact_threshold=artifact_threshold,
            compression_level=compression_level, artifact_cache_bytes=artifact_cache_bytes,
            leases=leases, takeover_dead_owners=takeover_dead_owners,
            on_unrecognised_run=on_unrecognised_run,
            pooler=pooler, run_migrations=run_migrations, checkpoint_policy=checkpoint_policy,
        )
        _check_conn("DurablePostgresSaver", conn, asynchronous=False)
        _check_pipe("DurablePostgresSaver", conn, pipe, ConnectionPool)
        check_pooled_conn("DurablePostgresSaver", conn, self.pooler, (ConnectionPool,))
        self.conn = conn
        self.pipe = pipe
        self.supports_pipeline = Capabilities().has_pipeline()
        self._driver = SyncDriver(conn, session_schema(self) if not getattr(conn, "_durable_own", False) else None)
        self._conninfo = _conninfo_of(conn)

    @classmethod
    @contextmanager
    def from_conn_string(
        cls,
        conn_string: str | None = None,
        *,
        pipeline: bool = False,
        serde: SerializerProtocol | None = None,
        pool_size: int = 10,
        schema: str | None = None,
        graph_version: str | None = None,
        version_policy: VersionPolicy = "refuse",
        unversioned_policy: UnversionedPolicy = "adopt",
        migrations: MigrationRegistry | None = None,
        max_resume_attempts: int = 3,
        on_poison: PoisonHook | None = None,
        lease_ttl: float = 30.0,
        on_busy: OnBusy = "raise",
        busy_timeout: float = 60.0,
        artifact_threshold: int | None = 1024,
        compression_level: int = 3,
        artifact_cache_bytes: int = 64 * 1024 * 1024,
        leases: bool = True,
        takeover_dead_owners: bool = True,
        on_unrecognised_run: OnUnrecognisedRun = "raise",
        pooler: str | None = None,
        run_migrations: bool = True,
        checkpoint_policy: CheckpointPolicy | None = None,
    ) -> Iterator[DurablePostgresSaver]:
        """Open a connection pool on ``conn_string`` (else
        ``LANGGRAPH_DURABLE_DSN``, else the embedded PostgreSQL) and yield a saver.

        ``pipeline``: the stock parameter, accepted so stock code runs unchanged. The
        durable saver always works in pipeline mode: each operation's statements go to
        the server in one pipeline round trip, synced before the call returns (a put
        returns once committed). The stock ``pipeline=True`` instead puts its single
        connection in pipeline mode until the next sync; here a pool is kept either way
        (a dropped connection is replaced), so ``True`` and ``False`` give the same saver."""
        if not isinstance(pipeline, bool):
            raise ConfigurationError(f"pipeline must be a bool, not {pipeline!r}", pipeline=pipeline)
        dsn = resolve_dsn(conn_string)
        schema = _sql.validate_schema(schema)
        pooled = resolve_pooler(pooler)
        # A pool that reconnects within a second of a failover (_pool.py).
        with DurableConnectionPool(
            dsn,
            min_size=1,
            max_size=pool_size,
            kwargs=_conn_kwargs(pooled),
            configure=_configure_schema(None if pooled else schema),
            # No check= on checkout: when a restart or idle-timeout kill has broken
            # several idle connections, the pool's check loop backs off 1, 2, 4... s
            # per broken one (37 s measured with 10) before giving up. The driver
            # instead retries the failed op once after pool.check() replaced them all,
            # and no op pays a SELECT 1 round trip.
            open=True,
            name="langgraph-durable",
        ) as pool:
            pool._durable_own = True  # type: ignore[attr-defined]
            saver = cls(
                pool, serde=serde, schema=schema, graph_version=graph_version,
                version_policy=version_policy, unversioned_policy=unversioned_policy,
                migrations=migrations, max_resume_attempts=max_resume_attempts,
                on_poison=on_poison, lease_ttl=lease_ttl, on_busy=on_busy,
                busy_timeout=busy_timeout, artifact_threshold=artifact_threshold,
                compression_level=compression_level, artifact_cache_bytes=artifact_cache_bytes,
                leases=leases, takeover_dead_owners=takeover_dead_owners,
                on_unrecognised_run=on_unrecognised_run,
                pooler=pooler, run_migrations=run_migrations, checkpoint_policy=checkpoint_policy,
            )
            try:
                yield saver
            finally:
                saver._stop_renewer()

    def setup(self) -> None:
        """Create or migrate the tables. Idempotent and safe to call concurrently.
        With ``run_migrations=False``: only verify them (``SchemaNotReadyError``)."""
        if not self.run_migrations or self.pooler:
            self._run_flow(self._flow_setup_or_check())
            return
        if self.pipe is not None:
            # CREATE INDEX CONCURRENTLY cannot run in pipeline mode (the stock saver's
            # setup fails there): migrate on a short-lived connection of our own.
            with self._renew_connect() as conn:
                SyncDriver(conn, self.schema).run_op(self._op_setup, transaction=False)
            return
        self._run_op(self._op_setup, transaction=False)

    async def asetup(self) -> None:
        """``setup()`` from async code (runs in a worker thread)."""
        await asyncio.to_thread(self.setup)

    def _run_op(self, factory: Callable[[], Op[Any]], *, transaction: bool = True) -> Any:
        return self._driver.run_op(factory, transaction=transaction)

    async def _arun_op(self, factory: Callable[[], Op[Any]], *, transaction: bool = True) -> Any:
        return await asyncio.to_thread(self._driver.run_op, factory, transaction=transaction)

    def _run_flow(self, flow: Flow[Any]) -> Any:
        return self._driver.run_flow(flow)

    async def _arun_flow(self, flow: Flow[Any]) -> Any:
        return await asyncio.to_thread(self._driver.run_flow, flow)

    def _renew_connect(self) -> Connection[Any]:
        return Connection.connect(
            self._conninfo, autocommit=True, prepare_threshold=prepare_threshold(self.pooler)
        )

    @contextmanager
    def connection(self) -> Iterator[Connection[Any]]:
        """A connection (search_path set) for package-internal and user SQL."""
        with self._driver.connection() as conn:
            yield conn

    def close(self) -> None:
        self._stop_renewer()


class AsyncDurablePostgresSaver(_DurableBase):
    """Asynchronous durable saver. Its sync methods may be called from other threads
    (as LangGraph does for sync graphs), like the stock ``AsyncPostgresSaver``.

    ``AsyncDurablePostgresSaver(conn, pipe=None, serde=None, *, ...)``: the stock
    ``AsyncPostgresSaver`` arguments in the stock order. ``conn``: a psycopg 3
    ``AsyncConnection`` or ``AsyncConnectionPool`` (``autocommit=True``); an
    ``asyncpg`` pool is refused with ``UnsupportedConnectionError``. ``pipe``: an
    ``AsyncPipeline`` of ``conn`` (see ``_check_pipe``)."""

    async def _load_checkpoint_tuple(self, value: Any) -> CheckpointTuple:
        """The stock ``AsyncPostgresSaver``'s row-to-tuple hook (a coroutine there too),
        kept for code written against it; this saver's reads do not go through it."""
        return self._row_tuple(value)

    def __init__(
        self,
        conn: AsyncConnection[Any] | AsyncConnectionPool[Any],
        pipe: AsyncPipeline | None = None,
        serde: SerializerProtocol | None = None,
        *,
        schema: str | None = None,
        graph_version: str | None = None,
        version_policy: VersionPolicy = "refuse",
        unversioned_policy: UnversionedPolicy = "adopt",
        migrations: MigrationRegistry | None = None,
        max_resume_attempts: int = 3,
        on_poison: PoisonHook | None = None,
        lease_ttl: float = 30.0,
        on_busy: OnBusy = "raise",
        busy_timeout: float = 60.0,
        artifact_threshold: int | None = 1024,
        compression_level: int = 3,
        artifact_cache_bytes: int = 64 * 1024 * 1024,
        leases: bool = True,
        takeover_dead_owners: bool = True,
        on_unrecognised_run: OnUnrecognisedRun = "raise",
        pooler: str | None = None,
        run_migrations: bool = True,
        checkpoint_policy: CheckpointPolicy | None = None,
    ) -> None:
        super().__init__(
            serde=serde, schema=schema, graph_version=graph_version,
            version_policy=version_policy, unversioned_policy=unversioned_policy,
            migrations=migrations, max_resume_attempts=max_resume_attempts,
            on_poison=on_poison, lease_ttl=lease_ttl, on_busy=on_busy,
            busy_timeout=busy_timeout, artifact_threshold=artifact_threshold,
            compression_level=compression_level, artifact_cache_bytes=artifact_cache_bytes,
            leases=leases, takeover_dead_owners=takeover_dead_owners,
            on_unrecognised_run=on_unrecognised_run,
            pooler=pooler, run_migrations=run_migrations, checkpoint_policy=checkpoint_policy,
        )
        _check_conn("AsyncDurablePostgresSaver", conn, asynchronous=True)
        _check_pipe("AsyncDurablePostgresSaver", conn, pipe, AsyncConnectionPool)
        check_pooled_conn("AsyncDurablePostgresSaver", conn, self.pooler, (AsyncConnectionPool,))
        self.conn = conn
        self.pipe = pipe
        self.supports_pipeline = Capabilities().has_pipeline()
        self._driver = AsyncDriver(conn, session_schema(self) if not getattr(conn, "_durable_own", False) else None)
        self._conninfo = _conninfo_of(conn)
        self.loop = asyncio.get_running_loop()

    @classmethod
    @asynccontextmanager
    async def from_conn_string(
        cls,
        conn_string: str | None = None,
        *,
        pipeline: bool = False,
        serde: SerializerProtocol | None = None,
        pool_size: int = 10,
        schema: str | None = None,
        graph_version: str | None = None,
        version_policy: VersionPolicy = "refuse",
        unversioned_policy: UnversionedPolicy = "adopt",
        migrations: MigrationRegistry | None = None,
        max_resume_attempts: int = 3,
        on_poison: PoisonHook | None = None,
        lease_ttl: float = 30.0,
        on_busy: OnBusy = "raise",
        busy_timeout: float = 60.0,
        artifact_threshold: int | None = 1024,
        compression_level: int = 3,
        artifact_cache_bytes: int = 64 * 1024 * 1024,
        leases: bool = True,
        takeover_dead_owners: bool = True,
        on_unrecognised_run: OnUnrecognisedRun = "raise",
        pooler: str | None = None,
        run_migrations: bool = True,
        checkpoint_policy: CheckpointPolicy | None = None,
    ) -> AsyncIterator[AsyncDurablePostgresSaver]:
        """Open an async pool and yield a saver (DSN resolved as the sync saver's).
        ``pipeline``: see ``DurablePostgresSaver.from_conn_string``."""
        if not isinstance(pipeline, bool):
            raise ConfigurationError(f"pipeline must be a bool, not {pipeline!r}", pipeline=pipeline)
        dsn = conn_string or os.environ.get("LANGGRAPH_DURABLE_DSN")
        if not dsn:
            dsn = await asyncio.to_thread(resolve_dsn, None)
        schema = _sql.validate_schema(schema)
        pooled = resolve_pooler(pooler)
        async with AsyncDurableConnectionPool(
            dsn,
            min_size=1,
            max_size=pool_size,
            kwargs=_conn_kwargs(pooled),
            configure=_aconfigure_schema(None if pooled else schema),
            # No check= on checkout: see DurablePostgresSaver.from_conn_string.
            open=False,
            name="langgraph-durable",
        ) as pool:
            pool._durable_own = True  # type: ignore[attr-defined]
            saver = cls(
                pool, serde=serde, schema=schema, graph_version=graph_version,
                version_policy=version_policy, unversioned_policy=unversioned_policy,
                migrations=migrations, max_resume_attempts=max_resume_attempts,
                on_poison=on_poison, lease_ttl=lease_ttl, on_busy=on_busy,
                busy_timeout=busy_timeout, artifact_threshold=artifact_threshold,
                compression_level=compression_level, artifact_cache_bytes=artifact_cache_bytes,
                leases=leases, takeover_dead_owners=takeover_dead_owners,
                on_unrecognised_run=on_unrecognised_run,
                pooler=pooler, run_migrations=run_migrations, checkpoint_policy=checkpoint_policy,
            )
            try:
                yield saver
            finally:
                saver._stop_renewer()

    async def setup(self) -> None:
        """Create or migrate the tables: ``await saver.setup()``, as with the stock
        ``AsyncPostgresSaver``. Idempotent and safe to call concurrently. From another
        thread: ``asyncio.run_coroutine_threadsafe(saver.setup(), saver.loop).result()``.
        With ``run_migrations=False``: only verify them (``SchemaNotReadyError``)."""
        if not self.run_migrations or self.pooler:
            await self._arun_flow(self._flow_setup_or_check())
            return
        if self.pipe is not None:
            # Not in pipeline mode: see DurablePostgresSaver.setup.
            async with await AsyncConnection.connect(self._conninfo, autocommit=True) as conn:
                await AsyncDriver(conn, self.schema).run_op(self._op_setup, transaction=False)
            return
        await self._arun_op(self._op_setup, transaction=False)

    async def asetup(self) -> None:
        """Alias of ``setup()`` (kept for code written against earlier releases)."""
        await self.setup()

    def _check_thread(self) -> None:
        try:
            if asyncio.get_running_loop() is self.loop:
                raise asyncio.InvalidStateError(
                    "Synchronous calls to AsyncDurablePostgresSaver are only allowed from a "
                    "different thread. From the event loop, use the async methods "
                    "(await saver.aget_tuple(...), await graph.ainvoke(...))."
                )
        except RuntimeError:
            pass

    def _run_op(self, factory: Callable[[], Op[Any]], *, transaction: bool = True) -> Any:
        self._check_thread()
        return asyncio.run_coroutine_threadsafe(
            self._driver.run_op(factory, transaction=transaction), self.loop
        ).result()

    async def _arun_op(self, factory: Callable[[], Op[Any]], *, transaction: bool = True) -> Any:
        return await self._driver.run_op(factory, transaction=transaction)

    def _run_flow(self, flow: Flow[Any]) -> Any:
        self._check_thread()
        return asyncio.run_coroutine_threadsafe(self._driver.run_flow(flow), self.loop).result()

    async def _arun_flow(self, flow: Flow[Any]) -> Any:
        return await self._driver.run_flow(flow)

    def _renew_connect(self) -> Connection[Any]:
        return Connection.connect(
            self._conninfo, autocommit=True, prepare_threshold=prepare_threshold(self.pooler)
        )

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        async with self._driver.connection() as conn:
            yield conn

    async def aclose(self) -> None:
        self._stop_renewer()


__all__ = [
    "AsyncDurablePostgresSaver",
    "DurablePostgresSaver",
    "Lease",
    "PoisonRecord",
]

