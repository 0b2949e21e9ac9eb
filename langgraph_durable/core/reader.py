"""Reads off the primary: ``read_dsn`` (a streaming standby) and ``saver.reader()``.

An operator's reads (the console, the CLI's read commands, ``ops.inspection``, a
``get_state_history`` listing) may go to a standby; a run's never do. The two are told
apart by the object called, not by guessing from the call: ``saver.reader()`` returns a
*reader*, a read-only view of the saver whose driver runs on the ``read_dsn`` pool; the
saver itself keeps only the primary's driver, so every statement of a run (its start,
its loads, puts, writes, lease renewals, the worker's claims) goes to the primary
whatever ``read_dsn`` says. A reader refuses writes and run starts
(``ReadOnlyViewError``), and its sessions are ``default_transaction_read_only``.

Each ``reader()`` call measures how far the standby is behind (``ReadLag``): the primary's
``pg_current_wal_lsn()`` first, then the standby's replay position against it and the
age of the last transaction it replayed (``sql.replication``). Above ``read_max_lag``
seconds the reader still reads the standby and ``ReadLag.over`` says so (the CLI and the
console warn), unless ``read_fallback`` asked for the primary then.

Written once for both savers: the ops here run on either driver; saver.py opens the
pools (sync or async) and calls ``measure_flow``/``make_reader``.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, replace
from typing import Any

import psycopg
from psycopg import conninfo as ci

from langgraph_durable._io import AsyncDriver, Batch, Op, Stmt, SyncDriver
from langgraph_durable.config import DEFAULT_MAX_LAG, ReadOptions
from langgraph_durable.errors import ReadOnlyViewError
from langgraph_durable.sql.replication import (
    PRIMARY_WAL_LSN_SQL,
    READ_ONLY_TX_SQL,
    STANDBY_LAG_SQL,
    standby_params,
)

logger = logging.getLogger("langgraph_durable")

ENV_READ_DSN = "LANGGRAPH_DURABLE_READ_DSN"
# When a first look says the standby is more than this behind and replay is not
# paused, look once more: an idle primary writes WAL records of its own (a checkpoint,
# a running-transactions snapshot) that a standby replays within milliseconds; a look
# taken in between would report the age of the last commit as the lag.
RECHECK_ABOVE = 1.0
RECHECK_AFTER = 0.05


def resolve_read_dsn(read_dsn: str | None, *, env: bool = True) -> str | None:
    """``read_dsn``; None: ``LANGGRAPH_DURABLE_READ_DSN`` (with ``env``). A blank string
    is "no read_dsn", the variable ignored (a process that only runs graphs)."""
    if read_dsn is None:
        read_dsn = os.environ.get(ENV_READ_DSN) if env else None
    return (read_dsn or "").strip() or None


def server_of(dsn: str) -> str:
    """``host:port/dbname`` of a DSN, for the line that says where reads go."""
    try:
        params = ci.conninfo_to_dict(dsn)
    except Exception:
        return "read_dsn"
    host = params.get("host") or params.get("hostaddr") or "localhost"
    port = params.get("port") or "5432"
    return f"{host}:{port}/{params.get('dbname') or params.get('user') or ''}"


@dataclass(frozen=True)
class ReadLag:
    """Where a reader reads and how far behind that is, as measured when it was made.

    ``source``: ``"primary"`` or ``"standby"`` (what the reads go to now).
    ``server``: host:port/db of the read_dsn (None without one). ``in_recovery``: the
    read_dsn's server is a standby (False: it is a primary). ``seconds``: replay lag
    (0.0 when the standby has replayed everything the primary had written when the
    look began; None when unknown: nothing replayed since the standby started).
    ``behind_bytes``: WAL bytes not replayed yet (None when the primary did not answer).
    ``paused``: ``pg_wal_replay_pause()`` is in effect. ``over``: lag above
    ``max_lag`` (or unknown while behind). ``fell_back``: reads went to the primary
    because of it (``read_fallback``). ``mismatch``: the read_dsn server is not a
    replica of the saver's primary (another cluster or database, a promoted standby, a
    copy): what it is; its lag is then unknown and counted over."""

    source: str
    server: str | None = None
    in_recovery: bool | None = None
    seconds: float | None = 0.0
    behind_bytes: int | None = None
    paused: bool = False
    primary_reachable: bool = True
    max_lag: float = DEFAULT_MAX_LAG
    fell_back: bool = False
    # The standby did not answer (read_fallback then read the primary): why.
    standby_error: str | None = None
    # The read_dsn server is not a replica of the primary (core/reader.py mismatch_of).
    mismatch: str | None = None
    # Reads went to the primary because the standby has not replayed this process's
    # own last write yet (the console after an action: read your writes).
    after_write: bool = False

    @property
    def over(self) -> bool:
        """Behind by more than ``max_lag`` seconds (or behind by an unknown time)."""
        if self.standby_error is not None or self.mismatch is not None:
            return True
        if not self.in_recovery:
            return False
        if self.seconds is None:
            return bool(self.behind_bytes) or not self.primary_reachable
        return self.seconds > self.max_lag

    def describe(self) -> str:
        """One line: ``reading from standby h:5433/db, 12.3 s behind (replay paused)``."""
        if self.server is None:
            return "reading from the primary"
        if self.after_write:
            return (
                f"reading from the primary: the standby {self.server} has not replayed "
                "the last action yet"
            )
        if self.fell_back and self.standby_error is not None:
            return (
                f"reading from the primary: the standby {self.server} does not answer "
                f"({self.standby_error}) (read_fallback)"
            )
        if self.fell_back and self.mismatch is not None:
            return (
                f"reading from the primary: read_dsn {self.server} is not a replica of it "
                f"({self.mismatch}) (read_fallback)"
            )
        if self.mismatch is not None:
            return (
                f"reading from {self.server} (read_dsn), which is not a replica of the primary "
                f"({self.mismatch}): how far behind is unknown"
            )
        if self.fell_back:
            return (
                f"reading from the primary: the standby {self.server} is {self._behind()}, "
                f"over read_max_lag {self.max_lag:g} s (read_fallback)"
            )
        if not self.in_recovery:
            return f"reading from {self.server} (read_dsn), which is not a standby: a primary"
        return f"reading from standby {self.server}, {self._behind()}"

    def _behind(self) -> str:
        what = "behind by an unknown time" if self.seconds is None else f"{self.seconds:.1f} s behind"
        notes = []
        if self.behind_bytes:
            notes.append(f"{_fmt_bytes(self.behind_bytes)} of WAL not replayed")
        if self.paused:
            notes.append("replay paused")
        if not self.primary_reachable:
            notes.append("primary not reachable to compare")
        return what + (f" ({', '.join(notes)})" if notes else "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source, "server": self.server, "in_recovery": self.in_recovery,
            "seconds": self.seconds, "behind_bytes": self.behind_bytes, "paused": self.paused,
            "primary_reachable": self.primary_reachable, "max_lag": self.max_lag,
            "over": self.over, "fell_back": self.fell_back,
            "standby_error": self.standby_error, "mismatch": self.mismatch,
            "after_write": self.after_write,
            "message": self.describe(),
        }


def _fmt_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


# ------------------------------------------------------------------ ops
def op_primary_lsn() -> Op[dict[str, Any] | None]:
    """On the primary: where its WAL ends now, its clock and identity (PRIMARY_WAL_LSN_SQL)."""
    rows = yield Batch([Stmt(PRIMARY_WAL_LSN_SQL, fetch=True)], final=True)
    return dict(rows[0][0]) if rows[0] else None


def op_standby_lag(primary: dict[str, Any] | None) -> Op[dict[str, Any]]:
    """On the read server: recovery state, replay position against the primary's."""
    rows = yield Batch([Stmt(STANDBY_LAG_SQL, standby_params(primary), fetch=True)], final=True)
    return dict(rows[0][0])


