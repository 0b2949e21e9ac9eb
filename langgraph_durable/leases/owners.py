"""Lease owner ids: the one place that makes them (``new_owner_id``) and judges them
(``owner_is_dead``). An owner is ``host:pid:incarnation:namespace:random``."""

from __future__ import annotations

import os
import secrets
import socket
import sys


def _incarnation(pid: int) -> str | None:
    """Boot time + start time of ``pid``: tells a live process from a reused pid."""
    try:
        import psutil

        return f"{int(psutil.boot_time())}.{int(psutil.Process(pid).create_time() * 100)}"
    except Exception:  # no such process, or no permission to look
        return None


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
    boot = recorded.split(".", 1)[0]
    current = _incarnation(pid)
    if current is None:
        # No such process in our (the same) namespace. Conclusive if this is the same
        # boot of the machine too.
        mine_inc = _incarnation(os.getpid())
        return mine_inc is not None and mine_inc.split(".", 1)[0] == boot
    return current != recorded


# The public name of the one owner-id maker (the ledger and the recovery worker make
# theirs with it too, once they import it from here).
new_owner_id = _owner_id
