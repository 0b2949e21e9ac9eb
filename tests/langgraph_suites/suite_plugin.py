"""pytest plugin that runs LangGraph's own test suites against the stock or the durable savers.

Loaded by ``run.py`` with ``-p suite_plugin`` inside an unpacked sdist (``langgraph`` or
``langgraph-checkpoint-postgres``); nothing of theirs is edited. ``--lgd-saver=stock`` runs
their postgres checkpointers (pointed at our server); ``--lgd-saver=durable`` substitutes the
durable savers *through the suites' own fixtures* (``--lgd-policy`` gives them a checkpoint
policy, issue 16):

* langgraph (``tests/conftest.py``): the ``sync_checkpointer`` / ``async_checkpointer``
  fixtures call module globals ``_checkpointer_postgres``, ``_checkpointer_postgres_pipe``,
  ``_checkpointer_postgres_pool`` and the ``_aio`` trio. In both modes those globals are
  rebound to builders below: the stock ones are theirs line for line, the durable ones
  mirror them connection for connection (from the conn string; one connection in pipeline
  mode; a pool opened by the test). Both take their database from ``_Databases`` (emptied
  databases reused per xdist worker instead of CREATE/DROP DATABASE per test: the one
  speed-up, the same for both modes; ``--lgd-db=fresh`` turns it off).
* langgraph-checkpoint-postgres (``tests/test_sync.py``, ``tests/test_async.py``): their
  module-level ``_saver`` helpers construct ``PostgresSaver(conn)``,
  ``PostgresSaver(conn, pipe=pipe)``, ``PostgresSaver(pool)`` (async likewise); the names
  ``PostgresSaver`` / ``AsyncPostgresSaver`` in those modules are rebound to the durable classes.

Both modes run the same selection (see ``pytest_collection_modifyitems``): only parameters
that exercise a Postgres checkpointer, so that stock and durable run the same test ids.

THE ONE NORMALISATION: the durable saver stamps ``graph_version`` on every checkpoint's
metadata (it is how the version check works). LangGraph's suites compare metadata exactly, so
``_hide_graph_version`` removes that key, and only that key, from what ``get_tuple`` /
``list`` / ``aget_tuple`` / ``alist`` return. Nothing else is hidden or adapted: the stock
call patterns (``Saver(conn, pipe=pipe)``, ``await saver.setup()``) reach the durable classes
unchanged.
"""

from __future__ import annotations

import ast
import json
import os
import secrets
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _pytest._code.source import getstatementrange_ast
from psycopg import AsyncConnection, Connection
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_durable import AsyncDurablePostgresSaver, DurablePostgresSaver, ReworkBudget
from langgraph_durable.versioning import VERSION_KEY

DEFAULT_BASE = "postgresql://postgres@127.0.0.1:5432/"

# Durable savers built in this process: proves the substitution took (the runner requires
# it to be 0 for stock runs and > 0 for durable runs).
_built = [0]


_normalise = True  # --lgd-keep-graph-version turns it off (to count what it hides)
_policy: Any = None  # --lgd-policy: the checkpoint_policy every durable saver gets


def _options(options: dict[str, Any]) -> dict[str, Any]:
    if _policy is not None and options.get("checkpoint_policy") is None:
        options["checkpoint_policy"] = _policy
    return options


def _hide_graph_version(tup: Any) -> Any:
    """The one documented normalisation (see the module docstring)."""
    if _normalise and tup is not None and isinstance(tup.metadata, dict) and VERSION_KEY in tup.metadata:
        metadata = {k: v for k, v in tup.metadata.items() if k != VERSION_KEY}
        return tup._replace(metadata=metadata)
    return tup


