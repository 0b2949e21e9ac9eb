"""A throwaway primary + streaming standby from the local PostgreSQL binaries (not a test module).

Two clusters under one temp dir, on free loopback ports: ``initdb`` the primary,
``pg_basebackup -R`` the standby (it streams from the primary), optionally synchronous
(``synchronous_standby_names = '*'``, ``synchronous_commit = on``). As root, every
PostgreSQL binary runs as the ``postgres`` OS user (``runuser``), in a dir it owns.

``Pair.kill_primary()`` SIGKILLs the primary's postmaster and every process of it at the
same instant (a lost machine: no backend lingers to finish a COMMIT), ``Pair.promote()``
promotes the standby. ``Pair.destroy()`` (also at interpreter exit) kills whatever is
left with SIGKILL and removes the temp dir, so a failed test leaves nothing running.
"""

from __future__ import annotations

import atexit
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import psycopg

BINDIR_CANDIDATES = ("/usr/lib/postgresql/15/bin",)
_LIVE: list[Pair] = []


def find_bindir() -> Path | None:
    env = os.environ.get("LGD_PG_BINDIR")
    for cand in ([env] if env else []) + list(BINDIR_CANDIDATES):
        p = Path(cand)
        if all((p / b).exists() for b in ("initdb", "pg_ctl", "pg_basebackup", "postgres")):
            return p
    found = shutil.which("pg_basebackup")
    if found and (Path(found).parent / "initdb").exists():
        return Path(found).parent
    return None