def mismatch_of(row: dict[str, Any], primary: dict[str, Any] | None) -> str | None:
    """What the read server is when it is not a replica of the primary (None: it is, or
    the primary did not answer). A standby has its primary's system identifier and
    databases; a server not in recovery is caught up only when it is the primary itself
    (same postmaster). Anything else (a standby of another cluster, another database, a
    promoted standby, a restored copy) has a lag nobody can measure."""
    if not primary:
        return None
    ours, theirs = primary.get("sysid"), row.get("sysid")
    if ours and theirs and ours != theirs:
        what = "a standby of" if row.get("in_recovery") else "a server of"
        return f"{what} another cluster: system identifier {theirs}, the primary's {ours}"
    if row.get("dbname") is not None and row.get("dbname") != primary.get("dbname"):
        return f"another database: {row.get('dbname')!r}, the primary's {primary.get('dbname')!r}"
    if not row.get("in_recovery") and row.get("started") != primary.get("started"):
        return (
            "a primary other than the saver's: a promoted standby or a copy, its data "
            "forked from the primary's"
        )
    return None


def lag_of(
    row: dict[str, Any], settings: ReadOptions, *, primary_reachable: bool,
    primary: dict[str, Any] | None = None,
) -> ReadLag:
    """A ``ReadLag`` from the standby's row (``op_standby_lag``) and the primary's
    (``op_primary_lsn``; None: not asked or did not answer)."""
    server = server_of(settings.dsn) if settings.dsn else None
    mismatch = mismatch_of(row, primary)
    if mismatch is not None:
        return ReadLag(
            "standby", server, bool(row["in_recovery"]), None, None, bool(row.get("paused")),
            primary_reachable, settings.max_lag, mismatch=mismatch,
        )
    if not row["in_recovery"]:
        return ReadLag("standby", server, False, 0.0, None, False, primary_reachable, settings.max_lag)
    behind = row["behind_bytes"]
    behind = None if behind is None else max(int(behind), 0)
    since = row["since_replay"]
    if behind == 0:
        seconds: float | None = 0.0  # replayed all the primary had when the look began
    else:
        seconds = None if since is None else max(float(since), 0.0)
    return ReadLag(
        "standby", server, True, seconds, behind, bool(row["paused"]), primary_reachable,
        settings.max_lag,
    )


