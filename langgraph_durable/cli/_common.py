"""Shared pieces of the CLI: the --dsn option, opening a saver, output helpers."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer

from langgraph_durable.embedded import ENV_DSN, resolve_dsn

if TYPE_CHECKING:
    from rich.console import Console


class _LazyConsole:
    """A rich ``Console`` built on first use: importing rich costs ~0.1 s, which
    ``--help`` and the JSON output paths should not pay."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._console: Console | None = None

    def resolve(self) -> Console:
        if self._console is None:
            from rich.console import Console

            stream = sys.stderr if self._options.get("stderr") else sys.stdout
            self._console = Console(width=_off_terminal_width(stream), **self._options)
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self.resolve(), name)

    # Special methods bypass __getattr__: `with console.status(...)` works through the
    # attribute, but `with console:` (a progress display) needs these.
    def __enter__(self) -> Console:
        return self.resolve().__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.resolve().__exit__(*exc)


def escape(text: str) -> str:
    """Text, not markup: an install hint's ``[console]`` extra, a thread id or a value with
    brackets prints as it is (rich would take ``[console]`` for a style and drop it).
    rich.markup is imported on use, as the consoles are."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def _off_terminal_width(stream: Any) -> int | None:
    """Output piped to a file, ``less`` or ``grep`` is as wide as its rows: off a terminal rich
    assumes 80 columns and crops a table's right-hand columns. ``COLUMNS``, if set, wins."""
    isatty = getattr(stream, "isatty", None)
    if os.environ.get("COLUMNS") or (isatty is not None and isatty()):
        return None
    return _PIPED_WIDTH


_PIPED_WIDTH = 4096
console: Any = _LazyConsole()
# soft_wrap: an error is one line however long (a DSN, a server's message), never cut
# at the terminal's width (80 columns when piped) into several.
err_console: Any = _LazyConsole(stderr=True, soft_wrap=True)

DsnOption = Annotated[
    str | None,
    typer.Option(
        "--dsn",
        envvar=ENV_DSN,
        help="PostgreSQL DSN (default: $LANGGRAPH_DURABLE_DSN; 'embedded' for the local "
        "embedded PostgreSQL).",
        show_default=False,
    ),
]
SchemaOption = Annotated[
    str | None, typer.Option("--schema", help="Postgres schema holding the tables.")
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]

# Reads off the primary (core/reader.py): the read commands and the console take these.
# The names, not core.reader's constants: importing it here would load psycopg for --help.
ENV_READ_DSN = "LANGGRAPH_DURABLE_READ_DSN"
ENV_READ_MAX_LAG = "LANGGRAPH_DURABLE_READ_MAX_LAG"
ENV_READ_FALLBACK = "LANGGRAPH_DURABLE_READ_FALLBACK"
ReadDsnOption = Annotated[
    str | None,
    typer.Option(
        "--read-dsn",
        envvar=ENV_READ_DSN,
        help="A streaming standby to read from instead of the primary (default: "
        "$LANGGRAPH_DURABLE_READ_DSN); its replay lag is printed on stderr.",
        show_default=False,
    ),
]
ReadMaxLagOption = Annotated[
    float,
    typer.Option(
        "--read-max-lag",
        envvar=ENV_READ_MAX_LAG,
        min=0,
        metavar="SECONDS",
        help="Warn when the standby is more than this many seconds behind.",
    ),
]
ReadFallbackOption = Annotated[
    bool,
    typer.Option(
        "--read-fallback",
        envvar=ENV_READ_FALLBACK,
        help="Read the primary instead when the standby is more than --read-max-lag behind.",
    ),
]
# Encryption keys (docs/encryption.md "Operators"): a file of keys, one a line, the
# current first, then the old ones; every command that opens a saver reads it from
# LANGGRAPH_DURABLE_KEY_FILE (or --key-file where a command has it), and without one
# LangGraph's LANGGRAPH_AES_KEY. Without a key, encrypted values are shown as encrypted.
KEY_FILE_ENV = "LANGGRAPH_DURABLE_KEY_FILE"
KEY_FILE_FLAG: list[str | None] = [None]  # the top-level --key-file of this invocation
KeyFileOption = Annotated[
    str | None,
    typer.Option(
        "--key-file",
        help="File of encryption keys, one a line: the current key first, then old ones "
        "(raw text as LANGGRAPH_AES_KEY, or hex:/base64: prefixed; a digest:KEY line is "
        "deprecated: read only for rows written before the stored digest secret). Default: "
        "$LANGGRAPH_DURABLE_KEY_FILE, else $LANGGRAPH_AES_KEY.",
    ),
]


class Reads:
    """Where a read command reads: ``--read-dsn`` (None: the primary), the lag above
    which it warns, and whether it then reads the primary instead."""

    def __init__(self, dsn: str | None = None, max_lag: float = 10.0, fallback: bool = False) -> None:
        self.dsn, self.max_lag, self.fallback = dsn, max_lag, fallback


def say_where(reader: Any) -> None:
    """The line on stderr that says where a read command read and how far behind that
    is; loud above --read-max-lag. Nothing when there is no read_dsn."""
    lag = getattr(reader, "read_lag", None)
    if lag is None or lag.server is None:
        return
    if lag.over and not lag.fell_back:
        err_console.print(
            f"[bold yellow]warning:[/] {escape(lag.describe())}, over --read-max-lag "
            f"{lag.max_lag:g} s: what follows may be out of date (--read-fallback reads the "
            "primary)",
            highlight=False,
        )
    elif lag.fell_back:
        err_console.print(f"[yellow]note:[/] {escape(lag.describe())}", highlight=False)
    else:
        err_console.print(f"[dim]{escape(lag.describe())}[/]", highlight=False)


