"""Where a call runs (its task, its position in it) and the idempotency key and fingerprint
made from that.
"""

from __future__ import annotations

import contextvars
import dataclasses
import datetime as dt
import decimal
import enum
import hashlib
import itertools
import logging
import threading
import uuid
import weakref
from collections.abc import (
    Callable,
    Mapping,
)
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import orjson

from langgraph_durable._compat import DURABILITY_KEY
from langgraph_durable._sealing import is_encrypting
from langgraph_durable.errors import (
    InvalidIdempotencyKeyError,
    SerializationError,
)
from langgraph_durable.leases.owners import new_owner_id

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
        durability=str(conf.get(DURABILITY_KEY) or "async"),
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


def tool_key(thread_id: str | None, checkpoint_ns: str, task_id: str, tool_call_id: str) -> str:
    """The ledger key of a model's tool call run by ``@idempotent`` tool inside a task:
    the task that runs the calling AI message and the call's ``tool_call_id`` (the
    console recomputes it to link a transcript's tool calls to their ledger rows)."""
    return "tool:" + _digest("tool-task", thread_id or "", checkpoint_ns, task_id, tool_call_id)


def legacy_tool_key(thread_id: str | None, tool_call_id: str) -> str:
    """The older (thread, tool_call_id) key; also the key outside a task (no thread)."""
    return "tool:" + _digest("tool", thread_id or "", tool_call_id)


def _owner() -> str:
    # The one owner-id maker (leases.owners): claims and leases name processes alike.
    return new_owner_id()


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
        # The plaintext serialization: an encrypting serializer's output has a random
        # nonce, which would make the fingerprint differ at every call.
        tag, data = (serde.serde if is_encrypting(serde) else serde).dumps_typed(value)
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


