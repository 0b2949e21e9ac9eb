"""The audit trail: every operator action, from the console, the CLI or Python.

One row per action in ``durable_audit``: who (``actor``, and ``via``: console, cli or
python), when, what (``action``), which thread, the checkpoint (or key) before and
after, and a ``detail`` JSON object. The recording lives in the operator API itself,
not in its callers, so ``poison.release`` called from a notebook is audited exactly
like the console's button:

* ``audited(action, describe)`` wraps an *op* (one transaction, see ``_io``): the audit
  row is inserted by the op's own transaction, after its last statement, so the action
  and its record commit together or not at all. ``describe(result, *args)`` returns
  the row's fields (or ``None``: nothing to record, e.g. a dry run).
* ``audited_flow(action, describe)`` wraps a *flow* (several transactions: batch
  migration, retention, GC). Its row is written in one more transaction once the flow
  returned: work that committed before a crash of the flow is then not recorded (each
  of those units is itself idempotent and re-runnable, and the next run is recorded).

A retry of the op after a lost COMMIT reply reuses the first attempt's event id (kept
in the op memo), so it never records one action twice.

Who: ``acting_as("alice", via="console")`` around the call (a context variable), else
``$LANGGRAPH_DURABLE_ACTOR``, else ``user@host`` of the process; ``via`` defaults to
``python`` (the CLI sets ``cli`` at start).

This module's top level imports the standard library only (the CLI imports it at
start; ``--help`` must stay fast).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import getpass
import json
import os
import re
import socket
import urllib.parse
import uuid
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from langgraph_durable import _sealing
from langgraph_durable.sql.audit import AUDIT_INSERT_SQL, AUDIT_LIST_SQL

if TYPE_CHECKING:
    from langgraph_durable._view import SaverView

__all__ = [
    "AuditRecord",
    "acting_as",
    "actor",
    "audited",
    "audited_flow",
    "list_audit",
    "redact_text",
    "redact_url",
    "set_default_via",
]

ENV_ACTOR = "LANGGRAPH_DURABLE_ACTOR"

_ACTOR: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "langgraph_durable_audit_actor", default=None
)
_DEFAULT_VIA = ["python"]


def _process_user() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry (containers)
        user = str(os.getuid()) if hasattr(os, "getuid") else "unknown"
    return f"{user}@{socket.gethostname()}"


def set_default_via(via: str) -> None:
    """What ``via`` a record gets outside ``acting_as`` (the CLI sets ``cli``)."""
    _DEFAULT_VIA[0] = via


def actor() -> tuple[str, str]:
    """``(actor, via)`` the next record gets."""
    current = _ACTOR.get()
    if current is not None:
        return current
    return os.environ.get(ENV_ACTOR) or _process_user(), _DEFAULT_VIA[0]


@contextlib.contextmanager
def acting_as(who: str, *, via: str = "python") -> Iterator[None]:
    """Record the operator actions inside the block as ``who`` (and ``via``)."""
    token = _ACTOR.set((str(who), str(via)))
    try:
        yield
    finally:
        _ACTOR.reset(token)


@dataclass(frozen=True)
class AuditRecord:
    """What ``describe`` returns: the fields of one audit row besides who and when."""

    thread_id: str | None = None
    before_id: str | None = None
    after_id: str | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)


T = TypeVar("T")
Describe = Callable[..., AuditRecord | None]


# What of an audit detail stays in the clear with an encrypting serializer: statuses,
# reasons and counts (the rest, keys, ids and URLs, is sealed).
AUDIT_CLEAR = frozenset({"status", "reason", "attempts", "released", "dry_run", "keys"})


def _params(action: str, record: AuditRecord, event_id: str) -> dict[str, Any]:
    who, via = actor()
    return {
        "event_id": event_id,
        "actor": who,
        "via": via,
        "action": action,
        "thread_id": record.thread_id,
        "before_id": record.before_id,
        "after_id": record.after_id,
        # Sealed with the saver's keyring when it encrypts (issue 27), counts and
        # statuses kept in the clear.
        "detail": json.dumps(_sealing.seal_json(_sealing.RING.get(), dict(record.detail), AUDIT_CLEAR), default=str),
    }


def _delegate(gen: Generator[Any, Any, T]) -> Generator[Any, Any, T]:
    """``yield from gen``, but a ``final`` batch (an op's only batch, which the driver
    may send as an implicit transaction) is passed on as not final: the audit insert
    follows it in the same explicit transaction."""
    from langgraph_durable._io import Batch

    send: Any = None
    throw: BaseException | None = None
    while True:
        try:
            item = gen.throw(throw) if throw is not None else gen.send(send)
        except StopIteration as stop:
            return stop.value
        if isinstance(item, Batch) and item.final:
            item = Batch(item.stmts, final=False)
        send, throw = None, None
        try:
            send = yield item
        except Exception as exc:  # a failed batch is thrown into the op
            throw = exc


def audited(
    action: str,
    describe: Describe,
    *,
    prefetch: Callable[..., Any] | None = None,
) -> Callable[[Callable[..., Generator[Any, Any, T]]], Callable[..., Generator[Any, Any, T]]]:
    """Record each successful run of the decorated op in ``durable_audit``, in the op's
    transaction. ``describe(result, *args, **kwargs)`` (or, with ``prefetch``,
    ``describe(result, rows, *args, **kwargs)``) gives the row; ``prefetch(*args,
    **kwargs)`` returns a ``Stmt`` run first in the same transaction, e.g. to read what
    a delete will remove."""

    def decorate(fn: Callable[..., Generator[Any, Any, T]]) -> Callable[..., Generator[Any, Any, T]]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Generator[Any, Any, T]:
            from langgraph_durable._io import Batch, Stmt, op_memo

            memo = op_memo()
            event_id = memo.setdefault("audit_event_id", str(uuid.uuid4()))
            before: list[Any] = []
            if prefetch is not None:
                rows = yield Batch([prefetch(*args, **kwargs)])
                before = [dict(r) for r in rows[0]]
            result = yield from _delegate(fn(*args, **kwargs))
            if prefetch is not None:
                record = describe(result, before, *args, **kwargs)
            else:
                record = describe(result, *args, **kwargs)
            if record is not None:
                yield Batch([Stmt(AUDIT_INSERT_SQL, _params(action, record, event_id))])
            return result

        return wrapper

    return decorate


def audited_flow(
    action: str, describe: Describe
) -> Callable[[Callable[..., Generator[Any, Any, T]]], Callable[..., Generator[Any, Any, T]]]:
    """Record each completed run of the decorated flow, in a transaction of its own
    after the flow's last one (see the module docstring)."""

    def decorate(fn: Callable[..., Generator[Any, Any, T]]) -> Callable[..., Generator[Any, Any, T]]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Generator[Any, Any, T]:
            from langgraph_durable._io import Tx

            result = yield from fn(*args, **kwargs)
            record = describe(result, *args, **kwargs)
            if record is not None:
                params = _params(action, record, str(uuid.uuid4()))
                yield Tx(lambda: _op_insert(params))
            return result

        return wrapper

    return decorate


