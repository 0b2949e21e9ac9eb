"""Why a value cannot be stored, and where it is: pure functions for the error path.

The saver never walks a state to validate it (that would cost every put). When a
write fails (the serializer refuses a value, PostgreSQL refuses JSON text), these
functions locate the culprit for the error message: ``find_unencodable`` walks what the
serializer walks (dicts, lists, tuples, sets, dataclasses, pydantic models, plain
objects) and returns the path of the deepest value that still fails, e.g.
``state['docs'][3]: int out of range (2**70)``.

The one check on the hot path is ``text_problem`` on thread ids and on the short strings
stored inline in the checkpoint JSON, where ``str.isascii()`` answers almost always.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

# ormsgpack's integer range (int64 and uint64).
MSGPACK_INT_MIN = -(2**63)
MSGPACK_INT_MAX = 2**64 - 1

# A state is a tree in practice; the bounds only guard a cycle or a pathological one.
_MAX_DEPTH = 64
_MAX_CHILDREN = 100_000

Reject = Callable[[Any], "str | None"]

# What LangGraph writes as checkpoint "ts" (ISO 8601). SQL casts only text that matches,
# so one damaged row cannot fail a listing or a retention run over every thread.
# (A day that does not exist in its month, 2024-02-30, still passes: ts is written by
# LangGraph's own clock, so only deliberate damage produces one.)
ISO_TS_RE = (
    r"^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])[T ]([01]\d|2[0-3]):[0-5]\d:[0-5]\d"
    r"(\.\d{1,6})?(Z|[+-]\d{2}(:?\d{2})?)?$"
)


def text_problem(value: str) -> str | None:
    """Why PostgreSQL text (and JSON) cannot hold ``value``, or None."""
    if value.isascii():
        return "contains NUL (\\x00)" if "\x00" in value else None
    nul = value.find("\x00")
    if nul >= 0:
        return f"contains NUL (\\x00) at index {nul}"
    return surrogate_problem(value)


def surrogate_problem(value: str) -> str | None:
    """A lone UTF-16 surrogate in ``value`` (no UTF-8 form), or None."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"contains a lone surrogate {value[exc.start]!r} at index {exc.start}"
    return None


def int_text(n: int) -> str:
    """``2**70`` for powers of two, the digits otherwise (shortened when long)."""
    m = abs(n)
    if m > 1 and m & (m - 1) == 0:
        return f"{'-' if n < 0 else ''}2**{m.bit_length() - 1}"
    digits = str(n)
    return digits if len(digits) <= 40 else f"{digits[:20]}...({len(digits)} digits)"


def int_problem(value: Any) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool):
        if not MSGPACK_INT_MIN <= value <= MSGPACK_INT_MAX:
            return f"int out of range ({int_text(value)}; msgpack stores -2**63 .. 2**64-1)"
    return None


def serializer_reject(serde: Any) -> Reject:
    """A reject function backed by the serializer itself: exact for any type it
    handles, since a value is rejected when (and only when) it fails to serialize."""

    def reject(value: Any) -> str | None:
        problem = int_problem(value)
        if problem is not None:
            return problem
        try:
            serde.dumps_typed(value)
        except Exception as exc:
            return f"{type(value).__name__} cannot be serialized ({type(exc).__name__}: {exc})"
        return None

    return reject


def text_reject(value: Any, _depth: int = 0) -> str | None:
    """Rejects what PostgreSQL JSON text cannot hold: a str with NUL or a lone
    surrogate, anywhere inside ``value`` (dict keys included)."""
    if isinstance(value, str):
        return text_problem(value)
    if _depth < _MAX_DEPTH:
        for _, child in children(value):
            if text_reject(child, _depth + 1) is not None:
                return "contains text PostgreSQL cannot store"
    return None


def children(value: Any) -> Iterator[tuple[str, Any]]:
    """(path suffix, child) of the values the serializer descends into."""
    if isinstance(value, str | bytes | bytearray | int | float | complex | type(None)):
        return
    if isinstance(value, Mapping):
        for i, (k, v) in enumerate(value.items()):
            yield f"[{k!r}]", v
            yield f".keys()[{i}]", k
        return
    fields = getattr(value, "_fields", None)
    if isinstance(value, tuple) and isinstance(fields, tuple):  # namedtuple
        for name, v in zip(fields, value, strict=False):
            yield f".{name}", v
        return
    if isinstance(value, list | tuple | deque):
        for i, v in enumerate(value):
            yield f"[{i}]", v
        return
    if isinstance(value, set | frozenset):
        for i, v in enumerate(value):
            yield f"<element {i}>", v
        return
    model_fields = getattr(type(value), "model_fields", None)
    if isinstance(model_fields, Mapping):  # pydantic v2 (LangChain messages, documents)
        for name in model_fields:
            yield f".{name}", getattr(value, name, None)
        return
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield f".{f.name}", getattr(value, f.name, None)
        return
    if type(value).__name__ == "_DeltaSnapshot":
        yield ".value", getattr(value, "value", None)
        return
    attrs = getattr(value, "__dict__", None)
    if isinstance(attrs, dict):
        for name, v in attrs.items():
            yield f".{name}", v


