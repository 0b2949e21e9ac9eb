"""``@idempotent``: a side effect happens once, however often its run is resumed.

Checkpointing cannot prevent a repeated effect on its own: a node that dies after its
effect but before its checkpoint runs again from its first line. Each wrapped call is
therefore recorded in a ledger (``durable_ledger``, in the same database as the
checkpoints) under an idempotency key:

1. *claim* the key: ``INSERT ... ON CONFLICT DO NOTHING`` (DBOS style), then read the
   row in the same round trip;
2. if we own it, run the function (``status = 'started'``, a short *claim lease* renewed
   in the background tells other callers the call is alive), then record its serialized
   result (``status = 'completed'``);
3. otherwise decide from the row: replay a recorded result, refuse other arguments
   (``IdempotencyConflictError``, HTTP 422 in the IETF draft), wait for a live claim or
   give up (``CallInFlightError``, 409), or report an expired claim with no result as an
   unknown outcome (``OutcomeUnknownError``; ``on_unknown="retry"`` re-runs it instead).

Transactional mode (``transactional=True``) hands the function a psycopg connection in
the same transaction as the claim and the record, so a database effect and its record
commit together or not at all: no "started" state is ever visible.

The decision logic is written once as generators (the package's sans-I/O style, see
``_io``) and driven by four small drivers: sync/async x plain/transactional.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import datetime as dt
import decimal
import enum
import functools
import hashlib
import inspect
import itertools
import logging
import os
import socket
import threading
import time
import typing
import uuid
import weakref
from collections.abc import (
    AsyncIterator,
    Callable,
    Generator,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, cast, overload

import orjson
import psycopg
from langchain_core.callbacks import (
    AsyncCallbackManagerForToolRun,
    CallbackManagerForToolRun,
)
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.tools import BaseTool
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool
from pydantic import ConfigDict, PrivateAttr

from langgraph_durable import granularity
from langgraph_durable import telemetry as _telemetry
from langgraph_durable._io import (
    CONNECTION_RETRIES,
    AsyncDriver,
    Batch,
    Stmt,
    SyncDriver,
    _is_connection_failure,
    op_memo,
)
from langgraph_durable.errors import (
    CallInFlightError,
    ConfigurationError,
    IdempotencyConflictError,
    IdempotencyError,
    IdempotentCallFailedError,
    InvalidIdempotencyKeyError,
    LeaseLostError,
    NoLedgerError,
    OutcomeUnknownError,
    SerializationError,
    UnstableKeyError,
)
from langgraph_durable.pooler import session_schema
from langgraph_durable.saver import (
    _RUN_LEASE,
    AsyncDurablePostgresSaver,
    DurablePostgresSaver,
    _DurableBase,
)
from langgraph_durable.sql.schema import set_search_path

logger = logging.getLogger("langgraph_durable.idempotency")

F = TypeVar("F", bound=Callable[..., Any])
OnUnknown = Literal["raise", "retry"]

# Stripe's limit for an Idempotency-Key.
MAX_KEY_LENGTH = 255
# Parameters the wrapper fills in itself; callers never pass them.
CONN_PARAM = "conn"
KEY_PARAM = "idempotency_key"
_PREVIEW_CHARS = 500

# Configurable keys LangGraph sets on a task's config (langgraph._internal._constants).
_CHECKPOINTER = "__pregel_checkpointer"
_TASK_ID = "__pregel_task_id"
_READ = "__pregel_read"
_RUNTIME = "__pregel_runtime"
_DURABILITY = "__pregel_durability"

# --- SQL -------------------------------------------------------------------------------
# Kept beside the protocol that uses it (only this module and journal.py touch durable_ledger rows;
# delete_thread / prune reach them through sql.checkpoints.DELETE_THREAD_EXTRA_SQL).

# Claim a free key, or a key whose TTL ran out (an expired key= key counts as absent).
# RETURNING yields a row only when this statement claimed the key. A concurrent
# uncommitted claim of the same key makes this wait for that transaction (transactional
# mode relies on it; the lock_timeout bounds the wait).
CLAIM_SQL = """
INSERT INTO durable_ledger AS l (
    key, thread_id, origin_thread_id, checkpoint_ns, task_id, name, fingerprint,
    args_preview, status, owner, attempts, claim_expires_at, expires_at, created_at)
VALUES (
    %(key)s, %(thread_id)s, %(origin)s, %(ns)s, %(task_id)s, %(name)s, %(fp)s,
    %(preview)s, 'started', %(owner)s, 1,
    CASE WHEN %(claim_ttl)s::float8 IS NULL THEN NULL
         ELSE now() + make_interval(secs => %(claim_ttl)s::float8) END,
    CASE WHEN %(ttl)s::float8 IS NULL THEN NULL
         ELSE now() + make_interval(secs => %(ttl)s::float8) END,
    now())
ON CONFLICT (key) DO UPDATE SET
    thread_id = EXCLUDED.thread_id, origin_thread_id = EXCLUDED.origin_thread_id,
    checkpoint_ns = EXCLUDED.checkpoint_ns, task_id = EXCLUDED.task_id,
    name = EXCLUDED.name, fingerprint = EXCLUDED.fingerprint,
    args_preview = EXCLUDED.args_preview, status = 'started', owner = EXCLUDED.owner,
    attempts = 1, claim_expires_at = EXCLUDED.claim_expires_at,
    expires_at = EXCLUDED.expires_at, created_at = now(), completed_at = NULL,
    result_type = NULL, result = NULL, error_type = NULL, error = NULL
WHERE l.expires_at IS NOT NULL AND l.expires_at <= now()
RETURNING key
"""

_ROW_COLUMNS = """
    key, status, name, fingerprint, thread_id, origin_thread_id, checkpoint_ns, task_id,
    owner, attempts, result_type, result, error_type, error, args_preview,
    created_at, completed_at, expires_at,
    (status = 'started' AND claim_expires_at IS NOT NULL AND claim_expires_at > now()) AS live,
    (expires_at IS NOT NULL AND expires_at <= now()) AS expired
"""

# Concatenation of constants only (no value is ever formatted into SQL).
READ_SQL = "SELECT " + _ROW_COLUMNS + " FROM durable_ledger WHERE key = %s"  # noqa: S608

LIST_SQL = (
    "SELECT " + _ROW_COLUMNS + " FROM durable_ledger "  # noqa: S608
    "WHERE (%(thread_id)s::text IS NULL OR thread_id = %(thread_id)s OR origin_thread_id = %(thread_id)s) "
    "AND (%(status)s::text IS NULL OR status = %(status)s) "
    "ORDER BY created_at DESC, key LIMIT %(limit)s"
)

# on_unknown="retry": take over a dead claim. The owner check makes two takers race
# safely: the second one's UPDATE matches nothing once the first committed.
TAKEOVER_SQL = """
UPDATE durable_ledger SET owner = %(owner)s, attempts = attempts + 1,
    claim_expires_at = CASE WHEN %(claim_ttl)s::float8 IS NULL THEN NULL
                            ELSE now() + make_interval(secs => %(claim_ttl)s::float8) END
WHERE key = %(key)s AND status = 'started' AND owner IS NOT DISTINCT FROM %(old_owner)s
  AND (claim_expires_at IS NULL OR claim_expires_at <= now())
RETURNING attempts
"""

COMPLETE_SQL = """
UPDATE durable_ledger SET status = 'completed', result_type = %s, result = %s,
    completed_at = now(), claim_expires_at = NULL
WHERE key = %s AND owner = %s AND status = 'started'
RETURNING key
"""

FAIL_SQL = """
UPDATE durable_ledger SET status = 'failed', error_type = %s, error = %s,
    completed_at = now(), claim_expires_at = NULL
WHERE key = %s AND owner = %s AND status = 'started'
RETURNING key
"""

# An exception means "no effect" by the function's contract: drop the claim so the
# next attempt runs the function again.
RELEASE_SQL = "DELETE FROM durable_ledger WHERE key = %s AND owner = %s AND status = 'started'"

# Cancelled or interrupted mid-call: the effect may have happened. Expire the claim now
# so the next caller sees an unknown outcome at once instead of waiting for the lease.
ABANDON_SQL = """
UPDATE durable_ledger SET claim_expires_at = now()
WHERE key = %s AND owner = %s AND status = 'started'
"""

RENEW_SQL = """
UPDATE durable_ledger AS d
SET claim_expires_at = now() + make_interval(secs => c.ttl)
FROM unnest(%s::text[], %s::text[], %s::float8[]) AS c(key, owner, ttl)
WHERE d.key = c.key AND d.owner = c.owner AND d.status = 'started'
RETURNING d.key
"""

RESOLVE_SQL = """
UPDATE durable_ledger SET status = 'completed', result_type = %s, result = %s,
    error_type = NULL, error = NULL, completed_at = now(), claim_expires_at = NULL,
    owner = 'operator'