def missing_reason() -> str | None:
    """Why the failover tests cannot run here (None: they can)."""
    if find_bindir() is None:
        return "PostgreSQL server binaries (initdb, pg_ctl, pg_basebackup) not found; set LGD_PG_BINDIR"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' OS user to run the servers"
        if shutil.which("runuser") is None:
            return "running as root and runuser is missing"
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_pg(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


def _run(cmd: list[str], timeout: float = 60.0) -> str:
    proc = subprocess.run(_as_pg(cmd), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr or proc.stdout}")
    return proc.stdout


@dataclass
class Node:
    bindir: Path
    datadir: Path
    port: int
    name: str

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres connect_timeout=3"

    def start(self) -> None:
        log = self.datadir.parent / f"{self.name}.log"
        _run([
            str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-l", str(log), "-w", "-t", "30",
            "-o", f"-p {self.port} -c listen_addresses=127.0.0.1 "
                  f"-c unix_socket_directories={self.datadir.parent}",
            "start",
        ])

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.datadir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def processes(self) -> list[psutil.Process]:
        pid = self.postmaster_pid()
        if pid is None:
            return []
        try:
            pm = psutil.Process(pid)
            return [pm, *pm.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def kill9(self) -> float:
        """SIGKILL the postmaster and all its children at once (a lost host); returns the
        wall time of the first SIGKILL."""
        procs = self.processes()
        at = time.time()
        # pg_ctl makes the postmaster a process group leader (setsid): one killpg
        # stops them all in the same instant, no backend finishes a COMMIT meanwhile.
        if procs and os.getpgid(procs[0].pid) == procs[0].pid:
            os.killpg(procs[0].pid, signal.SIGKILL)
        for p in procs:
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        # Gone or a zombie (in a container nobody may reap the daemonized postmaster).
        deadline = time.monotonic() + 10
        for p in procs:
            while time.monotonic() < deadline:
                try:
                    if p.status() == psutil.STATUS_ZOMBIE:
                        break
                except psutil.NoSuchProcess:
                    break
                time.sleep(0.01)
        return at

    def walreceiver(self) -> psutil.Process | None:
        for p in self.processes()[1:]:
            try:
                if "walreceiver" in " ".join(p.cmdline()):
                    return p
            except psutil.NoSuchProcess:
                continue
        return None

    def promote(self) -> None:
        _run([str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-w", "-t", "30", "promote"])

    def log(self) -> str:
        try:
            return (self.datadir.parent / f"{self.name}.log").read_text()[-4000:]
        except OSError:
            return ""


@dataclass
class Pair:
    root: Path
    primary: Node
    standby: Node
    synchronous: bool
    _destroyed: bool = field(default=False)

    def multi_dsn(self, dbname: str = "postgres") -> str:
        """Both hosts, writes only to the one that accepts them (libpq tries them in order)."""
        return (
            f"host=127.0.0.1,127.0.0.1 port={self.primary.port},{self.standby.port} "
            f"user=postgres dbname={dbname} target_session_attrs=read-write connect_timeout=2"
        )

    def wait_streaming(self, timeout: float = 30.0) -> None:
        """Until the primary reports the standby streaming (and sync when synchronous)."""
        want = "sync" if self.synchronous else "async"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with psycopg.connect(self.primary.dsn, autocommit=True) as conn:
                rows = conn.execute("SELECT state, sync_state FROM pg_stat_replication").fetchall()
            if any(r[0] == "streaming" and r[1] == want for r in rows):
                return
            time.sleep(0.1)
        raise RuntimeError(f"standby not streaming ({want}) after {timeout}s: {self.standby.log()}")

    def kill_primary(self) -> float:
        return self.primary.kill9()

    def promote(self) -> None:
        self.standby.promote()

    def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        for node in (self.primary, self.standby):
            for p in node.processes():
                try:
                    p.send_signal(signal.SIGCONT)  # a SIGSTOPped walreceiver must die too
                    p.send_signal(signal.SIGKILL)
                except psutil.NoSuchProcess:
                    pass
        time.sleep(0.1)
        shutil.rmtree(self.root, ignore_errors=True)
        if self in _LIVE:
            _LIVE.remove(self)


def free_port_in(low: int, high: int) -> int:
    """A free loopback port in [low, high] (a test's own range, clear of other runs)."""
    for port in range(low, high + 1):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return free_port()


def make_pair(*, synchronous: bool, ports: tuple[int, int] | None = None) -> Pair:
    """Start a primary and a streaming standby; the caller must ``destroy()`` it.
    ``ports``: the range to take both ports from (default: any free port)."""
    bindir = find_bindir()
    assert bindir is not None, missing_reason()
    root = Path(tempfile.mkdtemp(prefix="lgd-ha-"))
    os.chmod(root, 0o755)
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        os.chown(root, pw.pw_uid, pw.pw_gid)
    first = free_port_in(*ports) if ports else free_port()
    second = free_port_in(first + 1, ports[1]) if ports else free_port()
    primary = Node(bindir, root / "primary", first, "primary")
    standby = Node(bindir, root / "standby", second, "standby")
    pair = Pair(root, primary, standby, synchronous)
    _LIVE.append(pair)
    try:
        _run([str(bindir / "initdb"), "-D", str(primary.datadir), "-U", "postgres",
              "-A", "trust", "--no-sync", "-E", "UTF8", "--locale=C"])
        conf = [
            "wal_level = replica",
            "max_wal_senders = 5",
            "hot_standby = on",
            "max_connections = 60",
            # The old primary is never restarted, so fsync buys nothing here; the
            # standby is fsync'd by the same setting after promotion (a process kill,
            # not a power loss, is what the tests simulate).
            "fsync = off",
            "wal_receiver_status_interval = 1s",
            "wal_sender_timeout = 10s",
            "log_min_messages = warning",
        ]
        if synchronous:
            conf += ["synchronous_standby_names = '*'", "synchronous_commit = on"]
        with open(primary.datadir / "postgresql.conf", "a") as f:
            f.write("\n".join(conf) + "\n")
        primary.start()
        _run([str(bindir / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port),
              "-U", "postgres", "-D", str(standby.datadir), "-R", "-X", "stream", "--no-sync"])
        with open(standby.datadir / "postgresql.conf", "a") as f:
            # The base backup copied the primary's postgresql.conf. Once promoted, this
            # node has no standby of its own: left at '*', every commit would wait for
            # one for ever (what RPO 0 means when the last replica is gone).
            f.write("cluster_name = 'standby'\nsynchronous_standby_names = ''\n")
        standby.start()
        pair.wait_streaming()
    except BaseException:
        pair.destroy()
        raise
    return pair


@atexit.register
def _cleanup() -> None:
    for pair in list(_LIVE):
        pair.destroy()