def _op_insert(params: dict[str, Any]) -> Generator[Any, Any, None]:
    from langgraph_durable._io import Batch, Stmt

    yield Batch([Stmt(AUDIT_INSERT_SQL, params)])


def _op_list(
    thread_id: str | None, action: str | None, before: int | None, limit: int
) -> Generator[Any, Any, list[dict[str, Any]]]:
    from langgraph_durable._io import Batch, Stmt

    params = {"thread_id": thread_id, "action": action, "before": before, "limit": int(limit)}
    rows = yield Batch([Stmt(AUDIT_LIST_SQL, params, fetch=True, prepare=False)])
    # Rows written before URLs were redacted at write time (issue 23) may hold an archive
    # URL's credentials: every reader (console, CLI, API) sees them redacted.
    ring = _sealing.RING.get()
    return [
        {**r, "detail": _redacted(_sealing.open_json(
            ring, r.get("detail"), thread_id=r.get("thread_id"), where="audit detail", strict=False, lenient=True
        ))}
        for r in rows[0]
    ]


def _redacted(value: Any) -> Any:
    """``value`` (an audit row's JSON detail) with every URL in its strings redacted."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, list):
        return [_redacted(v) for v in value]
    if isinstance(value, dict):
        return {k: _redacted(v) for k, v in value.items()}
    return value


def list_audit(
    saver: SaverView,
    *,
    thread_id: str | None = None,
    action: str | None = None,
    before: int | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """Audit rows, newest first; ``before`` (an ``id``) pages back."""
    return list(saver.run_op(lambda: _op_list(thread_id, action, before, limit)))


async def alist_audit(
    saver: SaverView,
    *,
    thread_id: str | None = None,
    action: str | None = None,
    before: int | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    return list(await saver.arun_op(lambda: _op_list(thread_id, action, before, limit)))


# ------------------------------------------------------------ describers
# One per audited operator function (the decorators in poison, idempotency, versioning
# and retention name them), so those modules carry one line each.
_MAX_IDS = 1000  # thread ids listed in one record's detail


def ledger_row(self: Any, *args: Any) -> Any:
    """Prefetch for the ledger ops: the key's row before the change (its thread)."""
    from langgraph_durable._io import Stmt

    key = args[1] if len(args) > 1 else args[0]  # _op_change(sql, key, params) / _op_forget(key)
    return Stmt(
        "SELECT thread_id, status, name FROM durable_ledger WHERE key = %s", (key,), fetch=True
    )