WHERE key = %s AND status <> 'completed'
  AND NOT (status = 'started' AND claim_expires_at IS NOT NULL AND claim_expires_at > now())
RETURNING key
"""

FORGET_SQL = """
DELETE FROM durable_ledger WHERE key = %s
  AND NOT (status = 'started' AND claim_expires_at IS NOT NULL AND claim_expires_at > now())
RETURNING key
"""

# Is the checkpoint a task was prepared from stored yet? (Checkpoint ids are uuid6, so
# the thread and the id are enough; the namespace differs for subgraphs.)
CHECKPOINT_STORED_SQL = """
SELECT EXISTS (SELECT 1 FROM checkpoints WHERE thread_id = %s AND checkpoint_id = %s) AS ok
"""
# While waiting for it: does the run still hold its lease? (delete_thread or a takeover
# fenced it: the checkpoint will never be stored, so stop at once, not after wait_timeout)
LEASE_HELD_SQL = """
SELECT EXISTS (SELECT 1 FROM durable_threads
               WHERE thread_id = %s AND lease_token = %s AND lease_owner = %s) AS held
"""

# A tool call recorded under the key scheme before task ids were part of tool keys
# (thread + tool_call_id only). It is the same call only if the same task made it: the
# row keeps the task id of its first claim (derived keys never expire, so CLAIM_SQL
# never overwrites it), and a later turn reusing the tool_call_id runs another task.
LEGACY_TOOL_KEY_SQL = """
SELECT key FROM durable_ledger WHERE key = %s AND thread_id IS NOT DISTINCT FROM %s AND task_id = %s
"""

PURGE_EXPIRED_SQL = """
DELETE FROM durable_ledger WHERE expires_at IS NOT NULL AND expires_at <= now()
  AND NOT (status = 'started' AND claim_expires_at IS NOT NULL AND claim_expires_at > now())