def _parse_key(line: str, path: str, number: int) -> bytes:
    import base64
    import binascii

    from langgraph_durable.errors import ConfigurationError

    try:
        if line.startswith("hex:"):
            return bytes.fromhex(line[4:])
        if line.startswith("base64:"):
            return base64.b64decode(line[7:], validate=True)
    except (ValueError, binascii.Error) as exc:
        raise ConfigurationError(
            f"line {number} of the key file {path!r} is not valid {line.split(':', 1)[0]}",
            setting="key_file", path=path,
        ) from exc
    return line.encode()


def read_key_file(path: str) -> list[bytes]:
    """The keys of a key file (the current first); comments (#) and blank lines skipped."""
    from langgraph_durable.errors import ConfigurationError

    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise ConfigurationError(
            f"cannot read the key file {path!r}: {exc.strerror}", setting="key_file", path=path
        ) from exc
    keys = [_parse_key(ln.strip(), path, i) for i, ln in enumerate(lines, 1)
            if ln.strip() and not ln.strip().startswith(("#", "digest:"))]
    if not keys:
        raise ConfigurationError(f"the key file {path!r} holds no key", setting="key_file", path=path)
    return keys


def read_digest_line(path: str) -> bytes | None:
    """The key file's ``digest:KEY`` line, if any. Deprecated (digest27): the digest
    secret is the database's own (durable_secrets); the line is still read, as
    ``digest_from``, so rows keyed by the secret earlier releases derived from it match."""
    with open(path, encoding="utf-8") as f:
        for i, ln in enumerate(f.read().splitlines(), 1):
            if ln.strip().startswith("digest:"):
                return _parse_key(ln.strip()[len("digest:"):], path, i)
    return None


def serde_from_keys(key_file: str | None) -> Any:
    """The encrypting serializer the keys name (``--key-file``, else the environment), or
    None when none is given."""
    path = key_file or KEY_FILE_FLAG[0] or os.environ.get(KEY_FILE_ENV)
    digest: bytes | None = None
    if path:
        keys = read_key_file(path)
        digest = read_digest_line(path)
    elif os.environ.get("LANGGRAPH_AES_KEY"):
        keys = [os.environ["LANGGRAPH_AES_KEY"].encode()]
    else:
        return None
    from langgraph_durable.keyring import DurableEncryptedSerializer

    return DurableEncryptedSerializer(keys[0], old=keys[1:], digest_from=digest)


@contextmanager
def open_saver(
    dsn: str | None,
    schema: str | None = None,
    *,
    readonly: bool = False,
    reads: Reads | None = None,
    **options: Any,
) -> Iterator[Any]:
    """A set-up sync saver on the resolved DSN. ``readonly``: the commands that only
    read run no DDL (the schema version is verified, ``SchemaNotReadyError`` if it is
    missing or old), so they work with a role that has SELECT only; they get the
    saver's ``reader()``: with ``reads.dsn`` (``--read-dsn``) it reads that standby, and
    the lag is printed on stderr (``say_where``). A write command gets the saver (with
    ``reads``, for the console, whose pages ask it for readers)."""
    from langgraph_durable.saver import DurablePostgresSaver

    if readonly:
        options["run_migrations"] = False
        reads = reads or Reads()
    if reads is not None:
        options.update(
            read_dsn=reads.dsn or "", read_max_lag=reads.max_lag, read_fallback=reads.fallback
        )
    else:
        options.setdefault("read_dsn", "")  # a command that only writes never opens it
    if "serde" not in options:
        serde = serde_from_keys(None)
        if serde is not None:
            options["serde"] = serde
    with DurablePostgresSaver.from_conn_string(resolve_dsn(dsn), schema=schema, **options) as saver:
        saver.setup()
        if not readonly:
            yield saver
            return
        reader = saver.reader()
        say_where(reader)
        yield reader


def fail(json_out: bool, name: str, message: str, fields: dict[str, Any]) -> typer.Exit:
    """Report an error (JSON on stdout with --json, else red on stderr, as
    ``error: <class>: <message>``, the one form every command uses, docs/configuration.md);
    exit code 1."""
    if json_out:
        print_json({"error": name, "message": message, **fields})
    else:
        err_console.print(f"[red]error:[/] {escape(name)}: {escape(message)}", markup=True, highlight=False)
    return typer.Exit(1)


@contextmanager
def saver_or_exit(
    dsn: str | None,
    schema: str | None,
    json_out: bool,
    *,
    readonly: bool = False,
    reads: Reads | None = None,
) -> Iterator[Any]:
    """``open_saver`` for operator commands: a typed error becomes a message and exit 1."""
    from langgraph_durable.errors import DurableError

    try:
        with open_saver(dsn, schema, readonly=readonly, reads=reads) as saver:
            yield saver
    except DurableError as exc:
        raise fail(json_out, type(exc).__name__, exc.message, exc.fields) from None


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, default=str, indent=2) + "\n")


def fmt_bytes(n: int | float | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