def describe_release(result: Any, thread_id: str) -> AuditRecord:
    return AuditRecord(
        thread_id=thread_id,
        before_id=result.checkpoint_id,
        after_id=result.checkpoint_id,
        detail={
            "reason": result.reason,
            "attempts": result.attempts,
            # Not last_error: an exception's text may quote state values, and audit rows
            # outlive the thread (sql.schema.KEPT_AFTER_DELETE).
            "status": ["quarantined", "stopped"],
        },
    )


def describe_rewind(result: Any, saver: SaverView, thread_id: str, to: str) -> AuditRecord:
    return AuditRecord(
        thread_id=thread_id,
        before_id=result.rewound_from,
        after_id=result.checkpoint_id,
        detail={"rewound_to": result.rewound_to, "released": result.released},
    )


def _ledger_record(before: list[dict[str, Any]], key: str, after: str | None, **extra: Any) -> AuditRecord:
    row = before[0] if before else {}
    return AuditRecord(
        thread_id=row.get("thread_id"),
        detail={"key": key, "name": row.get("name"), "status": [row.get("status"), after], **extra},
    )


def describe_ledger_change(
    result: Any, before: list[dict[str, Any]], self: Any, sql: str, key: str, params: Any
) -> AuditRecord:
    return _ledger_record(before, key, "completed", result_type=params[0] if params else None)


def describe_ledger_forget(
    result: Any, before: list[dict[str, Any]], self: Any, key: str
) -> AuditRecord | None:
    return _ledger_record(before, key, None) if result else None


def describe_ledger_purge(result: Any, self: Any) -> AuditRecord | None:
    return AuditRecord(detail={"keys": int(result)}) if result else None


def describe_undo(result: Any, thread_id: str, *args: Any, **kwargs: Any) -> AuditRecord:
    return AuditRecord(
        thread_id=str(thread_id),
        before_id=result.get("checkpoint_id"),
        after_id=result.get("checkpoint_id"),
        detail={
            "migration_id": result.get("migration_id"),
            "version": [result.get("undone_version"), result.get("restored_version")],
        },
    )


def describe_migrate(result: Any, *args: Any, **kwargs: Any) -> AuditRecord | None:
    if result.dry_run:
        return None
    return AuditRecord(
        thread_id=result.migrated[0] if len(result.migrated) == 1 else None,
        detail={
            "version": [result.from_version, result.to_version],
            "steps": result.steps,
            "migrated": result.migrated[:_MAX_IDS],
            "migrated_count": len(result.migrated),
            "failed": dict(list(result.failed.items())[:_MAX_IDS]),
            "busy": result.busy[:_MAX_IDS],
            "skipped": len(result.skipped),
        },
    )


