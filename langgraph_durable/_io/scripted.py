"""A driver without a database: batches are answered by a script (for unit tests).

``ScriptedDriver`` is the generated ``SyncDriver`` with its I/O replaced: the same
interpreter runs ops and flows (retries, ``Started``, ``AfterCommit``, ``Call``
savepoints, a failed batch thrown into the op), but a statement's rows come from
``Script`` rules matched on its SQL text, sleeps are recorded instead of slept, and
every connection checkout, transaction and statement is written to ``events``. So an
op's logic (fencing, takeovers, exit outcomes, the version gate) is tested like h11's
state machine: no socket.

    script = Script().on("FROM durable_threads", [{"status": "running"}])
    driver = ScriptedDriver(script)
    driver.run_op(lambda: saver._op_acquire_contended(...))
    driver.statements  # [(sql, params), ...]
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from langgraph_durable._io._sync import SyncDriver
from langgraph_durable._io.protocol import Batch, Results, Stmt

Response = list[dict[str, Any]] | BaseException | Callable[[Stmt], Any]


@dataclass
class _Rule:
    pattern: re.Pattern[str] | None
    exact: str | None
    responses: list[Response]

    def matches(self, text: str) -> bool:
        if self.exact is not None:
            return text == self.exact
        return self.pattern is not None and self.pattern.search(text) is not None


@dataclass
class Script:
    """Rules matched in order on a statement's SQL: ``on(pattern, ...)`` searches a
    regular expression, ``on_sql(sql, ...)`` compares the whole text (pass the module's
    SQL constant).

    Each match takes the next response (the last one
    repeats); a response is rows (a list of dicts), an exception (raised, as psycopg
    would) or a callable of the ``Stmt`` returning either. A statement no rule matches
    gets no rows unless ``strict``, where it fails the test."""

    strict: bool = False
    rules: list[_Rule] = field(default_factory=list)

    def on(self, pattern: str, *responses: Response) -> Script:
        self.rules.append(_Rule(re.compile(pattern, re.S), None, list(responses) or [[]]))
        return self

    def on_sql(self, sql: str, *responses: Response) -> Script:
        self.rules.append(_Rule(None, sql, list(responses) or [[]]))
        return self

    def answer(self, stmt: Stmt) -> list[dict[str, Any]]:
        text = stmt.sql if isinstance(stmt.sql, str) else repr(stmt.sql)  # psycopg.sql: its repr
        for rule in self.rules:
            if rule.matches(text):
                response = rule.responses.pop(0) if len(rule.responses) > 1 else rule.responses[0]
                if callable(response) and not isinstance(response, BaseException):
                    response = response(stmt)
                if isinstance(response, BaseException):
                    raise response
                return list(response)
        if self.strict:
            raise AssertionError(f"no script rule matches {text!r}")
        return []


class ScriptedConnection:
    """What the interpreter needs of a connection; records transactions in ``events``."""

    def __init__(self, events: list[tuple[Any, ...]]) -> None:
        self.events = events
        self.autocommit = False
        self.closed = False
        self.broken = False

    @contextmanager
    def transaction(self) -> Iterator[None]:
        self.events.append(("begin",))
        try:
            yield
        except BaseException:
            self.events.append(("rollback",))
            raise
        self.events.append(("commit",))


class ScriptedDriver(SyncDriver):
    """``SyncDriver`` answering from a ``Script``; see the module docstring."""

    def __init__(self, script: Script | None = None) -> None:
        super().__init__(None, None)
        self.script = script if script is not None else Script()
        self.events: list[tuple[Any, ...]] = []
        self.sleeps: list[float] = []
        self.conn_obj = ScriptedConnection(self.events)

    @contextmanager
    def connection(self) -> Iterator[Any]:
        self.events.append(("checkout",))
        try:
            yield self.conn_obj
        finally:
            self.events.append(("checkin",))

    def _execute(self, conn: Any, batch: Batch) -> Results:  # type: ignore[override]
        out, counts = [], []
        for stmt in batch.stmts:
            self.events.append(("stmt", stmt.sql, stmt.params))
            rows = self.script.answer(stmt)
            out.append(rows if stmt.fetch else [])
            # A fetch: its rows; a write: one row written, unless the script's rows say.
            counts.append(len(rows) if stmt.fetch or rows else 1)
        return Results(out, batch.stmts, counts)

    def _sleep(self, seconds: float) -> None:
        self.events.append(("sleep", seconds))
        self.sleeps.append(seconds)

    def _check_pool(self) -> None:
        return None

    @property
    def statements(self) -> list[tuple[Any, Any]]:
        """(sql, params) of every statement sent, in order."""
        return [(e[1], e[2]) for e in self.events if e[0] == "stmt"]

    def mark(self, *event: Any) -> None:
        """Add an event of the test's own (e.g. from an op's code) to the timeline."""
        self.events.append(event)


__all__ = ["Script", "ScriptedConnection", "ScriptedDriver"]