"""


# --- call sites -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Site:
    """Where a call happens inside a LangGraph run."""

    thread_id: str | None
    checkpoint_ns: str
    task_id: str
    checkpointer: Any
    anchor: Any  # an object that lives exactly as long as this execution of the task
    attempt: int
    checkpoint_id: str | None  # the checkpoint the task was prepared from
    durability: str


def _current_site() -> _Site | None:
    try:
        from langgraph.config import get_config

        config = get_config()
    except (RuntimeError, ImportError):
        return None
    conf = config.get("configurable") or {}
    task_id = conf.get(_TASK_ID)
    if not task_id:
        return None
    runtime = conf.get(_RUNTIME)
    info = getattr(runtime, "execution_info", None)
    thread_id = conf.get("thread_id")
    return _Site(
        thread_id=None if thread_id is None else str(thread_id),
        checkpoint_ns=str(conf.get("checkpoint_ns") or ""),
        task_id=str(task_id),
        checkpointer=conf.get(_CHECKPOINTER),
        anchor=conf.get(_READ),
        attempt=int(getattr(info, "node_attempt", 1) or 1),
        checkpoint_id=getattr(info, "checkpoint_id", None) or None,
        durability=str(conf.get(_DURABILITY) or "async"),
    )


@dataclass
class _TaskState:
    counters: dict[int, Callable[[], int]] = field(default_factory=dict)
    stored: bool = False  # the task's checkpoint is known to be in the database


# Per-execution task state. The anchor is the task's read function (a partial that
# LangGraph creates once per task per run and keeps through RetryPolicy retries); the
# node attempt number separates retries, so a retried task counts from 0 again and
# finds the calls its first attempt recorded. A new run (a resume) creates new anchors,
# so its indices also start at 0. Weak keys: a finished task's state goes with it.
_TASKS: weakref.WeakKeyDictionary[Any, _TaskState] = weakref.WeakKeyDictionary()
_TASKS_LOCK = threading.Lock()


def _task_state(site: _Site) -> _TaskState:
    with _TASKS_LOCK:
        try:
            state = _TASKS.get(site.anchor)
            if state is None:
                state = _TASKS[site.anchor] = _TaskState()
        except TypeError as exc:  # an anchor we cannot track: no stable index
            raise InvalidIdempotencyKeyError(
                None,
                "cannot derive a stable call index in this task (unknown runtime); pass key=",
            ) from exc
        return state


def _next_index(site: _Site, state: _TaskState) -> int:
    with _TASKS_LOCK:
        counter = state.counters.get(site.attempt)
        if counter is None:
            counter = state.counters[site.attempt] = itertools.count().__next__
        return counter()


@dataclass
class _Parent:
    """The idempotent call currently running: calls made inside it are keyed under it,
    so a replayed outer call (which does not run) shifts no index of later calls."""

    key: str
    thread_id: str | None
    origin: str | None
    ttl: float | None
    counter: Callable[[], int] = field(default_factory=lambda: itertools.count().__next__)
    # The keys of this call and of every call around it, all in flight: a nested call
    # with one of them would wait for its own ancestor (for ever on a transactional
    # ancestor's uncommitted claim), so it is refused at once.
    chain: frozenset[str] = frozenset()


_PARENT: contextvars.ContextVar[_Parent | None] = contextvars.ContextVar(
    "langgraph_durable_idempotent_parent", default=None
)
_TOOL_CALL_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "langgraph_durable_tool_call_id", default=None
)


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode("utf-8", "surrogatepass"))
        h.update(b"\x1f")
    return h.hexdigest()[:40]


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


# --- fingerprints ----------------------------------------------------------------------


def _canonical(value: Any, path: str, serde: Any) -> Any:
    """A JSON-able form that is equal for equal arguments, whatever the dict order."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value if abs(value) < 2**63 else {"$int": str(value)}
    if isinstance(value, float):
        return {"$f": repr(value)}
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$b": bytes(value).hex()}
    if isinstance(value, enum.Enum):
        return {"$e": type(value).__qualname__, "v": _canonical(value.value, path, serde)}
    if isinstance(value, dt.datetime | dt.date | dt.time | dt.timedelta | uuid.UUID | decimal.Decimal):
        return {"$" + type(value).__name__: str(value)}
    if isinstance(value, Mapping):
        items = [
            (_canonical(k, f"{path}[{k!r}]", serde), _canonical(v, f"{path}[{k!r}]", serde))
            for k, v in value.items()
        ]
        if all(isinstance(k, str) for k, _ in items):
            return {"$d": {k: v for k, v in items}}
        return {"$m": sorted(([k, v] for k, v in items), key=_dumps)}
    if isinstance(value, list | tuple):
        return [_canonical(v, f"{path}[{i}]", serde) for i, v in enumerate(value)]
    if isinstance(value, set | frozenset):
        return {"$s": sorted((_canonical(v, path, serde) for v in value), key=_dumps)}
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump) and not isinstance(value, type):  # pydantic v2 models
        return {"$p": type(value).__qualname__, "v": _canonical(model_dump(mode="json"), path, serde)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return {"$dc": type(value).__qualname__, "v": _canonical(fields, path, serde)}
    try:
        tag, data = serde.dumps_typed(value)
    except Exception as exc:
        raise SerializationError(
            f"argument {path} ({type(value).__qualname__}) has no canonical form to "
            "fingerprint; leave it out with exclude=[...] or derive the key with key=",
            value_type=type(value).__qualname__,
        ) from exc
    return {"$x": [tag, hashlib.sha256(data).hexdigest()]}


def _dumps(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def _fingerprint(name: str, args: Mapping[str, Any], serde: Any) -> tuple[str, str]:
    canon = {k: _canonical(v, k, serde) for k, v in args.items()}
    body = _dumps({"name": name, "args": canon})
    preview = _dumps(canon).decode()
    if len(preview) > _PREVIEW_CHARS:
        preview = preview[: _PREVIEW_CHARS - 3] + "..."
    return hashlib.sha256(body).hexdigest(), preview


# --- the decorator's configuration ------------------------------------------------------


@dataclass
class _Spec:
    fn: Callable[..., Any]
    name: str
    key: Callable[..., str] | None
    ttl: float | None
    on_unknown: OnUnknown
    cache_failures: tuple[type[BaseException], ...]
    transactional: bool
    wait_timeout: float
    claim_ttl: float | None
    exclude: frozenset[str]
    ledger: Any
    is_async: bool
    signature: inspect.Signature | None  # the full signature (None for tools)
    public: inspect.Signature | None  # without conn / idempotency_key
    takes_key: bool

    def caches(self, exc: BaseException) -> bool:
        return bool(self.cache_failures) and isinstance(exc, self.cache_failures)


def _seconds(value: float | dt.timedelta | None, what: str) -> float | None:
    if value is None:
        return None
    secs = value.total_seconds() if isinstance(value, dt.timedelta) else value
    if not isinstance(secs, int | float) or isinstance(secs, bool) or secs < 0:
        raise ConfigurationError(f"{what} must be a non-negative number of seconds, got {value!r}")
    return float(secs)


def _failures(value: bool | type[BaseException] | Sequence[type[BaseException]]) -> tuple[type[BaseException], ...]:
    if value is True:
        return (Exception,)
    if value is False or value is None:
        return ()
    if isinstance(value, type) and issubclass(value, BaseException):
        return (value,)
    if isinstance(value, Sequence) and all(
        isinstance(t, type) and issubclass(t, BaseException) for t in value
    ):
        return tuple(value)
    raise ConfigurationError(
        f"cache_failures must be a bool or exception types, got {value!r}"
    )


@overload
def idempotent(fn: F, /) -> F: ...


@overload
def idempotent(
    fn: None = None,
    /,
    *,
    key: Callable[..., str] | None = ...,
    name: str | None = ...,
    ttl: float | dt.timedelta | None = ...,
    on_unknown: OnUnknown = ...,
    cache_failures: bool | type[BaseException] | Sequence[type[BaseException]] = ...,
    transactional: bool = ...,
    wait_timeout: float | dt.timedelta = ...,
    claim_ttl: float | dt.timedelta | None = ...,
    exclude: Sequence[str] = ...,
    ledger: Any = ...,
) -> Callable[[F], F]: ...


def idempotent(
    fn: Any = None,
    /,
    *,
    key: Callable[..., str] | None = None,
    name: str | None = None,
    ttl: float | dt.timedelta | None = None,
    on_unknown: OnUnknown = "raise",
    cache_failures: bool | type[BaseException] | Sequence[type[BaseException]] = False,
    transactional: bool = False,
    wait_timeout: float | dt.timedelta = 60.0,
    claim_ttl: float | dt.timedelta | None = None,
    exclude: Sequence[str] = (),
    ledger: Any = None,
) -> Any:
    """Make a function (sync or async) or a LangChain tool run at most once per key.

    The key is, in order: ``key(*args, **kwargs)``, the model's ``tool_call_id`` within
    its task (wrapped tools called by ``ToolNode``), the enclosing idempotent call's key plus an
    index (nested calls), else a hash of (thread, checkpoint namespace, task id, index
    of the call within the task). See docs/idempotency.md for the full semantics.

    ``ledger``: a ``DurablePostgresSaver`` / ``AsyncDurablePostgresSaver`` (or a
    zero-argument callable returning one) used instead of the running graph's saver;
    required outside a durable run (else ``NoLedgerError``).
    """
    if on_unknown not in ("raise", "retry"):
        raise ConfigurationError(f"on_unknown must be 'raise' or 'retry', got {on_unknown!r}")
    if not isinstance(transactional, bool):
        raise ConfigurationError("transactional must be a bool")
    if key is not None and not callable(key):
        raise ConfigurationError("key must be a callable returning the key string")
    if ledger is not None and not isinstance(ledger, _DurableBase) and not callable(ledger):
        raise ConfigurationError(
            "ledger= must be a DurablePostgresSaver or AsyncDurablePostgresSaver (or a "
            f"callable returning one), got {type(ledger).__name__}"
        )
    wait = _seconds(wait_timeout, "wait_timeout")
    claim = _seconds(claim_ttl, "claim_ttl")
    if claim is not None and claim <= 0.5:
        raise ConfigurationError("claim_ttl must be above 0.5 s")
    options = {
        "key": key,
        "name": name,
        "ttl": _seconds(ttl, "ttl"),
        "on_unknown": on_unknown,
        "cache_failures": _failures(cache_failures),
        "transactional": transactional,
        "wait_timeout": wait if wait is not None else 60.0,
        "claim_ttl": claim,
        "exclude": frozenset(exclude),
        "ledger": ledger,
    }
    if isinstance(exclude, str):
        raise ConfigurationError("exclude must be a sequence of parameter names, not a str")

    def decorate(target: Any) -> Any:
        return _decorate(target, **options)

    if fn is None:
        return decorate
    return decorate(fn)


def _journal_runnable(target: Runnable[Any, Any], options: Mapping[str, Any]) -> Any:
    """``idempotent(model)``: a model call is recorded, not deduplicated as an effect,
    so it is ``journaled(model)`` (langgraph_durable.journal); the options that only
    make sense for effects are refused."""
    from langgraph_durable.journal import journaled

    effect_only: dict[str, Any] = {
        "key": None, "ttl": None, "on_unknown": "raise", "cache_failures": (),
        "transactional": False, "exclude": frozenset(), "wait_timeout": 60.0, "claim_ttl": None,
    }
    bad = sorted(k for k, default in effect_only.items() if options[k] != default)
    if bad:
        raise ConfigurationError(
            f"idempotent(<Runnable>) journals the runnable's calls (journaled()); "
            f"options {bad} apply to side effects only"
        )
    return journaled(target, name=options["name"], ledger=options["ledger"])


def _decorate(target: Any, **options: Any) -> Any:
    from langgraph.func import _TaskFunction

    if isinstance(target, _TaskFunction):
        raise ConfigurationError(
            "@idempotent must be applied below @task (@task above, @idempotent on the "
            "function): a @task call returns a future, not a result to record"
        )
    if isinstance(target, BaseTool):
        return _wrap_tool(target, **options)
    if isinstance(target, Runnable):
        return _journal_runnable(target, options)
    if not callable(target):
        raise ConfigurationError(f"@idempotent needs a function or a BaseTool, got {target!r}")
    fn = target
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"cannot read the signature of {fn!r}") from exc
    params = signature.parameters
    takes_key = KEY_PARAM in params
    for hidden in (CONN_PARAM, KEY_PARAM):
        p = params.get(hidden)
        if p is not None and p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ConfigurationError(f"parameter {hidden!r} of {fn!r} must accept a keyword")
    if options["transactional"] and CONN_PARAM not in params:
        raise ConfigurationError(
            f"transactional=True: {getattr(fn, '__qualname__', fn)!r} must declare a "
            f"'{CONN_PARAM}' parameter to receive the psycopg connection"
        )
    if options["ttl"] is not None and options["key"] is None:
        raise ConfigurationError(
            "ttl applies to keys from key= only: derived keys live exactly as long as "
            "their thread"
        )
    unknown = options["exclude"] - set(params)
    if unknown:
        raise ConfigurationError(f"exclude names unknown parameters: {sorted(unknown)}")
    hide = {CONN_PARAM} if options["transactional"] else set()
    if takes_key:
        hide.add(KEY_PARAM)
    public = signature.replace(parameters=[p for n, p in params.items() if n not in hide])
    spec = _Spec(
        fn=fn,
        name=options["name"] or getattr(fn, "__qualname__", None) or repr(fn),
        key=options["key"],
        ttl=options["ttl"],
        on_unknown=options["on_unknown"],
        cache_failures=options["cache_failures"],
        transactional=options["transactional"],
        wait_timeout=options["wait_timeout"],
        claim_ttl=options["claim_ttl"],
        exclude=options["exclude"],
        ledger=options["ledger"],
        is_async=inspect.iscoroutinefunction(fn),
        signature=signature,
        public=public,
        takes_key=takes_key,
    )

    if spec.is_async:

        @functools.wraps(fn)
        async def awrapper(*args: Any, **kwargs: Any) -> Any:
            call = _prepare(spec, args, kwargs)
            return await _arun(call)

        wrapper: Any = awrapper
    else:

        @functools.wraps(fn)
        def swrapper(*args: Any, **kwargs: Any) -> Any:
            call = _prepare(spec, args, kwargs)
            return _run(call)

        wrapper = swrapper
    # Tools built from the wrapper (@tool above @idempotent) must not see the
    # parameters the wrapper fills in.
    wrapper.__signature__ = public
    wrapper.__idempotent__ = spec
    return wrapper


# --- one call ---------------------------------------------------------------------------


@dataclass
class _Call:
    spec: _Spec
    ledger: _DurableBase
    key: str
    fingerprint: str
    preview: str
    thread_id: str | None  # binds the row to the thread (deleted with it)
    origin: str | None  # the thread the call happened in
    checkpoint_ns: str | None
    task_id: str | None
    ttl: float | None
    claim_ttl: float | None
    invoke: Callable[[Any], Any]  # conn (transactional) or None -> result / awaitable
    # (thread_id, checkpoint_id) that must be stored before the key is used, and the
    # task state that remembers it is.
    await_checkpoint: tuple[str, str] | None = None
    task_state: _TaskState | None = None
    # A tool call's key under the scheme before task ids (thread + tool_call_id): used
    # instead of ``key`` when this very task recorded the call under it (an upgrade
    # in the middle of a thread), see _adopt_legacy_key.
    legacy_key: str | None = None
    owner: str = field(default_factory=_owner)
    lost: bool = False

    @property
    def serde(self) -> Any:
        return self.ledger.serde

    def params(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "thread_id": self.thread_id,
            "origin": self.origin,
            "ns": self.checkpoint_ns,
            "task_id": self.task_id,
            "name": self.spec.name,
            "fp": self.fingerprint,
            "preview": self.preview,
            "owner": self.owner,
            "claim_ttl": None if self.spec.transactional else self.claim_ttl,
            "ttl": self.ttl,
        }


def _resolve_ledger(spec: _Spec, site: _Site | None) -> _DurableBase:
    explicit = spec.ledger
    if explicit is not None:
        ledger = explicit if isinstance(explicit, _DurableBase) else explicit()
        if not isinstance(ledger, _DurableBase):
            raise ConfigurationError(
                f"ledger= must be a DurablePostgresSaver or AsyncDurablePostgresSaver "
                f"(or a callable returning one), got {type(ledger).__name__}"
            )
        return ledger
    if site is not None and isinstance(site.checkpointer, _DurableBase):
        return site.checkpointer
    where = (
        f"the running graph's checkpointer is a {type(site.checkpointer).__name__}"
        if site is not None
        else "it was called outside a LangGraph run"
    )
    raise NoLedgerError(
        f"@idempotent {spec.name!r} has no ledger: {where}. Compile the graph with a "
        "DurablePostgresSaver / AsyncDurablePostgresSaver, or pass "
        "@idempotent(ledger=saver)."
    )


def _check_key(key: object) -> str:
    if not isinstance(key, str):
        raise InvalidIdempotencyKeyError(key, "must be a str")
    if not key:
        raise InvalidIdempotencyKeyError(key, "must not be empty")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidIdempotencyKeyError(key, f"longer than {MAX_KEY_LENGTH} characters")
    if "\x00" in key:
        raise InvalidIdempotencyKeyError(key, "contains a NUL character")
    return key


def _build_call(
    spec: _Spec,
    args_for_fp: Mapping[str, Any],
    key_args: tuple[tuple[Any, ...], dict[str, Any]],
    tool_call_id: str | None,
    invoke_factory: Callable[[str], Callable[[Any], Any]],
) -> _Call:
    site = _current_site()
    ledger = _resolve_ledger(spec, site)
    fingerprint, preview = _fingerprint(spec.name, args_for_fp, ledger.serde)
    await_checkpoint: tuple[str, str] | None = None
    state: _TaskState | None = None
    parent = _PARENT.get()
    origin = site.thread_id if site else (parent.origin if parent else None)
    ttl: float | None = None
    legacy_key: str | None = None
    if spec.key is not None:
        key = _check_key(spec.key(*key_args[0], **key_args[1]))
        thread_id = None  # the operation's own identity outlives the thread
        ttl = spec.ttl
    elif tool_call_id and site is not None:
        # Providers that number calls per message send `call_0` on every turn, so the
        # tool_call_id alone does not name a call: the task that runs the calling AI
        # message does. Its resumes and retries rebuild the same task id (a replay of
        # the same message dedups), a later turn is another task (the tool runs). The
        # message's own id is not needed, so messages without one are no special case.
        state, await_checkpoint = _stable_task(site, ledger)
        key = "tool:" + _digest(
            "tool-task", site.thread_id or "", site.checkpoint_ns, site.task_id, tool_call_id
        )
        legacy_key = "tool:" + _digest("tool", site.thread_id or "", tool_call_id)
        thread_id = site.thread_id
    elif tool_call_id:
        # Outside a task (a ToolCall invoked directly, ledger=): the caller owns the ids.
        key = "tool:" + _digest("tool", "", tool_call_id)
        thread_id = None
    elif parent is not None:
        key = "call:" + _digest("nested", parent.key, str(parent.counter()))
        thread_id, ttl = parent.thread_id, parent.ttl
    elif site is not None:
        state, await_checkpoint = _stable_task(site, ledger)
        index = _next_index(site, state)
        key = "call:" + _digest(
            "task", site.thread_id or "", site.checkpoint_ns, site.task_id, str(index)
        )
        thread_id = site.thread_id
    else:
        raise InvalidIdempotencyKeyError(
            None,
            f"{spec.name!r} was called outside a LangGraph task, so no key can be derived "
            "from where it runs; give it key= or pass idempotency_key=",
        )
    if parent is not None and key in parent.chain:
        raise InvalidIdempotencyKeyError(
            key,
            "is the key of an enclosing idempotent call that is still running; a nested "
            "call with it would wait for itself. Give the nested call its own key",
        )
    return _Call(
        spec=spec,
        ledger=ledger,
        key=key,
        fingerprint=fingerprint,
        preview=preview,
        thread_id=thread_id,
        origin=origin,
        checkpoint_ns=site.checkpoint_ns if site else None,
        task_id=site.task_id if site else None,
        ttl=ttl,
        claim_ttl=spec.claim_ttl if spec.claim_ttl is not None else ledger.lease_ttl,
        invoke=invoke_factory(key),
        await_checkpoint=await_checkpoint,
        task_state=state,
        legacy_key=legacy_key,
    )


def _stable_task(site: _Site, ledger: _DurableBase) -> tuple[_TaskState, tuple[str, str] | None]:
    """For a key derived from the task id: refuse a task id that a resume would not
    rebuild, and name the checkpoint that must be stored before the key is used."""
    if site.durability == "exit":
        raise UnstableKeyError(
            site.thread_id,
            site.checkpoint_id,
            "durability='exit' stores no checkpoint before the run ends, so a resumed "
            "task runs under new task ids; use durability 'async' or 'sync'",
        )
    state = _task_state(site)
    await_checkpoint = None
    if not state.stored and site.thread_id and site.checkpoint_id and _same_db(
        site.checkpointer, ledger
    ):
        await_checkpoint = (site.thread_id, site.checkpoint_id)
    return state, await_checkpoint


def _same_db(checkpointer: Any, ledger: _DurableBase) -> bool:
    """Whether the graph's checkpoints live where the ledger can see them."""
    if not isinstance(checkpointer, _DurableBase):
        return False
    if checkpointer is ledger:
        return True
    mine, theirs = cast(Any, ledger), cast(Any, checkpointer)
    return bool(
        getattr(mine, "_conninfo", None) == getattr(theirs, "_conninfo", None)
        and mine.schema == theirs.schema
    )


def _prepare(spec: _Spec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Call:
    assert spec.signature is not None and spec.public is not None
    # Bind first: a wrong call is a TypeError before anything is written or counted.
    bound = spec.public.bind(*args, **kwargs)
    full = spec.public.bind(*args, **kwargs)
    full.apply_defaults()
    for_fp = {
        n: v
        for i, (n, v) in enumerate(full.arguments.items())
        if n not in spec.exclude and not (i == 0 and n in ("self", "cls"))
    }
    signature = spec.signature

    def invoke_factory(key: str) -> Callable[[Any], Any]:
        def invoke(conn: Any) -> Any:
            arguments = dict(bound.arguments)
            if spec.takes_key:
                arguments[KEY_PARAM] = key
            if spec.transactional:
                arguments[CONN_PARAM] = conn
            call_args = inspect.BoundArguments(signature, arguments)
            return spec.fn(*call_args.args, **call_args.kwargs)

        return invoke

    return _build_call(spec, for_fp, (args, kwargs), None, invoke_factory)


# --- the protocol -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Op:
    """Run one ledger op (a generator of Batches) in its own transaction."""

    factory: Callable[[], Generator[Any, Any, Any]]


@dataclass(frozen=True)
class _Wait:
    seconds: float


@dataclass(frozen=True)
class _Invoke:
    """Run the user's function; the driver sends back its result or throws its error."""


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
        [Stmt(CLAIM_SQL, call.params(), fetch=True), Stmt(READ_SQL, (call.key,), fetch=True)]
    )
    row = rows[1][0] if rows[1] else None
    # A 'started' row under this call's own owner (unique per call) is this very claim:
    # it committed, the reply to the COMMIT was lost and the driver ran the op again.
    # The function has not run yet: proceed, not "in flight" / "outcome unknown".
    mine = row is not None and row["status"] == "started" and row["owner"] == call.owner
    return bool(rows[0]) or mine, row


def _op_one(sql: str, params: Any) -> Generator[Any, Any, list[dict[str, Any]]]:
    rows = yield Batch([Stmt(sql, params, fetch=True)])
    return cast("list[dict[str, Any]]", rows[0])


def _op_exec(sql: str, params: Any) -> Generator[Any, Any, None]:
    yield Batch([Stmt(sql, params)])


def _decode(call: _Call, row: Mapping[str, Any]) -> Any:
    try:
        return call.serde.loads_typed((row["result_type"], bytes(row["result"] or b"")))
    except Exception as exc:
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


@_telemetry.instrument("ledger_judge")
def _judge(call: _Call, row: Mapping[str, Any]) -> str:
    """What to do with someone else's row: 'replay', 'wait' or 'takeover' (raises the
    terminal outcomes)."""
    if row["fingerprint"] != call.fingerprint:
        raise IdempotencyConflictError(call.key, row["fingerprint"], call.fingerprint)
    if row["status"] == "completed":
        return "replay"
    if row["status"] == "failed":
        raise IdempotentCallFailedError(call.key, row["error_type"], row["error"])
    if row["live"]:
        return "wait"
    if call.spec.on_unknown == "retry":
        return "takeover"
    raise OutcomeUnknownError(
        call.key,
        row["thread_id"] or row["origin_thread_id"],
        row["name"],
        int(row["attempts"] or 1),
    )


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
        rows = yield _Op(functools.partial(_op_one, CHECKPOINT_STORED_SQL, call.await_checkpoint))
        if rows and rows[0]["ok"]:
            if call.task_state is not None:
                call.task_state.stored = True
            return
        lease = _RUN_LEASE.get()
        if lease is not None and lease.thread_id == call.await_checkpoint[0]:
            held = yield _Op(
                functools.partial(_op_one, LEASE_HELD_SQL, (lease.thread_id, lease.token, lease.owner))
            )
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
        yield _Wait(delay)
        delay = min(delay * 2, 0.2)


def _adopt_legacy_key(call: _Call) -> Generator[Any, Any, None]:
    """Keep replaying a tool call that this task recorded before the upgrade.

    Tool keys used to be (thread, tool_call_id). A thread in flight across the upgrade
    may have run the tool under that key in the task that is now resumed; claiming the
    new key would run it a second time. The old row counts only if the same task made
    it (a later turn reusing ``call_0`` is another task, so it runs). Costs one indexed
    read per tool call; rows under the old scheme are never created any more."""
    if call.legacy_key is None or call.task_id is None:
        return
    rows = yield _Op(
        functools.partial(_op_one, LEGACY_TOOL_KEY_SQL, (call.legacy_key, call.thread_id, call.task_id))
    )
    if rows:
        # Only the key changes: a tool's invoke ignores the key it was built with, and
        # calls nested in it are keyed from call.key when it runs (_enter).
        call.key = call.legacy_key


def _protocol(call: _Call) -> Generator[Any, Any, Any]:
    """The plain (non-transactional) call: claim, run, record."""
    yield from _await_checkpoint(call)
    started = time.monotonic()
    delay = 0.02
    logged = False
    while True:
        claimed, row = yield _Op(lambda: _op_claim(call))
        if claimed:
            break
        if row is None:  # released between our two statements: claim again
            continue
        action = _judge(call, row)
        if action == "replay":
            return _decode(call, row)
        if action == "takeover":
            takeover = {
                "owner": call.owner,
                "claim_ttl": call.claim_ttl,
                "key": call.key,
                "old_owner": row["owner"],
            }
            taken = yield _Op(functools.partial(_op_one, TAKEOVER_SQL, takeover))
            if taken:
                logger.warning(
                    "re-running %s (idempotency key %r, attempt %s) after an unknown outcome "
                    "(on_unknown='retry')", call.spec.name, call.key, taken[0]["attempts"],
                )
                break
            continue
        waited = time.monotonic() - started
        if waited >= call.spec.wait_timeout:
            raise CallInFlightError(call.key, waited)
        if not logged:
            logged = True
            logger.debug("call %s (key %r) is in flight elsewhere; waiting", call.spec.name, call.key)
        yield _Wait(min(delay, max(call.spec.wait_timeout - waited, 0.001)))
        delay = min(delay * 2, 0.5)
    try:
        result = yield _Invoke()
    except BaseException as exc:
        mine = (call.key, call.owner)
        if isinstance(exc, Exception) and not _is_bubble(exc) and call.spec.caches(exc):
            failed = (type(exc).__qualname__, f"{exc}"[:4000], *mine)
            yield _Op(functools.partial(_op_exec, FAIL_SQL, failed))
        elif isinstance(exc, Exception):
            # An exception (or an interrupt) means the call did not happen: run it again
            # next time.
            yield _Op(functools.partial(_op_exec, RELEASE_SQL, mine))
        else:  # cancelled / interrupted mid-call: the effect may have happened
            with contextlib.suppress(Exception):
                yield _Op(functools.partial(_op_exec, ABANDON_SQL, mine))
        raise exc
    try:
        tag, data, value = _encode(call, result)
    except SerializationError as err:
        failed = ("SerializationError", err.message[:4000], call.key, call.owner)
        yield _Op(functools.partial(_op_exec, FAIL_SQL, failed))
        raise
    done = yield _Op(functools.partial(_op_one, COMPLETE_SQL, (tag, data, call.key, call.owner)))
    if not done:
        # Completed by this call already (a retry after a lost COMMIT reply), or taken over.
        done = yield _Op(functools.partial(_op_one, READ_SQL, (call.key,)))
        done = [r for r in done if r["owner"] == call.owner and r["status"] == "completed"]
    if not done:
        logger.error(
            "the claim on idempotency key %r was taken over while %s ran (its claim lease "
            "expired: was the process stalled?); its result is not recorded",
            call.key, call.spec.name,
        )
    return value


def _tx_protocol(call: _Call) -> Generator[Any, Any, _Outcome]:
    """The transactional call: everything in one transaction on the driver's
    connection; statements are yielded as Batches, the function as _Invoke."""
    timeout_ms = max(int(call.spec.wait_timeout * 1000), 1)
    rows = yield Batch(
        [
            Stmt("SELECT current_setting('lock_timeout') AS v", fetch=True),
            Stmt("SELECT set_config('lock_timeout', %s, true)", (f"{timeout_ms}ms",)),
            Stmt(CLAIM_SQL, call.params(), fetch=True),
            Stmt(READ_SQL, (call.key,), fetch=True),
        ]
    )
    previous = rows[0][0]["v"]
    claimed = bool(rows[2])
    if not claimed:
        row = rows[3][0] if rows[3] else None
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
        taken = yield Batch(
            [
                Stmt(
                    TAKEOVER_SQL,
                    {"owner": call.owner, "claim_ttl": None, "key": call.key, "old_owner": row["owner"]},
                    fetch=True,
                )
            ]
        )
        if not taken[0]:
            return _Outcome(error=CallInFlightError(call.key, 0.0))
    yield Batch([Stmt("SELECT set_config('lock_timeout', %s, true)", (previous,))])
    try:
        result = yield _Invoke()
    except Exception as exc:
        # The driver rolled the function's savepoint back: its writes are gone.
        if call.spec.caches(exc) and not _is_bubble(exc):
            yield Batch([Stmt(FAIL_SQL, (type(exc).__qualname__, f"{exc}"[:4000], call.key, call.owner))])
        else:
            yield Batch([Stmt(RELEASE_SQL, (call.key, call.owner))])
        return _Outcome(error=exc)
    # An unserializable result raises here, inside the transaction: the effect and the
    # claim roll back together, nothing is half-written.
    tag, data, value = _encode(call, result)
    yield Batch([Stmt(COMPLETE_SQL, (tag, data, call.key, call.owner), fetch=True)])
    return _Outcome(value=value)


# --- drivers ----------------------------------------------------------------------------


@_telemetry.instrument("ledger_run")
def _enter(call: _Call) -> contextvars.Token[_Parent | None]:
    outer = _PARENT.get()
    chain = (outer.chain if outer is not None else frozenset()) | {call.key}
    return _PARENT.set(_Parent(call.key, call.thread_id, call.origin, call.ttl, chain=chain))


@_telemetry.instrument("idempotent")
def _run(call: _Call) -> Any:
    # A deferred checkpoint (checkpoint_policy) is stored before the key is claimed.
    granularity.before_effect()
    if call.legacy_key is not None:
        _drive(call, _adopt_legacy_key(call))
    if call.spec.transactional:
        _drive(call, _await_checkpoint(call))
        return _run_tx(call)
    return _drive(call, _protocol(call))


def _drive(call: _Call, gen: Generator[Any, Any, Any]) -> Any:
    send: Any = None
    throw: BaseException | None = None
    while True:
        try:
            cmd = gen.throw(throw) if throw is not None else gen.send(send)
        except StopIteration as stop:
            return stop.value
        send, throw = None, None
        try:
            if isinstance(cmd, _Op):
                send = call.ledger.run_op(cmd.factory)
            elif isinstance(cmd, _Wait):
                time.sleep(cmd.seconds)
            else:
                _RENEWER.add(call)
                token = _enter(call)
                try:
                    send = call.invoke(None)
                finally:
                    _PARENT.reset(token)
                    _RENEWER.remove(call)
        except BaseException as exc:
            throw = exc


@_telemetry.instrument("idempotent")
async def _arun(call: _Call) -> Any:
    await granularity.abefore_effect()
    if call.legacy_key is not None:
        await _adrive(call, _adopt_legacy_key(call))
    if call.spec.transactional:
        await _adrive(call, _await_checkpoint(call))
        return await _arun_tx(call)
    return await _adrive(call, _protocol(call))


async def _adrive(call: _Call, gen: Generator[Any, Any, Any]) -> Any:
    send: Any = None
    throw: BaseException | None = None
    while True:
        try:
            cmd = gen.throw(throw) if throw is not None else gen.send(send)
        except StopIteration as stop:
            return stop.value
        send, throw = None, None
        try:
            if isinstance(cmd, _Op):
                send = await call.ledger.arun_op(cmd.factory)
            elif isinstance(cmd, _Wait):
                await asyncio.sleep(cmd.seconds)
            else:
                _RENEWER.add(call)
                token = _enter(call)
                try:
                    send = await call.invoke(None)
                finally:
                    _PARENT.reset(token)
                    _RENEWER.remove(call)
        except BaseException as exc:
            throw = exc


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


@contextlib.contextmanager
def _sync_connection(ledger: _DurableBase) -> Iterator[psycopg.Connection[Any]]:
    if isinstance(ledger, DurablePostgresSaver) and _pooled(ledger, ConnectionPool):
        with ledger.connection() as conn:
            yield conn
        return
    # A single-connection saver (see _pooled), or an async saver, whose connections
    # cannot serve a sync function: open one like them.
    conn = psycopg.Connection.connect(
        cast(Any, ledger)._conninfo,
        autocommit=True,
        prepare_threshold=_prepare_threshold(ledger),
        row_factory=dict_row,
    )
    try:
        if schema := session_schema(ledger):
            conn.execute(set_search_path(schema))
        yield conn
    finally:
        conn.close()


@contextlib.asynccontextmanager
async def _async_connection(ledger: _DurableBase) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    if isinstance(ledger, AsyncDurablePostgresSaver) and _pooled(ledger, AsyncConnectionPool):
        async with ledger.connection() as conn:
            yield conn
        return
    conn = await psycopg.AsyncConnection.connect(
        cast(Any, ledger)._conninfo,
        autocommit=True,
        prepare_threshold=_prepare_threshold(ledger),
        row_factory=dict_row,
    )
    try:
        if schema := session_schema(ledger):
            await conn.execute(set_search_path(schema))
        yield conn
    finally:
        await conn.close()


def _run_tx(call: _Call) -> Any:
    """``_run_tx_once``, again on a fresh connection when the connection itself failed
    (a failover, a restart, an idle kill). Always safe: the claim, the function's writes
    and the record are one transaction, so a failure before COMMIT left nothing, and a
    COMMIT whose reply was lost left a completed claim that the retry replays."""
    for attempt in range(CONNECTION_RETRIES + 1):
        used: list[Any] = []
        try:
            return _run_tx_once(call, used)
        except Exception as exc:
            if attempt < CONNECTION_RETRIES and _is_connection_failure(exc, used[-1] if used else None):
                logger.warning("idempotent call %s: connection lost (%s); retrying", call.key, exc)
                pool = getattr(call.ledger, "conn", None)
                if isinstance(pool, ConnectionPool):
                    with contextlib.suppress(Exception):
                        pool.check()
                time.sleep(min(0.2 * 2**attempt, 2.0))
                continue
            raise
    raise AssertionError("unreachable")


@contextlib.contextmanager
def _tracked(cm: Any, used: list[Any]) -> Iterator[Any]:
    """``cm``'s connection, remembered in ``used`` (is it broken, after an error?)."""
    with cm as conn:
        used.append(conn)
        yield conn


@contextlib.asynccontextmanager
async def _atracked(cm: Any, used: list[Any]) -> AsyncIterator[Any]:
    async with cm as conn:
        used.append(conn)
        yield conn


def _run_tx_once(call: _Call, used: list[Any]) -> Any:
    started = time.monotonic()
    try:
        with _tracked(_sync_connection(call.ledger), used) as conn, conn.transaction():
            gen = _tx_protocol(call)
            send: Any = None
            throw: BaseException | None = None
            while True:
                try:
                    cmd = gen.throw(throw) if throw is not None else gen.send(send)
                except StopIteration as stop:
                    outcome = cast(_Outcome, stop.value)
                    break
                send, throw = None, None
                if isinstance(cmd, Batch):
                    send = SyncDriver._execute(conn, cmd)
                    continue
                token = _enter(call)
                try:
                    # A savepoint: a failing function's writes roll back, the claim stays.
                    with conn.transaction():
                        send = call.invoke(conn)
                except Exception as exc:
                    throw = exc
                finally:
                    _PARENT.reset(token)
    except psycopg.errors.LockNotAvailable as exc:
        raise CallInFlightError(call.key, time.monotonic() - started) from exc
    return outcome.unwrap()


async def _arun_tx(call: _Call) -> Any:
    """``_run_tx`` for async functions."""
    for attempt in range(CONNECTION_RETRIES + 1):
        used: list[Any] = []
        try:
            return await _arun_tx_once(call, used)
        except Exception as exc:
            if attempt < CONNECTION_RETRIES and _is_connection_failure(exc, used[-1] if used else None):
                logger.warning("idempotent call %s: connection lost (%s); retrying", call.key, exc)
                pool = getattr(call.ledger, "conn", None)
                if isinstance(pool, AsyncConnectionPool):
                    with contextlib.suppress(Exception):
                        await pool.check()
                await asyncio.sleep(min(0.2 * 2**attempt, 2.0))
                continue
            raise
    raise AssertionError("unreachable")


async def _arun_tx_once(call: _Call, used: list[Any]) -> Any:
    started = time.monotonic()
    try:
        async with _atracked(_async_connection(call.ledger), used) as conn, conn.transaction():
            gen = _tx_protocol(call)
            send: Any = None
            throw: BaseException | None = None
            while True:
                try:
                    cmd = gen.throw(throw) if throw is not None else gen.send(send)
                except StopIteration as stop:
                    outcome = cast(_Outcome, stop.value)
                    break
                send, throw = None, None
                if isinstance(cmd, Batch):
                    send = await AsyncDriver._execute(conn, cmd)
                    continue
                token = _enter(call)
                try:
                    async with conn.transaction():
                        send = await call.invoke(conn)
                except Exception as exc:
                    throw = exc
                finally:
                    _PARENT.reset(token)
    except psycopg.errors.LockNotAvailable as exc:
        raise CallInFlightError(call.key, time.monotonic() - started) from exc
    return outcome.unwrap()


# --- claim renewal ----------------------------------------------------------------------


class _ClaimRenewer:
    """Keeps this process's in-flight claims alive: every claim_ttl/3, one UPDATE per
    ledger on a dedicated connection (so a busy pool or a blocked event loop cannot
    starve it, like the saver's lease renewer). A claim that stops being renewed --
    the process died -- expires, and the next caller sees an unknown outcome."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: dict[int, _Call] = {}
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None
        self.interval = 1.0
        self.conns: dict[int, tuple[weakref.ref[Any], psycopg.Connection[Any]]] = {}

    def add(self, call: _Call) -> None:
        with self.lock:
            self.calls[id(call)] = call
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(
                    target=self._loop, name="langgraph-durable-claim-renewer", daemon=True
                )
                self.thread.start()
            # Wake the loop only when this claim needs renewing sooner than planned.
            sooner = (call.claim_ttl or 30.0) / 3 < self.interval
        if sooner:
            self.wake.set()

    def remove(self, call: _Call) -> None:
        with self.lock:
            self.calls.pop(id(call), None)

    def _loop(self) -> None:
        idle = 0.0
        while True:
            with self.lock:
                calls = list(self.calls.values())
                interval = min((c.claim_ttl or 30.0) for c in calls) / 3 if calls else 1.0
                self.interval = interval
                self.wake.clear()
            self.wake.wait(interval)
            with self.lock:
                calls = list(self.calls.values())
                if not calls:
                    idle += interval
                    if idle > 30:
                        self.thread = None
                        self._close_all()
                        return
                    continue
            idle = 0.0
            by_ledger: dict[int, list[_Call]] = {}
            for c in calls:
                by_ledger.setdefault(id(c.ledger), []).append(c)
            for group in by_ledger.values():
                try:
                    self._renew(group)
                except Exception as exc:
                    logger.warning("claim renewal failed: %s", exc)
                    self._close(id(group[0].ledger))

    def _connection(self, ledger: _DurableBase) -> psycopg.Connection[Any]:
        entry = self.conns.get(id(ledger))
        if entry is not None and entry[0]() is ledger and not entry[1].closed:
            return entry[1]
        conn = ledger._renew_connect()
        conn.autocommit = True
        if schema := session_schema(ledger):
            conn.execute(set_search_path(schema))
        self.conns[id(ledger)] = (weakref.ref(ledger), conn)
        return conn

    def _renew(self, group: list[_Call]) -> None:
        conn = self._connection(group[0].ledger)
        rows = conn.execute(
            RENEW_SQL,
            ([c.key for c in group], [c.owner for c in group], [c.claim_ttl or 30.0 for c in group]),
        ).fetchall()
        renewed = {r[0] if isinstance(r, tuple) else r["key"] for r in rows}
        for c in group:
            if c.key not in renewed and not c.lost:
                with self.lock:
                    still = id(c) in self.calls
                if still:
                    c.lost = True
                    logger.error("claim on idempotency key %r was lost (taken over)", c.key)

    def _close(self, ledger_id: int) -> None:
        entry = self.conns.pop(ledger_id, None)
        if entry is not None:
            with contextlib.suppress(Exception):
                entry[1].close()

    def _close_all(self) -> None:
        for ledger_id in list(self.conns):
            self._close(ledger_id)


_RENEWER = _ClaimRenewer()


# --- tools ------------------------------------------------------------------------------


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _config_param(fn: Callable[..., Any]) -> str | None:
    """The parameter annotated RunnableConfig, like langchain_core finds it."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        return None
    for pname, hint in hints.items():
        if hint is RunnableConfig:
            return pname
    return None


class IdempotentTool(BaseTool):
    """A LangChain tool whose calls go through the ledger. ``ToolNode`` sees the same
    name, description and argument schema as the wrapped tool; a tool call's key is
    derived from the thread, the task running the calling AI message and the model's
    ``tool_call_id`` (providers reuse ``call_0`` on every turn)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    tool: BaseTool
    _spec: _Spec = PrivateAttr()

    def run(self, tool_input: Any, *args: Any, **kwargs: Any) -> Any:
        token = _TOOL_CALL_ID.set(kwargs.get("tool_call_id"))
        try:
            return super().run(tool_input, *args, **kwargs)
        finally:
            _TOOL_CALL_ID.reset(token)

    async def arun(self, tool_input: Any, *args: Any, **kwargs: Any) -> Any:
        token = _TOOL_CALL_ID.set(kwargs.get("tool_call_id"))
        try:
            return await super().arun(tool_input, *args, **kwargs)
        finally:
            _TOOL_CALL_ID.reset(token)

    def _prepare_tool(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], invoke: Callable[[], Any]
    ) -> _Call:
        spec = self._spec
        for_fp: dict[str, Any] = {f"${i}": a for i, a in enumerate(args)}
        for k, v in self._filter_injected_args(dict(kwargs)).items():
            if k not in spec.exclude:
                for_fp[k] = v
        return _build_call(
            spec, for_fp, (args, kwargs), _TOOL_CALL_ID.get(), lambda key: lambda _conn: invoke()
        )

    def _restore(self, value: Any) -> Any:
        # msgpack turns the (content, artifact) tuple into a list.
        if self.tool.response_format == "content_and_artifact" and isinstance(value, list) and len(value) == 2:
            return tuple(value)
        return value

    def _run(
        self,
        *args: Any,
        config: RunnableConfig,
        run_manager: CallbackManagerForToolRun | None = None,
        **kwargs: Any,
    ) -> Any:
        inner = self.tool
        extra: dict[str, Any] = {}
        if _accepts(inner._run, "run_manager"):
            extra["run_manager"] = run_manager
        if cp := _config_param(inner._run):
            extra[cp] = config

        def invoke() -> Any:
            token = _TOOL_CALL_ID.set(None)
            try:
                return inner._run(*args, **kwargs, **extra)
            finally:
                _TOOL_CALL_ID.reset(token)

        call = self._prepare_tool(args, kwargs, invoke)
        return self._restore(_run(call))

    async def _arun(
        self,
        *args: Any,
        config: RunnableConfig,
        run_manager: AsyncCallbackManagerForToolRun | None = None,
        **kwargs: Any,
    ) -> Any:
        inner = self.tool
        extra: dict[str, Any] = {}
        if _accepts(inner._arun, "run_manager"):
            extra["run_manager"] = run_manager
        if cp := _config_param(inner._arun):
            extra[cp] = config

        async def invoke() -> Any:
            token = _TOOL_CALL_ID.set(None)
            try:
                return await inner._arun(*args, **kwargs, **extra)
            finally:
                _TOOL_CALL_ID.reset(token)

        call = self._prepare_tool(args, kwargs, invoke)
        return self._restore(await _arun(call))


def _wrap_tool(tool: BaseTool, **options: Any) -> IdempotentTool:
    if options["transactional"]:
        raise ConfigurationError(
            "transactional=True is for functions (they receive the connection); wrap the "
            "function, then build the tool from it"
        )
    if options["ttl"] is not None and options["key"] is None:
        raise ConfigurationError("ttl applies to explicit keys only (key=)")
    spec = _Spec(
        fn=tool._run,
        name=options["name"] or tool.name,
        key=options["key"],
        ttl=options["ttl"],
        on_unknown=options["on_unknown"],
        cache_failures=options["cache_failures"],
        transactional=False,
        wait_timeout=options["wait_timeout"],
        claim_ttl=options["claim_ttl"],
        exclude=options["exclude"],
        ledger=options["ledger"],
        is_async=False,
        signature=None,
        public=None,
        takes_key=False,
    )
    wrapped = IdempotentTool(
        tool=tool,
        name=tool.name,
        description=tool.description,
        args_schema=tool.args_schema,
        return_direct=tool.return_direct,
        response_format=tool.response_format,
        tags=tool.tags,
        metadata=tool.metadata,
        handle_tool_error=tool.handle_tool_error,
        handle_validation_error=tool.handle_validation_error,
        extras=getattr(tool, "extras", None),
    )
    wrapped._spec = spec
    return wrapped


# --- operators --------------------------------------------------------------------------


@dataclass(frozen=True)
class LedgerEntry:
    """One recorded call, as an operator sees it."""

    key: str
    status: str  # started | completed | failed
    name: str | None
    thread_id: str | None
    origin_thread_id: str | None
    task_id: str | None
    attempts: int
    in_flight: bool  # started, and its claim is still renewed by a live process
    outcome_unknown: bool  # started, claim expired: the process died mid-call
    error_type: str | None
    error: str | None
    args_preview: str | None
    fingerprint: str
    created_at: dt.datetime | None
    completed_at: dt.datetime | None
    expires_at: dt.datetime | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> LedgerEntry:
        started = row["status"] == "started"
        return cls(
            key=row["key"],
            status=row["status"],
            name=row["name"],
            thread_id=row["thread_id"],
            origin_thread_id=row["origin_thread_id"],
            task_id=row["task_id"],
            attempts=int(row["attempts"] or 1),
            in_flight=bool(started and row["live"]),
            outcome_unknown=bool(started and not row["live"]),
            error_type=row["error_type"],
            error=row["error"],
            args_preview=row["args_preview"],
            fingerprint=row["fingerprint"],
            created_at=row["created_at"],
            completed_at=row["completed_at"],
            expires_at=row["expires_at"],
        )


class Ledger:
    """Inspect and repair the idempotency ledger of a durable saver.

    ``resolve`` and ``forget`` are the operator's answers to an ``OutcomeUnknownError``:
    the effect happened (record its result; the call is never run again) or it did not
    (drop the key; the next call runs the function). Both refuse a call in flight.
    Sync methods use the saver's sync path, ``a*`` methods its async path.
    """

    def __init__(self, saver: _DurableBase) -> None:
        if not isinstance(saver, _DurableBase):
            raise ConfigurationError(
                "Ledger needs a DurablePostgresSaver or AsyncDurablePostgresSaver, got "
                f"{type(saver).__name__}"
            )
        self.saver = saver

    # ops (one definition each; the sync and async methods only pick the runner)
    def _op_get(self, key: str) -> Generator[Any, Any, LedgerEntry | None]:
        rows = yield from _op_one(READ_SQL, (key,))
        return LedgerEntry.from_row(rows[0]) if rows else None

    def _op_entries(
        self, thread_id: str | None, status: str | None, limit: int
    ) -> Generator[Any, Any, list[LedgerEntry]]:
        rows = yield from _op_one(
            LIST_SQL, {"thread_id": thread_id, "status": status, "limit": int(limit)}
        )
        return [LedgerEntry.from_row(r) for r in rows]

    def _op_result(self, key: str) -> Generator[Any, Any, Any]:
        rows = yield from _op_one(READ_SQL, (key,))
        if not rows or rows[0]["status"] != "completed":
            raise IdempotencyError(f"idempotency key {key!r} has no recorded result", key=key)
        row = rows[0]
        try:
            return self.saver.serde.loads_typed((row["result_type"], bytes(row["result"] or b"")))
        except Exception as exc:
            raise SerializationError(
                f"the recorded result of idempotency key {key!r} cannot be decoded: {exc}",
                value_type=str(row["result_type"]),
                key=key,
            ) from exc

    def _encode_result(self, key: str, result: Any) -> tuple[str, bytes]:
        try:
            tag, data = self.saver.serde.dumps_typed(result)
        except Exception as exc:
            raise SerializationError(
                f"result for idempotency key {key!r} cannot be serialized: {exc}",
                value_type=type(result).__qualname__,
                key=key,
            ) from exc
        return tag, data

    def _op_change(self, sql: str, key: str, params: tuple[Any, ...]) -> Generator[Any, Any, None]:
        memo = op_memo()
        rows = yield Batch([Stmt(sql, params, fetch=True), Stmt(READ_SQL, (key,), fetch=True)])
        if rows[0]:
            memo["changed"] = True
            return
        current = rows[1][0] if rows[1] else None
        if memo.get("changed") and current is not None and current["status"] == "completed":
            return  # this very change, committed; the driver retried after a lost reply
        if current is None:
            raise IdempotencyError(f"idempotency key {key!r} is not in the ledger", key=key)
        if current["status"] == "started" and current["live"]:
            raise CallInFlightError(key, 0.0)
        raise IdempotencyError(
            f"idempotency key {key!r} is already {current['status']}", key=key
        )

    def _op_forget(self, key: str) -> Generator[Any, Any, bool]:
        memo = op_memo()
        rows = yield Batch([Stmt(FORGET_SQL, (key,), fetch=True), Stmt(READ_SQL, (key,), fetch=True)])
        if rows[0]:
            memo["forgot"] = True
            return True
        if rows[1]:
            raise CallInFlightError(key, 0.0)
        return bool(memo.get("forgot"))  # True: this forget committed, its reply was lost

    def _op_purge(self) -> Generator[Any, Any, int]:
        rows = yield Batch([Stmt(PURGE_EXPIRED_SQL + " RETURNING key", None, fetch=True)])
        return len(rows[0])

    # sync
    def get(self, key: str) -> LedgerEntry | None:
        return cast("LedgerEntry | None", self.saver.run_op(lambda: self._op_get(key)))

    def entries(
        self, *, thread_id: str | None = None, status: str | None = None, limit: int = 100
    ) -> list[LedgerEntry]:
        return cast(
            "list[LedgerEntry]", self.saver.run_op(lambda: self._op_entries(thread_id, status, limit))
        )

    def result(self, key: str) -> Any:
        return self.saver.run_op(lambda: self._op_result(key))

    def resolve(self, key: str, result: Any) -> None:
        """The effect happened: record ``result`` as the call's outcome."""
        tag, data = self._encode_result(key, result)
        self.saver.run_op(lambda: self._op_change(RESOLVE_SQL, key, (tag, data, key)))

    def forget(self, key: str) -> bool:
        """The effect did not happen (or should happen again): drop the key."""
        return cast(bool, self.saver.run_op(lambda: self._op_forget(key)))

    def purge_expired(self) -> int:
        """Delete keys whose TTL ran out; returns how many."""
        return cast(int, self.saver.run_op(self._op_purge))

    # async
    async def aget(self, key: str) -> LedgerEntry | None:
        return cast("LedgerEntry | None", await self.saver.arun_op(lambda: self._op_get(key)))

    async def aentries(
        self, *, thread_id: str | None = None, status: str | None = None, limit: int = 100
    ) -> list[LedgerEntry]:
        return cast(
            "list[LedgerEntry]",
            await self.saver.arun_op(lambda: self._op_entries(thread_id, status, limit)),
        )

    async def aresult(self, key: str) -> Any:
        return await self.saver.arun_op(lambda: self._op_result(key))

    async def aresolve(self, key: str, result: Any) -> None:
        tag, data = self._encode_result(key, result)
        await self.saver.arun_op(lambda: self._op_change(RESOLVE_SQL, key, (tag, data, key)))

    async def aforget(self, key: str) -> bool:
        return cast(bool, await self.saver.arun_op(lambda: self._op_forget(key)))

    async def apurge_expired(self) -> int:
        return cast(int, await self.saver.arun_op(self._op_purge))


def purge_expired_keys(saver: _DurableBase) -> int:
    """Delete ledger keys whose TTL ran out (for retention jobs); returns how many."""
    return Ledger(saver).purge_expired()


async def apurge_expired_keys(saver: _DurableBase) -> int:
    return await Ledger(saver).apurge_expired()


__all__ = [
    "IdempotentTool",
    "Ledger",
    "LedgerEntry",
    "apurge_expired_keys",
    "idempotent",
    "purge_expired_keys",
]