class SuiteDurablePostgresSaver(DurablePostgresSaver):
    """``DurablePostgresSaver`` (stock constructor: conn, pipe, serde), ``graph_version`` hidden."""

    def __init__(self, conn: Any, pipe: Any = None, serde: Any = None, **options: Any) -> None:
        super().__init__(conn, pipe, serde, **_options(options))
        _built[0] += 1

    def get_tuple(self, config: Any) -> Any:
        return _hide_graph_version(super().get_tuple(config))

    def list(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        for tup in super().list(*args, **kwargs):
            yield _hide_graph_version(tup)

    async def aget_tuple(self, config: Any) -> Any:
        return _hide_graph_version(await super().aget_tuple(config))

    async def alist(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async for tup in super().alist(*args, **kwargs):
            yield _hide_graph_version(tup)


class SuiteAsyncDurablePostgresSaver(AsyncDurablePostgresSaver):
    """``AsyncDurablePostgresSaver`` (stock constructor), ``graph_version`` hidden."""

    def __init__(self, conn: Any, pipe: Any = None, serde: Any = None, **options: Any) -> None:
        super().__init__(conn, pipe, serde, **_options(options))
        _built[0] += 1

    def get_tuple(self, config: Any) -> Any:
        return _hide_graph_version(super().get_tuple(config))

    def list(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        for tup in super().list(*args, **kwargs):
            yield _hide_graph_version(tup)

    async def aget_tuple(self, config: Any) -> Any:
        return _hide_graph_version(await super().aget_tuple(config))

    async def alist(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async for tup in super().alist(*args, **kwargs):
            yield _hide_graph_version(tup)


# ---------------------------------------------------------------- databases
# Database names come from secrets, not uuid4: some tests mock uuid.uuid4 (deterministic_uuids).
_base = DEFAULT_BASE
_db_mode = "reuse"  # --lgd-db


class _Databases:
    """The databases of this process (one xdist worker): a test takes an empty one, its
    builder gives it back, and it is emptied for the next test.

    Why: the suites' fixtures create and drop a database for every test. CREATE DATABASE
    copies ``template1`` through the WAL (PostgreSQL 15), and the first connection of a new
    database builds its catalog caches: together most of the PostgreSQL CPU of a suite run
    (measured: tests/langgraph_suites/README.md). Reuse instead: after a test, every other
    session of its database is terminated (what ``DROP DATABASE ... WITH (FORCE)`` does) and
    every table but the ``*_migrations`` ones that is not empty is truncated (``RESTART
    IDENTITY``; a table owning a sequence always is), so the
    next test starts from the state a fresh database has right after ``setup()``; its own
    ``setup()`` then takes the already-migrated path. A database whose catalog (relations,
    functions, schemas) differs from the first one emptied, or that cannot be emptied, is
    dropped instead of reused. ``--lgd-db=fresh`` restores one new database per test.
    """

    SIGNATURE_SQL = """
        SELECT 'rel', n.nspname::text, c.relname::text || ':' || c.relkind::text
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%'
           AND n.nspname NOT LIKE 'pg_temp%'
        UNION ALL
        SELECT 'fn', n.nspname::text, p.proname::text || '(' || pg_get_function_identity_arguments(p.oid) || ')'
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
        UNION ALL
        SELECT 'ns', nspname::text, '' FROM pg_namespace
         WHERE nspname NOT IN ('pg_catalog', 'information_schema', 'public')
           AND nspname NOT LIKE 'pg_toast%' AND nspname NOT LIKE 'pg_temp%'
        ORDER BY 1, 2, 3
    """
    # Each table, and whether it owns a sequence (serial, identity): those are always
    # truncated (RESTART IDENTITY), the others only when not empty (see _empty).
    TABLES_SQL = """
        SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname),
               EXISTS (SELECT FROM pg_depend d JOIN pg_class s ON s.oid = d.objid
                        WHERE d.classid = 'pg_class'::regclass AND d.refobjid = c.oid
                          AND s.relkind = 'S' AND d.deptype IN ('a', 'i'))
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema')
           AND n.nspname NOT LIKE 'pg_toast%' AND c.relname NOT LIKE '%\\_migrations'
    """

    def __init__(self) -> None:
        self.free: list[str] = []
        self.signature: list[tuple[str, ...]] | None = None
        self.stats = {"created": 0, "reused": 0, "dropped_dirty": 0, "truncated": 0, "left_empty": 0}
        self._conn: Connection[Any] | None = None  # to the server's maintenance database

    def _admin(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        if self._conn is None or self._conn.closed:
            self._conn = Connection.connect(_base, autocommit=True)
        try:
            cur = self._conn.execute(sql, params)
        except psycopg.OperationalError:
            self._conn.close()  # a broken connection: the next call opens another
            raise
        return cur.fetchall() if cur.description else []

    def acquire(self) -> str:
        if self.free:
            self.stats["reused"] += 1
            return self.free.pop()
        name = f"lgd_suite_{secrets.token_hex(8)}"
        self._admin(f"CREATE DATABASE {name}")
        self.stats["created"] += 1
        return name

    def release(self, name: str) -> None:
        if _db_mode == "reuse":
            try:
                if self._empty(name):
                    self.free.append(name)
                    return
                self.stats["dropped_dirty"] += 1
            except psycopg.Error as exc:
                self.stats["dropped_dirty"] += 1
                if self.stats["dropped_dirty"] == 1:
                    print(f"lgd-suite: could not empty database {name}: {exc!r}", file=sys.stderr)
        self.drop(name)

    def drop(self, name: str) -> None:
        self._admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def _empty(self, name: str) -> bool:
        """Terminate the test's leftover sessions and truncate its tables; False if the
        database's catalog is not the one every reused database must have."""
        others = "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
        self._admin(f"SELECT pg_terminate_backend(pid) FROM ({others}) s", (name,))
        deadline = time.monotonic() + 10
        while self._admin(others, (name,)):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        with Connection.connect(_base + name, autocommit=True) as conn:
            signature = [tuple(r) for r in conn.execute(self.SIGNATURE_SQL).fetchall()]
            if not signature:
                return False  # the test failed before setup(): start over
            if self.signature is None:
                self.signature = signature
            elif signature != self.signature:
                return False
            # Only the tables the test left rows in (and those owning a sequence): a
            # TRUNCATE costs the server about 1 ms per table (a new file for the table and
            # each index) and the durable schema has 12; test_pregel.py + test_large_cases.py
            # with the durable saver left 1842 of 5148 empty (36%, counted in the stats
            # below). The probe of all of them costs about what one TRUNCATE does.
            rows = conn.execute(self.TABLES_SQL).fetchall()
            tables = [t for t, owns_sequence in rows if owns_sequence]
            probe = [t for t, owns_sequence in rows if not owns_sequence]
            if probe:
                query = " UNION ALL ".join(f"SELECT {i} WHERE EXISTS (SELECT FROM {t})" for i, t in enumerate(probe))
                tables += [probe[r[0]] for r in conn.execute(query).fetchall()]
            self.stats["truncated"] += len(tables)
            self.stats["left_empty"] += len(rows) - len(tables)
            if tables:
                conn.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")
        return True

    def close(self) -> None:
        while self.free:
            try:
                self.drop(self.free.pop())
            except psycopg.Error:
                pass
        if self._conn is not None:
            self._conn.close()


_databases = _Databases()


@contextmanager
def _database() -> Iterator[str]:
    """The URI of an empty database for one builder call (see _Databases)."""
    name = _databases.acquire()
    try:
        yield _base + name
    finally:
        _databases.release(name)


def _strict(checkpointer: Any) -> None:
    """The suites' own ``_apply_strict_msgpack`` (a no-op unless LANGGRAPH_STRICT_MSGPACK)."""
    apply = getattr(sys.modules.get("tests.conftest_checkpointer"), "_apply_strict_msgpack", None)
    if apply is not None:
        apply(checkpointer)


# ---------------------------------------------------------------- stock builders (langgraph)
# tests/conftest_checkpointer.py's builders line for line, only the database comes from
# _database() instead of CREATE DATABASE/DROP DATABASE: so that stock and durable runs differ
# in the saver alone. The classes are the ones that module imported.
def _stock(name: str) -> Any:
    return getattr(sys.modules["tests.conftest_checkpointer"], name)


@contextmanager
def _stock_postgres() -> Iterator[Any]:
    with _database() as uri, _stock("PostgresSaver").from_conn_string(uri) as checkpointer:
        checkpointer.setup()
        _strict(checkpointer)
        yield checkpointer


@contextmanager
def _stock_postgres_pipe() -> Iterator[Any]:
    with _database() as uri, _stock("PostgresSaver").from_conn_string(uri) as checkpointer:
        checkpointer.setup()
        with checkpointer.conn.pipeline() as pipe:
            checkpointer.pipe = pipe
            _strict(checkpointer)
            yield checkpointer


@contextmanager
def _stock_postgres_pool() -> Iterator[Any]:
    with _database() as uri, ConnectionPool(uri, max_size=10, kwargs={"autocommit": True}) as pool:
        checkpointer = _stock("PostgresSaver")(pool)
        checkpointer.setup()
        _strict(checkpointer)
        yield checkpointer


@asynccontextmanager
async def _stock_postgres_aio() -> AsyncIterator[Any]:
    with _database() as uri:
        async with _stock("AsyncPostgresSaver").from_conn_string(uri) as checkpointer:
            await checkpointer.setup()
            _strict(checkpointer)
            yield checkpointer


@asynccontextmanager
async def _stock_postgres_aio_pipe() -> AsyncIterator[Any]:
    with _database() as uri:
        async with _stock("AsyncPostgresSaver").from_conn_string(uri) as checkpointer:
            await checkpointer.setup()
            async with checkpointer.conn.pipeline() as pipe:
                checkpointer.pipe = pipe
                _strict(checkpointer)
                yield checkpointer


@asynccontextmanager
async def _stock_postgres_aio_pool() -> AsyncIterator[Any]:
    with _database() as uri:
        async with AsyncConnectionPool(uri, max_size=10, kwargs={"autocommit": True}) as pool:
            checkpointer = _stock("AsyncPostgresSaver")(pool)
            await checkpointer.setup()
            _strict(checkpointer)
            yield checkpointer


STOCK_BUILDERS = {
    "_checkpointer_postgres": _stock_postgres,
    "_checkpointer_postgres_pipe": _stock_postgres_pipe,
    "_checkpointer_postgres_pool": _stock_postgres_pool,
    "_checkpointer_postgres_aio": _stock_postgres_aio,
    "_checkpointer_postgres_aio_pipe": _stock_postgres_aio_pipe,
    "_checkpointer_postgres_aio_pool": _stock_postgres_aio_pool,
}


# ---------------------------------------------------------------- durable builders (langgraph)
@contextmanager
def _durable_postgres() -> Iterator[Any]:
    """Stock: ``PostgresSaver.from_conn_string(uri)``; durable: its ``from_conn_string``."""
    with _database() as uri, SuiteDurablePostgresSaver.from_conn_string(uri) as saver:
        saver.setup()
        yield saver


@contextmanager
def _durable_postgres_pipe() -> Iterator[Any]:
    """Stock: one connection in pipeline mode. Durable: the same, through ``pipe=``."""
    with _database() as uri, Connection.connect(
        uri, autocommit=True, prepare_threshold=0, row_factory=dict_row
    ) as conn:
        SuiteDurablePostgresSaver(conn).setup()
        with conn.pipeline() as pipe:
            yield SuiteDurablePostgresSaver(conn, pipe=pipe)


@contextmanager
def _durable_postgres_pool() -> Iterator[Any]:
    """Stock: ``PostgresSaver(ConnectionPool(..., kwargs={"autocommit": True}))``."""
    with _database() as uri, ConnectionPool(uri, max_size=10, kwargs={"autocommit": True}) as pool:
        saver = SuiteDurablePostgresSaver(pool)
        saver.setup()
        try:
            yield saver
        finally:
            saver.close()


@asynccontextmanager
async def _durable_postgres_aio() -> AsyncIterator[Any]:
    with _database() as uri:
        async with SuiteAsyncDurablePostgresSaver.from_conn_string(uri) as saver:
            await saver.setup()
            yield saver


@asynccontextmanager
async def _durable_postgres_aio_pipe() -> AsyncIterator[Any]:
    with _database() as uri:
        async with await AsyncConnection.connect(
            uri, autocommit=True, prepare_threshold=0, row_factory=dict_row
        ) as conn:
            await SuiteAsyncDurablePostgresSaver(conn).setup()
            async with conn.pipeline() as pipe:
                yield SuiteAsyncDurablePostgresSaver(conn, pipe=pipe)


@asynccontextmanager
async def _durable_postgres_aio_pool() -> AsyncIterator[Any]:
    with _database() as uri:
        async with AsyncConnectionPool(
            uri, max_size=10, kwargs={"autocommit": True}, open=False
        ) as pool:
            saver = SuiteAsyncDurablePostgresSaver(pool)
            await saver.setup()
            try:
                yield saver
            finally:
                await saver.aclose()


DURABLE_BUILDERS = {
    "_checkpointer_postgres": _durable_postgres,
    "_checkpointer_postgres_pipe": _durable_postgres_pipe,
    "_checkpointer_postgres_pool": _durable_postgres_pool,
    "_checkpointer_postgres_aio": _durable_postgres_aio,
    "_checkpointer_postgres_aio_pipe": _durable_postgres_aio_pipe,
    "_checkpointer_postgres_aio_pool": _durable_postgres_aio_pool,
}


ENCRYPTION_KEY = b"lgd-suite-key-0123456789abcdef01"


def _encrypt_every_saver() -> None:
    """--lgd-encrypted: a saver given no serializer gets LangGraph's encrypting one, in
    the stock run and the durable run alike (their results are compared), through the
    base class every checkpointer's constructor calls; a test's own serde is kept."""
    from langgraph.checkpoint.base import BaseCheckpointSaver
    from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

    base_init = BaseCheckpointSaver.__init__
    if getattr(base_init, "_lgd_encrypted", False):
        return

    def __init__(self: Any, *, serde: Any = None) -> None:
        if serde is None:
            serde = EncryptedSerializer.from_pycryptodome_aes(key=ENCRYPTION_KEY)
        base_init(self, serde=serde)

    __init__._lgd_encrypted = True  # type: ignore[attr-defined]
    BaseCheckpointSaver.__init__ = __init__  # type: ignore[method-assign]


# ---------------------------------------------------------------- pytest hooks
def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("langgraph-durable suites")
    group.addoption("--lgd-saver", choices=("stock", "durable"), default="stock")
    group.addoption(
        "--lgd-base",
        default=os.environ.get("LGD_SUITE_PG", DEFAULT_BASE),
        help="server URI ending in '/', a database name is appended",
    )
    group.addoption(
        "--lgd-keep-graph-version",
        action="store_true",
        help="do not hide metadata['graph_version'] (shows which tests see only that key)",
    )
    group.addoption(
        "--lgd-policy",
        choices=("defer", "budget"),
        default=None,
        help="durable savers: checkpoint_policy='defer' (every node deferrable) or "
        "ReworkBudget(seconds=60) (issue 16: deferral must be invisible to the suites)",
    )
    group.addoption(
        "--lgd-encrypted",
        action="store_true",
        help="every saver (stock and durable alike) built without a serializer of its own "
        "gets EncryptedSerializer.from_pycryptodome_aes (issue 27: encryption at rest)",
    )
    group.addoption(
        "--lgd-failures",
        default=None,
        help="append one JSON line per failed setup/call/teardown to this file (run.py "
        "reads them: the exception type and the site, in their test code, where it was raised)",
    )
    group.addoption(
        "--lgd-db",
        choices=("reuse", "fresh"),
        default="reuse",
        help="langgraph suites: reuse emptied databases (default) or create one per test as "
        "their fixtures do (see _Databases)",
    )


# Which fixture parameters exercise a Postgres checkpointer; everything else (memory,
# sqlite, redis caches, non-memory stores, the shallow saver, which has no durable
# counterpart) is deselected in both modes, so both run the same ids.
_CHECKPOINTER_FIXTURES = ("sync_checkpointer", "async_checkpointer")
_STORE_FIXTURES = ("sync_store", "async_store")


def _keep(item: pytest.Item, suite: str) -> bool:
    callspec = getattr(item, "callspec", None)
    params: dict[str, Any] = callspec.params if callspec is not None else {}
    if suite == "langgraph":
        names = getattr(item, "fixturenames", ())
        used = [f for f in _CHECKPOINTER_FIXTURES if f in names]
        if not used:
            return False  # no checkpointer at all: nothing of the saver under test
        if any(not str(params.get(f, "")).startswith("postgres") for f in used):
            return False
        if any(f in params and params[f] != "in_memory" for f in _STORE_FIXTURES):
            return False
        if params.get("cache") == "redis":
            return False
        return True
    return params.get("saver_name") != "shallow"


def _suite_of(config: pytest.Config) -> str:
    root = config.rootpath
    return "checkpoint-postgres" if (root / "langgraph" / "checkpoint" / "postgres").is_dir() else "langgraph"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    suite = _suite_of(config)
    keep, drop = [], []
    for item in items:
        (keep if _keep(item, suite) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


_scratch: list[str] = []


def pytest_collection_finish(session: pytest.Session) -> None:
    """Point the suites at our server and, for durable, rebind their saver names. Runs after
    every test module is imported (so their ``from x import y`` copies exist) and before any
    fixture runs; under xdist each worker does it for itself."""
    global _base, _normalise, _db_mode, _policy
    config = session.config
    _base = config.getoption("--lgd-base")
    _db_mode = config.getoption("--lgd-db")
    policy = config.getoption("--lgd-policy")
    _policy = ReworkBudget(seconds=60.0) if policy == "budget" else policy
    _normalise = not config.getoption("--lgd-keep-graph-version")
    durable = config.getoption("--lgd-saver") == "durable"
    if config.getoption("--lgd-encrypted"):
        _encrypt_every_saver()
    mods = sys.modules
    if _suite_of(config) == "langgraph":
        for name in ("tests.conftest_checkpointer", "tests.conftest_store"):
            if name in mods:
                mods[name].DEFAULT_POSTGRES_URI = _base
        conftest = mods.get("tests.conftest")
        if conftest is not None:
            # Both modes: the same database handling (_Databases), the saver alone differs.
            for name, builder in (DURABLE_BUILDERS if durable else STOCK_BUILDERS).items():
                assert hasattr(conftest, name), f"tests.conftest has no {name}: suite changed"
                setattr(conftest, name, builder)
        return
    # checkpoint-postgres: the autouse clear_test_db fixture empties tables in DEFAULT_URI's
    # database; give each worker a scratch database of its own instead of 'postgres'.
    scratch = f"lgd_suite_scratch_{secrets.token_hex(6)}"
    with psycopg.connect(_base, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {scratch}")
    _scratch.append(scratch)
    if "tests.conftest" in mods:
        mods["tests.conftest"].DEFAULT_POSTGRES_URI = _base
        mods["tests.conftest"].DEFAULT_URI = _base + scratch
    for name, cls, stock in (
        ("tests.test_sync", SuiteDurablePostgresSaver, "PostgresSaver"),
        ("tests.test_async", SuiteAsyncDurablePostgresSaver, "AsyncPostgresSaver"),
    ):
        mod = mods.get(name)
        if mod is None:
            continue
        mod.DEFAULT_POSTGRES_URI = _base
        if durable:
            assert hasattr(mod, stock), f"{name} has no {stock}: suite changed"
            setattr(mod, stock, cls)


# ---------------------------------------------------------------- failure sites
def _failure_record(item: pytest.Item, call: pytest.CallInfo[None], when: str) -> dict[str, Any]:
    """What run.py needs to judge a failure: the exception's type and the innermost frame
    of the suite's own code (file under the rootdir's ``tests/``, function, the whole
    statement's source, line), and whether the exception was raised right there (an
    ``assert`` of theirs) or deeper (in LangGraph, the saver, a library)."""
    excinfo = call.excinfo
    assert excinfo is not None
    exc = excinfo.value
    cause = exc.__cause__ or exc.__context__
    site, innermost_is_site = _site(item, excinfo.traceback)
    if site is None and isinstance(cause, StopIteration) and cause.__traceback__ is not None:
        # An async test's next(...) that found nothing: Python raises RuntimeError("coroutine
        # raised StopIteration") from the event loop's frame, with the StopIteration (and
        # the test's frame) as its cause.
        site, innermost_is_site = _site(item, pytest.ExceptionInfo.from_exception(cause).traceback)
    return {
        "nodeid": item.nodeid,
        "when": when,
        "exc_type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        # e.g. StopIteration for the RuntimeError "coroutine raised StopIteration"
        "cause_type": f"{type(cause).__module__}.{type(cause).__qualname__}" if cause is not None else None,
        "assertion": isinstance(exc, AssertionError),
        "site": site,
        "raised_at_site": innermost_is_site,
        "message": str(exc)[:300],
    }


def _site(item: pytest.Item, traceback: Any) -> tuple[dict[str, Any] | None, bool]:
    """The innermost frame of the suite's own code, and whether it is the innermost of all."""
    root = item.config.rootpath
    found: tuple[Any, str] | None = None
    innermost_is_site = False
    for entry in traceback:
        path = Path(str(entry.path))
        try:
            rel = path.resolve().relative_to(root)
        except ValueError:
            innermost_is_site = False
            continue
        if rel.parts[:1] != ("tests",):
            innermost_is_site = False
            continue
        found = (entry, rel.as_posix())
        innermost_is_site = True
    if found is None:
        return None, False
    entry, file = found
    return {"file": file, "line": entry.lineno + 1, "function": entry.name,
            "statement": _statement(entry)}, innermost_is_site


# The parsed test files, by path: pytest's ``entry.statement`` parses the whole file on
# every call (test_pregel.py is 10,000 lines, about 0.1 s a parse), and the policy run has
# hundreds of reviewed failures. Same function, same result, one parse per file.
_asts: dict[tuple[str, int], ast.AST] = {}


def _statement(entry: Any) -> str:
    """``str(entry.statement)``, with the file's AST parsed once per process."""
    try:
        source = entry.frame.code.fullsource
        if source is None or not 0 <= entry.lineno < len(source):
            return ""
        key = (str(entry.path), len(source))
        node, start, end = getstatementrange_ast(entry.lineno, source, astnode=_asts.get(key))
        _asts[key] = node
        return str(source[start:end])
    except Exception:  # source unavailable: still record the line
        return ""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    path = item.config.getoption("--lgd-failures")
    if path and report.failed and call.excinfo is not None:
        try:
            record = _failure_record(item, call, call.when)
        except Exception as exc:  # never break their run over our bookkeeping
            record = {"nodeid": item.nodeid, "when": call.when, "exc_type": "?", "assertion": False,
                      "site": None, "raised_at_site": False, "message": f"lgd-suite: {exc!r}"}
        # One file per xdist worker (``<path>.<worker>``): no two processes append to one.
        with open(f"{path}.{os.environ.get('PYTEST_XDIST_WORKER', 'main')}", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
    return report


def pytest_unconfigure(config: pytest.Config) -> None:
    _databases.close()
    for name in _scratch:
        try:
            with psycopg.connect(_base, autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        except psycopg.Error:
            pass


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: hand its counts to the controller
        workeroutput["lgd_built"] = _built[0]
        workeroutput["lgd_db"] = dict(_databases.stats)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    out = getattr(node, "workeroutput", {})
    _built[0] += out.get("lgd_built", 0)
    for k, v in out.get("lgd_db", {}).items():
        _databases.stats[k] += v


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    # A line run.py parses: which saver ran and how many durable savers were built.
    terminalreporter.write_line(
        f"lgd-suite saver={config.getoption('--lgd-saver')} durable_savers_built={_built[0]}"
    )
    stats = " ".join(f"{k}={v}" for k, v in _databases.stats.items())
    terminalreporter.write_line(f"lgd-suite databases ({config.getoption('--lgd-db')}): {stats}")
