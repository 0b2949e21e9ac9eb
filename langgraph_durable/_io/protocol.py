"""The sans-I/O protocol: the items ops and flows yield, and what they get back.

Saver logic is written once, as generators:

* an *op* runs inside one transaction. It yields ``Batch`` objects (statements sent in
  one pipeline round trip) and receives their rows (``Results``: by position, or by a
  statement's ``name``); it may yield ``AfterCommit`` to schedule pure work once the
  transaction is committed, and ``Call`` to run user code on the op's own connection,
  inside a savepoint. Its return value is the result.
* a *flow* spans several transactions. It yields ``Tx`` (run an op, get its result),
  ``Hook`` (call user code, awaited if it is a coroutine) and ``Sleep``.

Nothing here does I/O: the drivers (``_async.AsyncDriver``, the generated
``_sync.SyncDriver``, and ``scripted.ScriptedDriver`` for tests without a database)
interpret these items. Code before an op's first ``yield`` (encoding, compression)
runs before the driver checks a connection out.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, SupportsIndex, TypeVar, overload

T = TypeVar("T")


# Stmt and Batch are built for every op (issue 14: 25 per invoke): slotted and not
# frozen, since a frozen dataclass's __init__ sets each field through
# object.__setattr__ (~1 us for a Stmt). Nothing mutates or hashes them.
@dataclass(slots=True)
class Stmt:
    sql: Any
    params: Any = None
    fetch: bool = False
    many: bool = False
    prepare: bool | None = None
    # Read this statement's rows as ``rows["name"]`` (``rows[i]`` works too).
    name: str | None = None


@dataclass(slots=True)
class Batch:
    stmts: Sequence[Stmt]
    # The op's only batch (it yields nothing but AfterCommit afterwards): the driver may
    # then send it as one implicit transaction, without BEGIN/COMMIT (see _base.implicit).
    final: bool = False


class Results(list[list[Any]]):
    """A batch's rows, one list per statement: ``rows[0]`` by position, or
    ``rows["claim"]`` by the statement's ``Stmt.name``; ``rowcounts``, per statement,
    what the server reported (rows written or returned), read without fetching a row
    (a run's put learns of a cancel from it: sql.checkpoints._LEASE_PUT_PROBE)."""

    __slots__ = ("_stmts", "rowcounts")

    def __init__(
        self, rows: Sequence[list[Any]], stmts: Sequence[Stmt] = (), rowcounts: Sequence[int] = ()
    ) -> None:
        list.__init__(self, rows)
        self.rowcounts = rowcounts
        # Names are looked up on a str key only (most ops read rows by position):
        # no name map built per batch.
        self._stmts = stmts

    @overload
    def __getitem__(self, key: SupportsIndex) -> list[Any]: ...

    @overload
    def __getitem__(self, key: slice) -> list[list[Any]]: ...

    @overload
    def __getitem__(self, key: str) -> list[Any]: ...

    def __getitem__(self, key: SupportsIndex | slice | str) -> Any:
        if isinstance(key, str):
            for i, stmt in enumerate(self._stmts):
                if stmt.name == key:
                    return list.__getitem__(self, i)
            raise KeyError(f"no statement named {key!r} in this batch")
        return list.__getitem__(self, key)


@dataclass(frozen=True)
class AfterCommit:
    fn: Callable[[], None]


@dataclass(frozen=True)
class Call:
    """Op item: run ``fn(connection)`` (user code, awaited if it returns a coroutine)
    inside a savepoint of the op's transaction. A failure rolls the savepoint back and
    is thrown into the op; the value is sent back."""

    fn: Callable[[Any], Any]


@dataclass(frozen=True)
class Tx:
    factory: Callable[[], Generator[Any, Any, Any]]
    # False: run the op's statements without BEGIN/COMMIT (reads: each statement has
    # its own snapshot under READ COMMITTED either way).
    transaction: bool = True


@dataclass(frozen=True)
class Hook:
    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    # Also throw BaseException (a cancellation, KeyboardInterrupt) into the flow, so it
    # can record that user code was interrupted (idempotency: the outcome is unknown).
    interrupts: bool = False


@dataclass(frozen=True)
class Sleep:
    seconds: float


Op = Generator[Any, Any, T]
Flow = Generator[Any, Any, T]

# How many times an operation is retried on a fresh connection after the connection
# itself failed (server restart, idle-timeout kill, pgbouncer hiccup).
CONNECTION_RETRIES = 3

# Fault injection for tests (None in production): called with (connection, attempt)
# once an op's transaction has committed, before its result is returned. A hook that
# closes the connection and raises psycopg.OperationalError simulates the connection
# dropping between COMMIT and its reply: the driver then retries the whole op on a
# fresh connection, so every op must recognise its own committed work (see
# tests/test_seams_lease.py). Set with set_after_commit_hook.
AfterCommitHook = Callable[[Any, int], None]
_after_commit_hook: AfterCommitHook | None = None


def set_after_commit_hook(hook: AfterCommitHook | None) -> AfterCommitHook | None:
    """Install (or with None remove) the test-only after-commit hook; returns the old one."""
    global _after_commit_hook
    previous, _after_commit_hook = _after_commit_hook, hook
    return previous


def after_commit_hook() -> AfterCommitHook | None:
    return _after_commit_hook


OP_MEMO: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "langgraph_durable_op_memo", default=None
)


def op_memo() -> dict[str, Any]:
    """A dict the running op keeps across the driver's retries of it (one per run_op).

    A retry after a connection failure cannot tell whether the failed attempt's COMMIT
    happened. An op whose effect is not naturally idempotent (it counts, consumes or
    creates something) stores here, just before it returns, what it did; its retry
    checks the database for that effect and, when it is there, returns the remembered
    result instead of doing it again. (In an explicit transaction every result arrives
    before COMMIT is sent, so the memo is complete whenever the COMMIT may have
    succeeded.) Outside a driver's run_op it is a fresh dict: nothing is retried."""
    memo = OP_MEMO.get()
    return memo if memo is not None else {}


class Started:
    """An op run to its first yield: ``first`` is that item, or ``done`` with the op's
    value when it finished without yielding (then no connection is needed at all).
    The driver does this before checking a connection out, so an op's pure work before
    its first statement (encoding, compression) does not hold a pool connection."""

    __slots__ = ("done", "first", "op", "value")

    def __init__(self, op: Op[Any]) -> None:
        self.op = op
        self.first: Any = None
        self.value: Any = None
        self.done = False
        try:
            self.first = op.send(None)
        except StopIteration as stop:
            self.done, self.value = True, stop.value


def finish(
    op: Op[Any], after: list[Callable[[], None]], send: Any, throw: BaseException | None
) -> tuple[bool, Any]:
    """Drive an op past its final batch: AfterCommit items, then the op's end, ``(True,
    value)``, or another final batch, ``(False, batch)``, which the driver runs as an
    implicit transaction of its own (the first one committed: a follow-up write, e.g. a
    cancelled run's put storing its checkpoint, core.write)."""
    while True:
        try:
            item = op.throw(throw) if throw is not None else op.send(send)
        except StopIteration as stop:
            return True, stop.value
        send, throw = None, None
        if isinstance(item, Batch) and item.final:
            return False, item
        if not isinstance(item, AfterCommit):
            raise TypeError(f"op yielded {item!r} after its final batch")
        after.append(item.fn)