def needs_second_look(lag: ReadLag) -> bool:
    return bool(
        lag.in_recovery and lag.primary_reachable and not lag.paused
        and lag.seconds is not None and lag.seconds > RECHECK_ABOVE
    )


@dataclass(frozen=True)
class _ReadSchemaView:
    schema: str | None
    pooler: Any


def op_check_read_schema(schema: str | None, pooled: Any, dsn: str) -> Op[None]:
    """On the read server, once when its pool opens: the package's tables are there at
    this release's version (what ``setup(run_migrations=False)`` checks on the primary),
    else ``ReadDsnSchemaError`` naming the server, before any listing meets a raw
    ``UndefinedTable`` (a read_dsn that names another database or cluster)."""
    from langgraph.checkpoint.postgres.base import MIGRATIONS as STOCK_MIGRATIONS

    from langgraph_durable.errors import ReadDsnSchemaError, SchemaNotReadyError
    from langgraph_durable.pooler import op_check_schema

    try:
        yield from op_check_schema(_ReadSchemaView(schema, pooled), list(STOCK_MIGRATIONS))
    except SchemaNotReadyError as exc:
        f = exc.fields
        raise ReadDsnSchemaError(server_of(dsn), schema, f["component"], f["found"], f["expected"]) from exc


_NOT_STANDBY_LOGGED: set[str] = set()
_MISMATCH_LOGGED: set[tuple[str, str]] = set()


def note_not_standby(settings: ReadOptions, lag: ReadLag) -> None:
    """Once per process and read_dsn: its server is not in recovery (a primary)."""
    if lag.mismatch is not None and settings.dsn and (settings.dsn, lag.mismatch) not in _MISMATCH_LOGGED:
        _MISMATCH_LOGGED.add((settings.dsn, lag.mismatch))
        logger.warning(
            "langgraph-durable: read_dsn %s is not a replica of the primary (%s): operator "
            "reads there show data of unknown age; read_fallback reads the primary",
            server_of(settings.dsn), lag.mismatch,
        )
        return
    if lag.in_recovery is False and settings.dsn and settings.dsn not in _NOT_STANDBY_LOGGED:
        _NOT_STANDBY_LOGGED.add(settings.dsn)
        logger.warning(
            "langgraph-durable: read_dsn %s is not a standby (pg_is_in_recovery() is false): "
            "operator reads go to that server, which is a primary; allowed, but it takes "
            "none of the load off the primary unless it is another server",
            server_of(settings.dsn),
        )