# Query parameters whose value is a credential in the URLs people give as archive
# targets (presigned S3/GCS/Azure URLs, HTTP tokens): matched as a part of the name.
_SECRET_PARAM = re.compile(
    r"token|key|password|passwd|pwd|secret|signature|sig|credential|auth|session|sas", re.I
)
REDACTED = "***"


def redact_url(url: object) -> str:
    """``url`` with its credentials replaced by ``***``: the user-info part
    (``user:password@``, also a bare ``token@``) and the value of every query parameter
    whose name looks like a secret (``token``, ``key``, ``password``, ``secret``,
    ``signature``, ``X-Amz-Credential``...). Every URL that is logged, audited or put in
    an error goes through this (issue 23); a plain path comes back unchanged."""
    text = str(url)
    if "://" not in text and "?" not in text and "@" not in text:
        return text
    try:
        parts = urllib.parse.urlsplit(text)
    except ValueError:
        # Unparseable (e.g. a bad IPv6 literal): keep the scheme, hide the rest.
        return text.split("://", 1)[0] + "://" + REDACTED if "://" in text else REDACTED
    netloc = parts.netloc
    if "@" in netloc:
        netloc = REDACTED + "@" + netloc.rsplit("@", 1)[1]
    # The fragment too when it holds parameters (an OAuth-style ``#access_token=...``).
    query, fragment = _redact_params(parts.query), parts.fragment
    if "=" in fragment:
        fragment = _redact_params(fragment)
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, fragment))


def _redact_params(query: str) -> str:
    if not query:
        return query
    pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
    return "&".join(
        f"{urllib.parse.quote(k, safe='-_.~')}="
        + (REDACTED if _SECRET_PARAM.search(k) else urllib.parse.quote(v, safe="-_.~/"))
        for k, v in pairs
    )


_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def redact_text(text: str) -> str:
    """``text`` (an exception message, a log line) with every URL in it redacted."""
    return _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)


def _redact_all(urls: Any) -> list[str]:
    return [redact_url(u) for u in urls]


def describe_retain(result: Any, *args: Any, **kwargs: Any) -> AuditRecord | None:
    if result.dry_run:
        return None
    detail = result.as_dict()
    if "archive_files" in detail:
        detail["archive_files"] = _redact_all(detail["archive_files"][:_MAX_IDS])
    if "archive_failed" in detail:
        detail["archive_failed"] = detail["archive_failed"][:_MAX_IDS]
    detail["deleted_thread_ids"] = detail["deleted_thread_ids"][:_MAX_IDS]
    detail["damaged"] = detail["damaged"][:_MAX_IDS]
    deleted = result.deleted_thread_ids
    return AuditRecord(thread_id=deleted[0] if len(deleted) == 1 else None, detail=detail)


def describe_gc(result: Any, *args: Any, **kwargs: Any) -> AuditRecord | None:
    return None if result.dry_run else AuditRecord(detail=result.as_dict())


def describe_export(result: Any, saver: SaverView, thread_id: str, dry_run: bool) -> AuditRecord | None:
    if dry_run or not result.changed:
        return None
    return AuditRecord(
        thread_id=result.thread_id,
        detail={
            "blobs": result.blobs, "writes": result.writes, "channels": result.channels,
            "versions": result.versions,
        },
    )


def describe_restore(result: Any, saver: SaverView, items: Any) -> AuditRecord | None:
    if not result.thread_ids:
        return None
    ids = result.thread_ids
    return AuditRecord(
        thread_id=ids[0] if len(ids) == 1 else None,
        detail={
            "thread_ids": ids[:_MAX_IDS],
            "threads_restored": result.threads_restored,
            "files": _redact_all(f for f, _dump in items[:_MAX_IDS]),
            "rows": result.rows,
        },
    )
