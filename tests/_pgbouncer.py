"""A real PgBouncer in transaction pooling mode, started for a test module.

Debian 12's pgbouncer is 1.18: no prepared-statement support at all (the
``max_prepared_statements`` setting arrived in 1.21), no ``track_extra_parameters``
(search_path is not carried between server connections). Exactly what most managed
poolers look like to a client.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from psycopg import conninfo as ci


def pgbouncer_binary() -> str | None:
    return shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.path.exists(p)), None
    )


def require_pgbouncer() -> str:
    """The binary, else skip (locally) or fail (CI, tests/conftest.py): CI installs it (.ci/run)."""
    found = pgbouncer_binary()
    if found is None:
        from conftest import require_or_skip

        require_or_skip("pgbouncer is not installed (apt-get install pgbouncer; CI installs it)")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def pgbouncer(server_dsn: str, *, users: tuple[str, ...] = ("postgres",), pool_size: int = 20) -> Iterator[str]:
    """Run pgbouncer (pool_mode=transaction) in front of the server of ``server_dsn``;
    yield ``server_dsn`` rewritten to go through it."""
    binary = require_pgbouncer()
    params = ci.conninfo_to_dict(server_dsn)
    home = Path(tempfile.mkdtemp(prefix="lgd-pgbouncer-"))
    port = _free_port()
    (home / "users.txt").write_text("".join(f'"{u}" ""\n' for u in users))
    (home / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={params.get('host', '127.0.0.1')} port={params.get('port', 5432)}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {home / 'users.txt'}\n"
        "pool_mode = transaction\n"
        f"default_pool_size = {pool_size}\n"
        "max_client_conn = 1000\n"
        "server_reset_query =\n"
        # psycopg sends none of these by default; a client library that does would be
        # refused without this line (pgbouncer forwards only what it tracks).
        "ignore_startup_parameters = extra_float_digits\n"
        f"logfile = {home / 'pgbouncer.log'}\n"
        f"pidfile = {home / 'pgbouncer.pid'}\n"
    )
    cmd = [binary, str(home / "pgbouncer.ini")]
    if os.geteuid() == 0:
        # pgbouncer refuses to run as root.
        os.chmod(home, 0o777)
        for f in home.iterdir():
            os.chmod(f, 0o666)
        cmd[1:1] = ["-u", "postgres"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    through = ci.make_conninfo(server_dsn, host="127.0.0.1", port=str(port))
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with psycopg.connect(through, connect_timeout=2, prepare_threshold=None) as c:
                    c.execute("SELECT 1")
                break
            except psycopg.OperationalError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log = (home / "pgbouncer.log").read_text() if (home / "pgbouncer.log").exists() else ""
                    pytest.fail(f"pgbouncer did not start (exit {proc.poll()}):\n{log[-3000:]}")
                time.sleep(0.1)
        yield through
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(home, ignore_errors=True)