def find_unencodable(value: Any, reject: Reject, root: str = "state") -> tuple[str, Any, str] | None:
    """(path, culprit, reason) of the deepest value inside ``value`` that ``reject``
    refuses, following the first refused child at each level; None when ``value`` is
    accepted. Costs a ``reject`` call per child on the path: only for error messages."""
    reason = reject(value)
    if reason is None:
        return None
    path, node = root, value
    seen = {id(value)}
    for _ in range(_MAX_DEPTH):
        step = _first_rejected(node, reject, seen)
        if step is None:
            break
        suffix, node, reason = step
        path += suffix
        seen.add(id(node))
    return path, node, reason


def _first_rejected(node: Any, reject: Reject, seen: set[int]) -> tuple[str, Any, str] | None:
    for n, (suffix, child) in enumerate(children(node)):
        if n >= _MAX_CHILDREN:
            return None
        if id(child) in seen and not isinstance(child, str | int | float | bytes):
            continue  # a cycle
        why = reject(child)
        if why is not None:
            return suffix, child, why
    return None


def locate(values: Mapping[str, Any], reject: Reject, root: str) -> tuple[str, Any, str] | None:
    """``find_unencodable`` over several named values (``root['name']...``)."""
    for name, value in values.items():
        found = find_unencodable(value, reject, f"{root}[{name!r}]")
        if found is not None:
            return found
    return None




# ------------------------------------------------------------------ saver helpers
def check_ids(thread_id: Any, checkpoint_ns: Any = "", checkpoint_id: Any = None) -> None:
    """Refuse ids PostgreSQL text cannot hold, before any statement is sent (psycopg
    would raise DataError for a NUL, UnicodeEncodeError for a lone surrogate)."""
    # Nearly always: ASCII without NUL. Spelled out (not _plain_id three times): this
    # runs for every put and put_writes, on LangGraph's critical path (issue 14).
    if (
        (not isinstance(thread_id, str) or (thread_id.isascii() and "\x00" not in thread_id))
        and (not isinstance(checkpoint_ns, str) or (checkpoint_ns.isascii() and "\x00" not in checkpoint_ns))
        and (not isinstance(checkpoint_id, str) or (checkpoint_id.isascii() and "\x00" not in checkpoint_id))
    ):
        return
    from langgraph_durable.errors import InvalidThreadIdError

    for key, value in (
        ("thread_id", thread_id),
        ("checkpoint_ns", checkpoint_ns),
        ("checkpoint_id", checkpoint_id),
    ):
        if isinstance(value, str) and (not value.isascii() or "\x00" in value):
            problem = text_problem(value)
            if problem is not None:
                cause: Exception | None = None
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError as exc:
                    cause = exc  # what psycopg would have raised
                raise InvalidThreadIdError(value, problem, key=key) from cause


def _plain_id(value: Any) -> bool:
    return not isinstance(value, str) or (value.isascii() and "\x00" not in value)


def canceled_error(
    exc: BaseException,
    operation: str,
    thread_id: str | None,
    checkpoint_ns: str | None = "",
    checkpoint_id: str | None = None,
) -> Any:
    """The ``StatementCanceledError`` for a canceled statement, else None."""
    import psycopg

    from langgraph_durable.errors import StatementCanceledError

    if not isinstance(exc, psycopg.errors.QueryCanceled | psycopg.errors.LockNotAvailable):
        return None
    diag = getattr(exc, "diag", None)
    reason = (getattr(diag, "message_primary", None) or str(exc)).strip()
    return StatementCanceledError(
        operation=operation,
        thread_id=thread_id,
        checkpoint_ns=checkpoint_ns,
        checkpoint_id=checkpoint_id,
        reason=reason,
        sqlstate=getattr(exc, "sqlstate", None),
    )


def checkpoint_problem(checkpoint: Any, metadata: Any) -> str | None:
    """What makes a stored checkpoint row unusable by LangGraph, or None. Checked on
    every load (a few isinstance checks): a row that fails here would otherwise fail
    later inside PregelLoop.__enter__, where no exit handler runs."""
    if not isinstance(checkpoint, dict):
        return "checkpoint JSON is not an object"
    if not isinstance(metadata, dict):
        return "metadata JSON is not an object"
    if not isinstance(checkpoint.get("id"), str):
        return "checkpoint JSON has no string 'id'"
    if not isinstance(checkpoint.get("channel_versions"), dict):
        return "checkpoint JSON has no 'channel_versions' object"
    seen = checkpoint.get("versions_seen")
    if not isinstance(seen, dict) or not all(isinstance(v, dict) for v in seen.values()):
        return "checkpoint JSON has no 'versions_seen' object of objects"
    if not isinstance(checkpoint.get("channel_values", {}) or {}, dict):
        return "checkpoint JSON 'channel_values' is not an object"
    if not isinstance(checkpoint.get("updated_channels") or [], list):
        return "checkpoint JSON 'updated_channels' is not a list"
    step = metadata.get("step")
    if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
        return f"metadata 'step' is not an integer ({step!r})"
    if not isinstance(metadata.get("source", ""), str):
        return f"metadata 'source' is not a string ({metadata.get('source')!r})"
    if not isinstance(metadata.get("parents") or {}, dict):
        return "metadata 'parents' is not an object"
    return None


__all__ = [
    "canceled_error",
    "check_ids",
    "checkpoint_problem",
    "children",
    "find_unencodable",
    "int_problem",
    "int_text",
    "locate",
    "serializer_reject",
    "surrogate_problem",
    "text_problem",
    "text_reject",
]
