"""Lease owner ids: the one place that makes them (``new_owner_id``) and judges them
(``owner_is_dead``). An owner is ``host:pid:incarnation:namespace:random``."""

from __future__ import annotations

import os
import secrets
import socket
import sys


def _start_ticks(pid: int) -> str | None:
    """When ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat`` field 22):
    fixed for the life of the process, whatever the wall clock does. None: no such
    process (or no /proc), or one that has exited and not yet been reaped (a zombie,
    state Z or X: a SIGKILLed child whose parent has not called wait() yet holds nothing
    any more, but its /proc entry, start ticks included, stays until it is reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        # Field 2 (the command name) may hold spaces and parentheses: count from the
        # last ')'; the field after it is field 3 (the state), so field 22 is the 20th.
        fields = data[data.rindex(b")") + 2 :].split()
        if fields[0] in (b"Z", b"X"):
            return None
        return fields[19].decode()
    except (OSError, ValueError, IndexError):
        return None


_HAS_PROC = _start_ticks(os.getpid()) is not None


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return data[data.rindex(b")") + 2 :].split()[0] in (b"Z", b"X")
    except (OSError, ValueError, IndexError):
        return False


def _no_such_pid(pid: int) -> bool:
    """No process has ``pid`` in our namespace (signal 0 answers ESRCH). Asked when its
    /proc entry cannot be read: /proc mounted with ``hidepid`` hides other users' live
    processes (the entry is missing), which must never read as "dead"; signal 0 is not
    filtered that way (EPERM: it exists, someone else's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def _legacy_incarnation(pid: int) -> str | None:
    """``<boot time>.<start time in centiseconds>`` from psutil: the form owner ids had
    before 2026-12 and still have where there is no /proc. Both parts are wall-clock
    times (psutil adds the process's ticks to the kernel's boot time, which moves when
    the clock is stepped or slewed), so they are compared with a tolerance."""
    try:
        import psutil

        return f"{int(psutil.boot_time())}.{int(psutil.Process(pid).create_time() * 100)}"
    except Exception:  # no such process, or no permission to look
        return None


def _incarnation(pid: int) -> str | None:
    """Tells a live process from a reused pid: ``<boot time>.k<start ticks>``, where the
    ticks since boot never change (the boot time, informational, can). Not psutil's
    create time: that is boot time + ticks, and the kernel's boot time moves with the
    wall clock (NTP slewing, a step), so a live process's create time read later could
    differ from the one in its owner id, and it would look like a younger process on
    the same pid, i.e. provably dead: its lease taken over while it runs."""
    if not _HAS_PROC:
        return _legacy_incarnation(pid)
    ticks = _start_ticks(pid)
    if ticks is None:
        return None
    try:
        import psutil

        boot = str(int(psutil.boot_time()))
    except Exception:
        boot = "1"
    return f"{boot}.k{ticks}"


# Two wall-clock readings of one boot or one process start (legacy owner ids) closer
# than this are the same: a reboot, or a pid reused by a process started within 2 s of
# the one that held it (which had to exit and the pid counter wrap meanwhile), does not
# happen that fast; the kernel's boot time moves by far less between two readings.
_LEGACY_TOLERANCE_S = 2


_PROCESS_IDENTITY: str | None = None


def _namespace_identity() -> str:
    """``ns<pid-namespace inode>.<boot id>``: which pid namespace of which kernel boot
    this process's pids belong to. Containers sharing the host's hostname (Docker
    ``--network host``, Kubernetes ``hostNetwork``, ``unshare --pid``) share the kernel's
    boot time but not its pid namespace: pid 42 there is not our pid 42. Unknown parts
    are ``0``, which ``owner_is_dead`` never treats as proof of anything."""
    inode = "0"
    try:
        inode = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        if not sys.platform.startswith("linux"):
            inode = "1"  # no pid namespaces on this platform: there is only one
    boot = "0"
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip().replace("-", "") or "0"
    except OSError:
        try:
            import psutil

            boot = f"b{int(psutil.boot_time())}"
        except Exception:  # no way to tell boots apart
            boot = "0"
    return f"ns{inode}.{boot}"


def process_identity() -> str:
    """``host:pid:incarnation:namespace`` of this process, the prefix of every lease
    owner it uses (see ``owner_is_dead`` for how it is judged)."""
    global _PROCESS_IDENTITY
    pid = os.getpid()
    if _PROCESS_IDENTITY is None or f":{pid}:" not in _PROCESS_IDENTITY:  # refreshed after fork
        _PROCESS_IDENTITY = (
            f"{socket.gethostname()}:{pid}:{_incarnation(pid) or '0'}:{_namespace_identity()}"
        )
    return _PROCESS_IDENTITY


def _owner_id() -> str:
    # Not uuid.uuid4(): tests (LangGraph's own, deterministic_uuids) patch it to number
    # message ids, and one draw per run start here shifted every id they expect.
    return f"{process_identity()}:{secrets.token_hex(6)}"


def owner_is_dead(owner: str | None) -> bool:
    """True only when ``owner`` provably belongs to a process that is gone: same host
    name, same pid namespace of the same kernel boot (so its pid means the same process
    here), and no such pid, or the pid now belongs to a younger process. Anything
    uncertain is False and the lease must expire: another machine, another container
    sharing our hostname, an owner id without a namespace (written by an older version
    of this package), a part we could not read. This lets the common single-machine
    case (a crash, then ``invoke(None)`` in a new process) resume at once instead of
    waiting out ``lease_ttl``; the takeover still bumps the fencing token."""
    if not owner:
        return False
    parts = owner.split(":")
    if len(parts) < 5 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return False
    pid, recorded, namespace = int(parts[1]), parts[2], parts[3]
    mine = process_identity().split(":")
    inode, _, boot_id = namespace[2:].partition(".")
    if namespace != mine[3] or not namespace.startswith("ns") or "0" in (inode, boot_id):
        # Another pid namespace (or kernel boot), or one we could not identify: its
        # pid is not ours to look up.
        return False
    if pid == os.getpid():
        return False
    if recorded == "0" or "." not in recorded:
        return False
    boot, _, started = recorded.partition(".")
    if started.startswith("k"):
        if not _HAS_PROC:
            return False
        current = _start_ticks(pid)
        if current is None:
            # No readable entry in our (the same) namespace of the same boot (the
            # namespace part names the boot): gone if it is a zombie or no process has
            # the pid; an entry hidden from us (hidepid) is not proof of anything.
            return _zombie(pid) or _no_such_pid(pid)
        # It is ours only if it started when ours did (else the pid was reused).
        return current != started[1:]
    return _legacy_is_dead(pid, boot, started)


def _legacy_is_dead(pid: int, boot: str, started: str) -> bool:
    """``owner_is_dead`` for an owner id of the legacy form (see _legacy_incarnation)."""
    try:
        boot_s, started_cs = int(boot), int(started)
    except ValueError:
        return False
    current = _legacy_incarnation(pid)
    if current is None:
        # No such process. Conclusive if this is the same boot of the machine too.
        mine = _legacy_incarnation(os.getpid())
        return mine is not None and abs(int(mine.split(".", 1)[0]) - boot_s) <= _LEGACY_TOLERANCE_S
    now_cs = int(current.split(".", 1)[1])
    return abs(now_cs - started_cs) > _LEGACY_TOLERANCE_S * 100


# The public name of the one owner-id maker (the ledger and the recovery worker make
# theirs with it too, once they import it from here).
new_owner_id = _owner_id