# ------------------------------------------------------------------ the view
@contextmanager
def _writes_refused() -> Iterator[None]:
    """The server's refusal of a write on a read-only session, as the view's own."""
    try:
        yield
    except psycopg.errors.ReadOnlySqlTransaction as exc:
        raise ReadOnlyViewError("a write (an operator decision or record)") from exc


class ReadOnlyView:
    """Mixed in before a saver class to make its reader (saver.py declares the two):
    every write and every run start raises ``ReadOnlyViewError``; reads run on the
    driver the view was given."""

    read_lag: ReadLag
    _digest_writable = False  # reads the digest secret, never creates it (a standby)

    def _refuse(self, method: str, thread_id: Any = None) -> None:
        raise ReadOnlyViewError(method, None if thread_id is None else str(thread_id))

    # The saver this view was made from: reader() measures again (a console page).
    _origin: Any

    def reader(self) -> Any:
        return self._origin.reader()

    async def areader(self) -> Any:
        return await self._origin.areader()

    # A reader is never a run: LangGraph's run path (PregelLoop) loads with its runtime
    # in configurable; a listing (get_state, get_state_history, the CLI) does not.
    def get_tuple(self, config: Any) -> Any:
        self._refuse_run(config)
        return super().get_tuple(config)  # type: ignore[misc]

    async def aget_tuple(self, config: Any) -> Any:
        self._refuse_run(config)
        return await super().aget_tuple(config)  # type: ignore[misc]

    def _refuse_run(self, config: Any) -> None:
        configurable = (config or {}).get("configurable", {})
        if "__pregel_runtime" in configurable:
            self._refuse("a graph run", configurable.get("thread_id"))

    def _run_context(self, config: Any) -> None:
        return None  # never a run start, never a lease

    def put(self, config: Any, *args: Any, **kwargs: Any) -> Any:
        self._refuse("put", _thread(config))

    async def aput(self, config: Any, *args: Any, **kwargs: Any) -> Any:
        self._refuse("aput", _thread(config))

    def put_writes(self, config: Any, *args: Any, **kwargs: Any) -> None:
        self._refuse("put_writes", _thread(config))

    async def aput_writes(self, config: Any, *args: Any, **kwargs: Any) -> None:
        self._refuse("aput_writes", _thread(config))

    def delete_thread(self, thread_id: str) -> None:
        self._refuse("delete_thread", thread_id)

    async def adelete_thread(self, thread_id: str) -> None:
        self._refuse("adelete_thread", thread_id)

    def delete_for_runs(self, run_ids: Any) -> None:
        self._refuse("delete_for_runs")

    async def adelete_for_runs(self, run_ids: Any) -> None:
        self._refuse("adelete_for_runs")

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._refuse("copy_thread", target_thread_id)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._refuse("acopy_thread", target_thread_id)

    def prune(self, thread_ids: Any, *, strategy: str = "keep_latest") -> None:
        self._refuse("prune")

    async def aprune(self, thread_ids: Any, *, strategy: str = "keep_latest") -> None:
        self._refuse("aprune")

    def setup(self) -> Any:
        self._refuse("setup")

    async def asetup(self) -> None:
        self._refuse("asetup")

    # Operator ops (a decision, a ledger resolve, a quarantine release) handed the view:
    # its sessions are read-only, so a write fails in the server; said as the view's
    # refusal, not a raw ReadOnlySqlTransaction (review32b).
    def _run_op(self, factory: Any, *, transaction: bool = True) -> Any:
        with _writes_refused():
            return super()._run_op(factory, transaction=transaction)  # type: ignore[misc]

    async def _arun_op(self, factory: Any, *, transaction: bool = True) -> Any:
        with _writes_refused():
            return await super()._arun_op(factory, transaction=transaction)  # type: ignore[misc]

    def _run_flow(self, flow: Any) -> Any:
        with _writes_refused():
            return super()._run_flow(flow)  # type: ignore[misc]

    async def _arun_flow(self, flow: Any) -> Any:
        with _writes_refused():
            return await super()._arun_flow(flow)  # type: ignore[misc]

    # The reader shares the saver's renewer slot and pools; closing it closes nothing.
    def close(self) -> None:
        return None

    async def aclose(self) -> None:
        return None

    def _stop_renewer(self) -> None:
        return None


class ReadOnlySyncDriver(SyncDriver):
    """The read pool's driver behind a transaction pooler, where its sessions cannot be
    ``default_transaction_read_only`` (the SET would leak to the pooler's other
    clients): every op, and every ``connection()``, runs in a ``READ ONLY``
    transaction, so a reader cannot write even when the pooler leads to a primary (a
    promoted standby, the primary itself)."""

    def _attempt(self, conn: Any, started: Any, transaction: bool, after: Any, attempt: int) -> Any:
        with conn.transaction():
            conn.execute(READ_ONLY_TX_SQL)
            return super()._attempt(conn, started, False, after, attempt)

    @contextmanager
    def connection(self) -> Iterator[Any]:
        with super().connection() as conn, conn.transaction():
            conn.execute(READ_ONLY_TX_SQL)
            yield conn


class ReadOnlyAsyncDriver(AsyncDriver):
    """``ReadOnlySyncDriver`` for the async saver's read pool."""

    async def _attempt(self, conn: Any, started: Any, transaction: bool, after: Any, attempt: int) -> Any:
        async with conn.transaction():
            await conn.execute(READ_ONLY_TX_SQL)
            return await super()._attempt(conn, started, False, after, attempt)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        async with super().connection() as conn, conn.transaction():
            await conn.execute(READ_ONLY_TX_SQL)
            yield conn


def _thread(config: Any) -> Any:
    return ((config or {}).get("configurable") or {}).get("thread_id")


def make_reader(saver: Any, driver: Any, lag: ReadLag, *, conninfo: str | None, pooler: Any) -> Any:
    """The reader: a shallow copy of ``saver`` (its serde, codec, schema, caches) of the
    saver's reader class, running its reads on ``driver``."""
    view = copy.copy(saver)
    view.__class__ = saver._reader_class
    view._driver = driver
    view.read_lag = lag
    view._origin = getattr(saver, "_origin", saver)
    if conninfo is not None:
        view._conninfo = conninfo
        view.pooler = pooler
    return view


def after_write_lag(lag: ReadLag) -> ReadLag:
    """The primary, because the standby has not replayed this process's last write."""
    return replace(lag, source="primary", after_write=True)


def fallback_lag(lag: ReadLag) -> ReadLag:
    return replace(lag, source="primary", fell_back=True)


def unanswered_lag(settings: ReadOptions, error: BaseException) -> ReadLag:
    """read_fallback and a standby that does not answer: the primary, saying why."""
    reason = getattr(error, "fields", {}).get("reason") or type(error).__name__
    return ReadLag(
        "primary", server_of(settings.dsn or ""), None, None, None, False, True,
        settings.max_lag, fell_back=True, standby_error=str(reason),
    )


def primary_lag(settings: ReadOptions) -> ReadLag:
    """No read_dsn: reads go to the primary, nothing to measure."""
    return ReadLag("primary", None, None, 0.0, None, False, True, settings.max_lag)



class ReadSlot:
    """The read_dsn state a saver and its clones (``bind()``, ``with_allowlist``) share:
    the settings, and once opened the pool, its driver, conninfo and pooler mode."""

    def __init__(self, settings: ReadOptions) -> None:
        import threading

        self.settings = settings
        self.lock = threading.Lock()
        self.pool: Any = None
        self.driver: Any = None
        self.conninfo: str | None = None
        self.pooler: Any = None

    def opened(self, pool: Any, driver: Any, conninfo: str, pooler: Any) -> None:
        self.pool, self.driver, self.conninfo, self.pooler = pool, driver, conninfo, pooler
