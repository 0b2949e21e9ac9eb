"""Archive before delete, and restore (issue 16).

``retain(saver, ..., archive=URL)`` writes each thread it is about to delete to one
file under ``URL`` (a directory, or any ``fsspec`` URL such as ``s3://bucket/prefix``),
reads the file back and verifies it, and only then deletes the thread, in a
transaction that re-checks the thread did not change since it was read.
:func:`restore` loads archived threads back, in one transaction.

Why a kill at any moment leaves a thread in the database, or in both places, never in
neither: the file is written under a temporary name and renamed (local: fsync'd, then
``os.replace``; fsspec: ``mv``, and an object store's PUT is atomic anyway), so the
final name only ever holds a whole file; the rows are deleted only after that final
file was read back and verified (sha256, decoded, row counts); and the delete re-reads
the thread's fingerprint (an md5 over every row of every per-thread table) under the
thread's locks and skips the thread when it differs (``changed_since_archive``: the
archive is then a stale copy of a thread that is still in the database; the next run
archives it again).

File format (version 1; never pickle), one file per thread, named
``<slug>-<sha256(thread_id)[:12]>--<head checkpoint id>.lgda.zst`` (see
:func:`file_name` for ids that are not safe in a name):

* a zstd *skippable frame* (magic ``0x184D2A5E``, little-endian u32 size) holding the
  manifest, UTF-8 JSON: ``format`` ("langgraph-durable-archive"), ``version``,
  ``package_version``, ``created_at``, ``thread_id``, ``head_checkpoint_id``,
  ``fingerprint``, ``tables`` (names), ``counts`` (rows per table, and
  ``durable_artifacts``), ``payload_sha256`` and ``payload_bytes`` (of the frame below);
* one zstd frame: msgpack of ``{format, version, package_version, created_at,
  thread_id, head_checkpoint_id, fingerprint, tables: {name: {columns: [[name, type,
  generated], ...], rows: [[value, ...], ...]}}, artifacts: {columns, rows}}``.
  Values are what Postgres' ``to_jsonb`` gives for the column (text, numbers, JSON,
  ISO timestamps), except ``bytea``, stored as msgpack bin. (JSON numbers come back as
  Python floats: a ``numeric`` column, which no per-thread table has, would need care.)
* with an encrypting serializer (restore27), the payload also holds ``digest_secrets``:
  ``[{id, key_id, sealed}]``, the source database's digest secrets (its own first, then
  the ones it accepts) sealed under the current key as ``durable_secrets`` holds them,
  and the manifest their ``id``/``key_id`` only. :func:`restore` opens them, verifies the
  artifacts with them, and adopts them (a database with no secret in use) or keeps them
  as accepted secrets (``digest.<id>``), so a file restores into another database (disaster
  recovery, a copy to staging). Still version 1: a file without them reads as before.

A skippable frame is ignored by zstd decoders: ``zstd -dc file | msgpack`` reads the
payload with standard tools. Every table of ``STOCK_THREAD_TABLES`` and
``THREAD_TABLES`` is read generically (``SELECT to_jsonb(t)``), so a per-thread
table added there is archived and restored without code here; ``durable_artifacts``
rows are the artifacts the thread's reference rows, blobs, writes and migration
backups name (chunk children included), so a file restores on its own into an empty
database. Restore re-inserts artifacts with ``ON CONFLICT DO NOTHING`` (one row per
digest, shared with whatever already uses it) and columns filled by a sequence
(``durable_migration_log.id``) are left to the target database's sequence, in the
original order.

A file is untrusted input (issue 23): whoever can write one can recompute its sha256.
:func:`decode` (restore, verify and retention's read-back) bounds every size
(:class:`ArchiveLimits`, decompression streamed) and :func:`check_dump` checks the
content against the thread: artifact contents against their digests, ids, the head,
and every ledger key against the thread's own key derivations (idempotency/call.py,
journal.py: a key they change must be changed in ``_check_ledger`` too; the round trip
of every key kind in tests/test_archive_hostile.py fails otherwise). A file that fails
is refused whole (``ArchiveRejectedError``). URLs are shown redacted (``Store.url``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import struct
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

import ormsgpack
import psycopg
import zstandard
from psycopg import sql
from psycopg.types.json import Jsonb

from langgraph_durable import _sealing
from langgraph_durable import audit as _audit
from langgraph_durable._io import AfterCommit, Batch, Flow, Hook, Op, Stmt, Tx
from langgraph_durable._refs import artifact_lock, op_closure
from langgraph_durable._view import SaverView
from langgraph_durable.artifacts import _SEALED, REF_TYPE, _digest, _space, _split_serde, _zstd_dict
from langgraph_durable.audit import redact_text, redact_url
from langgraph_durable.errors import (
    ArchiveConflictError,
    ArchiveError,
    ArchiveIntegrityError,
    ArchiveRejectedError,
    ArchiveTooLargeError,
    ArchiveVersionError,
    ArtifactError,
    ConfigurationError,
)
from langgraph_durable.idempotency.keys import MAX_KEY_LENGTH
from langgraph_durable.idempotency.keys import _digest as _key_digest
from langgraph_durable.keyring import SEALED_PREFIX, Keyring
from langgraph_durable.ops.rekey import _recrypt_row
from langgraph_durable.sql.archive import (
    ARTIFACT_ROWS_SQL,
    RESTORED_ROOT_CHECK_SQL,
    TABLE_COLUMNS_SQL,
    checked_delete_sql,
    insert_rows_sql,
    thread_exists_sql,
    thread_fingerprint_sql,
    thread_rows_sql,
)
from langgraph_durable.sql.retention import THREAD_ENVELOPES_SQL
from langgraph_durable.sql.schema import STOCK_THREAD_TABLES, THREAD_TABLES
from langgraph_durable.sql.sealed import SEALED
from langgraph_durable.sql.secrets import EXTRA_SECRET_PREFIX, READ_EXTRA_SECRETS_SQL

FORMAT = "langgraph-durable-archive"
VERSION = 1
SUFFIX = ".lgda.zst"
_SKIPPABLE_MAGIC = 0x184D2A5E
_MiB = 1024**2


@dataclass(frozen=True)
class ArchiveLimits:
    """What one archive file may make restore/verify (and retention's read-back) hold
    in memory; a file over a limit is refused (``ArchiveTooLargeError``) before it is
    decompressed further. A file is untrusted input: a 100 KB zstd frame can claim, and
    expand to, gigabytes. ``max_file_bytes``: the file as stored; ``max_payload_bytes``:
    its decompressed payload (msgpack); ``max_value_bytes``: one artifact's content.
    Raise them (``restore(..., limits=)``, ``retain(..., archive_limits=)``) for threads
    larger than that; retention skips (``skipped["archive_failed"]``), never deletes, a
    thread whose archive would be refused."""

    max_file_bytes: int = 256 * _MiB
    max_payload_bytes: int = 256 * _MiB
    max_value_bytes: int = 256 * _MiB

    def __post_init__(self) -> None:
        for name in ("max_file_bytes", "max_payload_bytes", "max_value_bytes"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigurationError(f"ArchiveLimits.{name} must be a positive int, not {v!r}", **{name: v})


DEFAULT_LIMITS = ArchiveLimits()
# zstd's own default window limit (2^27), said explicitly: a frame asking for a larger
# window is refused instead of allocated.
_MAX_WINDOW = 1 << 27

# Every per-thread table, the stock ones first (the order restore inserts them in is
# _restore_order's).
TABLES: tuple[str, ...] = STOCK_THREAD_TABLES + THREAD_TABLES
_ARTIFACTS = "durable_artifacts"


def _package_version() -> str:
    try:
        from importlib.metadata import version

        return version("langgraph-durable")
    except Exception:
        return "unknown"


# --------------------------------------------------------------------------- statements



def fingerprint_stmt(ids: list[str], created: Sequence[str] = ()) -> Stmt:
    """Per thread, an md5 over every row of every per-thread table (order-free).
    ``created``: threads whose ``durable_threads`` row the caller just created to lock
    it (retention does for threads without one); that row is left out."""
    query = thread_fingerprint_sql(TABLES)
    return Stmt(query, {"ids": ids, "created": list(created)}, fetch=True, prepare=False)


class ChangedSinceArchive(Exception):
    """Internal (retention catches it): a thread's deleted rows are not the archived
    ones; the delete's transaction is rolled back and retried without them."""

    def __init__(self, threads: list[str]) -> None:
        super().__init__(threads)
        self.threads = threads


def delete_checked_stmts(ids: list[str], created: Sequence[str], sizes: dict[str, str]) -> list[Stmt]:
    """Retention's deletes when archiving: each returns a hash of every row it deleted
    (as :func:`fingerprint_stmt` computes them) and its size (``sizes[table]``, an SQL
    expression over the table's columns), so :func:`check_deleted` proves that what
    was deleted is exactly what the archive holds. The fingerprint checked before the
    deletes cannot: a write committed between that check and a DELETE (a put outside
    any lease takes no row lock) would be deleted without being archived."""
    out = []
    for t in TABLES:
        query = checked_delete_sql(t, sizes.get(t, "0"))
        out.append(Stmt(query, {"ids": ids, "created": list(created)}, fetch=True, prepare=False))
    return out


def check_deleted(
    results: list[list[Any]], ids: list[str], expect: dict[str, str]
) -> dict[str, dict[str, int]]:
    """Rows and bytes deleted per table; raises ``ChangedSinceArchive`` naming the
    threads whose deleted rows hash otherwise than their archive."""
    hashes: dict[str, list[str]] = {t: [] for t in ids}
    stats: dict[str, dict[str, int]] = {}
    for table, rows in zip(TABLES, results, strict=True):
        stats[table] = {"n": len(rows), "bytes": sum(int(r["size"]) for r in rows)}
        for r in rows:
            if r["h"] is not None:
                hashes.setdefault(r["thread_id"], []).append(r["h"])
    changed = [
        t for t in ids if hashlib.md5("".join(sorted(hashes[t])).encode()).hexdigest() != expect.get(t)
    ]
    if changed:
        raise ChangedSinceArchive(changed)
    return stats





# Tables whose rows alone do not make a thread "exist": reference rows outlive a thread
# deleted by the stock saver until gc's orphan sweep; restore adds to them.
_ADDITIVE = frozenset({"durable_artifact_refs"})




# --------------------------------------------------------------------------- reading


@dataclass
class ThreadDump:
    """Every row of one thread, as the archive stores them."""

    thread_id: str
    head_checkpoint_id: str | None
    fingerprint: str
    tables: dict[str, dict[str, Any]]
    artifacts: dict[str, Any]
    # Ledger keys check_dump found dead (see _check_ledger): not restored.
    dropped_keys: set[str] = field(default_factory=set)
    # The source database's digest secrets (restore27), as the file stores them:
    # [{"id": secret_id, "key_id": hex, "sealed": Keyring.seal's form}], its own first,
    # then the ones it accepts. Never in the clear.
    secrets: list[dict[str, Any]] = field(default_factory=list)
    # The same, opened by check_dump with the restoring saver's keys (not stored).
    opened_secrets: list[bytes] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        out = {t: len(v["rows"]) for t, v in self.tables.items()}
        out[_ARTIFACTS] = len(self.artifacts["rows"])
        return out


def _columns(rows: list[dict[str, Any]]) -> dict[str, list[list[Any]]]:
    """table -> [[column, pg type, filled by the database, position in the primary key]]."""
    out: dict[str, list[list[Any]]] = {}
    for r in rows:
        out.setdefault(r["tbl"], []).append([r["col"], r["type"], bool(r["generated"]), r["pk"]])
    return out


def _encode_rows(cols: list[list[Any]], records: list[dict[str, Any]]) -> list[list[Any]]:
    """to_jsonb records -> value lists in column order, bytea as bytes."""
    out = []
    for rec in records:
        row = []
        for name, typ, *_ in cols:
            v = rec.get(name)
            if typ == "bytea" and isinstance(v, str):
                v = bytes.fromhex(v[2:])  # to_jsonb renders bytea as "\\x<hex>"
            row.append(v)
        out.append(row)
    return out


def _op_dump(saver: SaverView, ids: list[str]) -> Op[list[ThreadDump]]:
    """Read the threads, one consistent snapshot (REPEATABLE READ: the fingerprint and
    the rows are the same state)."""

    yield Batch([Stmt("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")])
    meta = yield Batch(
        [Stmt(TABLE_COLUMNS_SQL, (list((*TABLES, _ARTIFACTS)),), fetch=True, prepare=False)]
    )
    cols = _columns(meta[0])
    missing = [t for t in (*TABLES, _ARTIFACTS) if t not in cols]
    if missing:
        raise ConfigurationError(f"tables {missing} do not exist: run setup() first", tables=missing)
    # Rows in primary-key order: deterministic files, and rows whose key a sequence
    # fills (durable_migration_log.id) are restored in their original order.
    order = {
        t: [c[0] for c in sorted((c for c in cs if c[3] is not None), key=lambda c: c[3])]
        for t, cs in cols.items()
    }
    out = yield Batch(
        [fingerprint_stmt(ids)]
        + [Stmt(thread_rows_sql(t, order[t]), (ids,), fetch=True, prepare=False) for t in TABLES]
    )
    fps = {r["thread_id"]: r["fp"] for r in out[0]}
    secrets = yield from _op_sealed_secrets(saver)
    per: dict[str, dict[str, list[dict[str, Any]]]] = {t: {} for t in ids}
    for table, rows in zip(TABLES, out[1:], strict=True):
        for r in rows:
            rec = r["r"]
            per.setdefault(rec["thread_id"], {}).setdefault(table, []).append(rec)
    dumps = []
    for tid in ids:
        if tid not in fps:
            continue  # gone meanwhile
        recs = per.get(tid, {})
        # Artifacts: what the reference rows name, plus the closure of the envelopes
        # (a database written before reference rows were complete lacks some rows).
        digests = {bytes.fromhex(r["digest"][2:]) for r in recs.get("durable_artifact_refs", [])}
        env = yield Batch([Stmt(THREAD_ENVELOPES_SQL, (tid, REF_TYPE) * 3, fetch=True, prepare=False)])
        pairs = [(REF_TYPE, bytes(r["blob"])) for r in env[0]]
        where = {"thread_id": tid, "checkpoint_ns": "", "checkpoint_id": None}
        try:
            digests |= yield from op_closure(saver, pairs, where)
        except ArtifactError:
            # A damaged chunk: archive what the reference rows name; the thread was
            # unloadable past that chunk before, and is the same after a restore.
            pass
        arts = yield Batch([Stmt(ARTIFACT_ROWS_SQL, (sorted(digests),), fetch=True, prepare=False)])
        tables = {
            t: {"columns": [c[:3] for c in cols[t]], "rows": _encode_rows(cols[t], recs.get(t, []))}
            for t in TABLES
        }
        cps = recs.get("checkpoints", [])
        root = [c["checkpoint_id"] for c in cps if c["checkpoint_ns"] == ""] or [
            c["checkpoint_id"] for c in cps
        ]
        dumps.append(
            ThreadDump(
                thread_id=tid,
                head_checkpoint_id=max(root) if root else None,
                fingerprint=fps[tid],
                tables=tables,
                artifacts={
                    "columns": [c[:3] for c in cols[_ARTIFACTS]],
                    "rows": _encode_rows(cols[_ARTIFACTS], [a["r"] for a in arts[0]]),
                },
                secrets=secrets,
            )
        )
    return dumps


def _op_sealed_secrets(saver: SaverView) -> Op[list[dict[str, Any]]]:
    """The database's digest secrets as an archive carries them (restore27): its own,
    then the accepted ones of archives restored into it, each sealed under the current
    key (as ``durable_secrets`` holds them), so a restore into another database can
    verify the thread's artifacts and match its calls. None without encryption."""
    ring = _sealing.keyring_of(saver.serde)
    if ring is None:
        return []
    own = yield from _sealing.op_digest_secret(ring, writable=False)
    if own is None:
        return []
    rows = yield Batch([Stmt(READ_EXTRA_SECRETS_SQL, (EXTRA_SECRET_PREFIX,), fetch=True)])
    found = [own] + [ring.open(bytes(r["sealed"]), thread_id=None, where=f"durable_secrets.{r['name']}") for r in rows[0]]
    return [
        {"id": _sealing.secret_id(s), "key_id": ring.current_id, "sealed": ring.seal(s)}
        for s in dict.fromkeys(found)
    ]


# --------------------------------------------------------------------------- file format


_SAFE_HEAD = re.compile(r"[A-Za-z0-9_-]{1,64}")


def file_name(thread_id: str, head: str | None) -> str:
    """``<slug>-<sha256(thread id)[:12]>--<head>.lgda.zst``. Both ids are anyone's
    strings (a checkpoint id may hold ``/``, ``..``, NUL or 10 KB): the thread id only
    as a slug beside its hash, the head checkpoint id verbatim only when it is a short
    run of ``[A-Za-z0-9_-]`` (LangGraph's uuids are), else as ``h`` + its sha256[:32].
    The name is always one path component, the same for the same thread and head."""
    slug = re.sub(r"[^A-Za-z0-9_.-]", "_", thread_id)[:40].lstrip(".") or "thread"
    h = hashlib.sha256(thread_id.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    if head is None:
        shown = "none"
    elif _SAFE_HEAD.fullmatch(head):
        shown = head
    else:
        shown = "h" + hashlib.sha256(head.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{slug}-{h}--{shown}{SUFFIX}"


def encode(dump: ThreadDump, *, created_at: str | None = None) -> bytes:
    """The archive file of one thread (see the module docstring)."""
    created = created_at or datetime.now(UTC).isoformat()
    header = {
        "format": FORMAT,
        "version": VERSION,
        "package_version": _package_version(),
        "created_at": created,
        "thread_id": dump.thread_id,
        "head_checkpoint_id": dump.head_checkpoint_id,
        "fingerprint": dump.fingerprint,
    }
    try:
        body = {**header, "tables": dump.tables, "artifacts": dump.artifacts}
        if dump.secrets:
            body["digest_secrets"] = dump.secrets
        packed = ormsgpack.packb(body)
    except (TypeError, ormsgpack.MsgpackEncodeError) as exc:
        raise ArchiveError(
            f"thread {dump.thread_id!r} cannot be archived: {exc}", url="", thread_id=dump.thread_id
        ) from exc
    payload = zstandard.ZstdCompressor(level=9, write_content_size=True).compress(packed)
    manifest = {
        **header,
        "tables": list(dump.tables),
        "counts": dump.counts(),
        "compression": "zstd",
        "payload_sha256": hashlib.sha256(payload).hexdigest(),
        "payload_bytes": len(payload),
    }
    if dump.secrets:  # ids only: the sealed secrets are in the payload (restore27)
        manifest["digest_secrets"] = [{"id": x["id"], "key_id": x["key_id"]} for x in dump.secrets]
    m = json.dumps(manifest, sort_keys=True).encode()
    return struct.pack("<II", _SKIPPABLE_MAGIC, len(m)) + m + payload


def read_manifest(data: bytes, url: str = "") -> dict[str, Any]:
    """The manifest of an archive file (checks its frame and format/version only)."""
    if len(data) < 8 or struct.unpack_from("<I", data)[0] != _SKIPPABLE_MAGIC:
        raise ArchiveIntegrityError(f"{url or 'data'} is not a langgraph-durable archive", url=url)
    (size,) = struct.unpack_from("<I", data, 4)
    try:
        manifest = json.loads(data[8 : 8 + size])
        assert isinstance(manifest, dict)
    except (ValueError, AssertionError) as exc:
        raise ArchiveIntegrityError(f"archive {url}: unreadable manifest ({exc})", url=url) from exc
    if manifest.get("format") != FORMAT:
        raise ArchiveIntegrityError(
            f"archive {url}: format {manifest.get('format')!r} is not {FORMAT!r}", url=url
        )
    if manifest.get("version") != VERSION:
        raise ArchiveVersionError(
            f"archive {url}: format version {manifest.get('version')!r}, this package reads "
            f"version {VERSION}",
            url=url,
            thread_id=manifest.get("thread_id"),
            version=manifest.get("version"),
        )
    manifest["_offset"] = 8 + size
    return manifest


def _bounded_zstd(data: bytes, limit: int, dict_data: Any = None) -> bytes:
    """Decompress one zstd frame to at most ``limit`` bytes; ``ArchiveTooLargeError``'s
    reason ``too_large`` (raised as ``_TooLarge``) past it. A frame that declares its
    size is refused before anything is allocated; one that does not is read in 1 MiB
    steps, so a bomb costs at most ``limit``."""
    declared = zstandard.frame_content_size(data)
    if declared > limit:
        raise _TooLarge(declared, limit)
    dctx = zstandard.ZstdDecompressor(dict_data=dict_data, max_window_size=_MAX_WINDOW)
    if declared >= 0:
        return dctx.decompress(data)
    out = bytearray()
    with dctx.stream_reader(data) as reader:
        while chunk := reader.read(_MiB):
            out += chunk
            if len(out) > limit:
                raise _TooLarge(len(out), limit)
    return bytes(out)


class _TooLarge(Exception):
    def __init__(self, size: int, limit: int) -> None:
        super().__init__(size, limit)
        self.size, self.limit = size, limit


def decode(
    data: bytes,
    url: str = "",
    *,
    limits: ArchiveLimits | None = None,
    serde: Any = None,
    unverified: list[bytes] | None = None,
) -> tuple[dict[str, Any], ThreadDump]:
    """Verify and decode an archive file, which is untrusted input: manifest, sha256 of
    the payload, sizes within ``limits``, payload decodes, header equals manifest, row
    counts match, every row is the thread's (:func:`check_dump`: ids, ledger keys,
    artifact contents against their digests). Raises ``ArchiveIntegrityError``
    (``ArchiveVersionError``, ``ArchiveRejectedError``, ``ArchiveTooLargeError``).
    ``serde``: the saver's serializer (its cipher verifies encrypted artifacts);
    ``unverified``: when given, encrypted artifacts that no cipher can check are
    listed there instead of refused (``verify`` without a saver)."""
    lim = limits or DEFAULT_LIMITS
    url = redact_url(url)
    if len(data) > lim.max_file_bytes:
        raise ArchiveTooLargeError(
            f"archive {url} is {len(data)} bytes, over the limit of {lim.max_file_bytes} "
            "(ArchiveLimits.max_file_bytes); nothing was read from it",
            url=url, thread_id=None, reason="file_too_large", limit=lim.max_file_bytes,
        )
    manifest = read_manifest(data, url)
    tid = manifest.get("thread_id")

    def bad(why: str, exc: BaseException | None = None) -> ArchiveIntegrityError:
        err = ArchiveIntegrityError(f"archive {url} (thread {tid!r}) is damaged: {why}", url=url, thread_id=tid)
        err.__cause__ = exc
        return err

    payload = data[manifest.pop("_offset") :]
    if len(payload) != manifest.get("payload_bytes"):
        raise bad(f"payload is {len(payload)} bytes, the manifest says {manifest.get('payload_bytes')}")
    if hashlib.sha256(payload).hexdigest() != manifest.get("payload_sha256"):
        raise bad("payload sha256 does not match the manifest")
    try:
        body = ormsgpack.unpackb(_bounded_zstd(payload, lim.max_payload_bytes))
    except _TooLarge as exc:
        raise ArchiveTooLargeError(
            f"archive {url} (thread {tid!r}): its payload decompresses to more than "
            f"{exc.limit} bytes (ArchiveLimits.max_payload_bytes); refused unread",
            url=url, thread_id=tid if isinstance(tid, str) else None,
            reason="payload_too_large", limit=exc.limit,
        ) from None
    except (zstandard.ZstdError, ormsgpack.MsgpackDecodeError, ValueError) as exc:
        raise bad(f"payload does not decode ({exc})", exc) from exc
    try:
        if not isinstance(body, dict):
            raise TypeError(f"payload is a {type(body).__name__}, not a map")
        for key in ("format", "version", "thread_id", "head_checkpoint_id", "fingerprint", "created_at"):
            if body.get(key) != manifest.get(key):
                raise bad(f"payload {key} {body.get(key)!r} != manifest {manifest.get(key)!r}")
        dump = ThreadDump(
            thread_id=body["thread_id"],
            head_checkpoint_id=body["head_checkpoint_id"],
            fingerprint=body["fingerprint"],
            tables=body["tables"],
            artifacts=body["artifacts"],
            secrets=body.get("digest_secrets") or [],
        )
        if not isinstance(dump.secrets, list) or not all(
            isinstance(x, dict) and isinstance(x.get("sealed"), bytes) for x in dump.secrets
        ):
            raise bad("digest_secrets: not a list of sealed secrets")
        if dump.counts() != manifest.get("counts") or list(dump.tables) != manifest.get("tables"):
            raise bad(f"row counts {dump.counts()} != manifest {manifest.get('counts')}")
        for t, v in dump.tables.items():
            names = [c[0] for c in v["columns"]]
            at = names.index("thread_id")
            if any(len(r) != len(names) or r[at] != tid for r in v["rows"]):
                raise bad(f"table {t}: a row of another thread or of the wrong width")
        names = [c[0] for c in dump.artifacts["columns"]]
        if any(len(r) != len(names) for r in dump.artifacts["rows"]):
            raise bad("durable_artifacts: a row of the wrong width")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise bad(f"payload structure ({exc!r})", exc) from exc
    try:
        check_dump(dump, url, lim, serde, unverified)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        # A value of an unexpected type where the checks compare or hash (an int id,
        # a missing column): damaged or hostile, and never an untyped error.
        raise bad(f"payload values ({exc!r})", exc) from exc
    return manifest, dump


# --------------------------------------------------------------------------- trust


def _rows(part: dict[str, Any]) -> list[dict[str, Any]]:
    names = [c[0] for c in part["columns"]]
    return [dict(zip(names, r, strict=True)) for r in part["rows"]]


def check_dump(
    dump: ThreadDump,
    url: str,
    limits: ArchiveLimits = DEFAULT_LIMITS,
    serde: Any = None,
    unverified: list[bytes] | None = None,
) -> None:
    """Everything in a decoded archive belongs to its thread (issue 23): ids are short
    strings without NUL, the head is the newest root checkpoint of the rows, every
    artifact's content hashes to its digest (encrypted ones with ``serde``'s cipher),
    and every ledger row's key is one this thread's own calls derive. Raises
    ``ArchiveRejectedError`` naming the file, the thread and the reason."""

    def refuse(reason: str, why: str, **fields: Any) -> ArchiveRejectedError:
        return ArchiveRejectedError(
            f"archive {url} (thread {dump.thread_id!r}) is refused, {why}; nothing was restored",
            url=url, thread_id=dump.thread_id, reason=reason, **fields,
        )

    if not _is_id(dump.thread_id):
        raise refuse("bad_id", f"its thread id {str(dump.thread_id)[:80]!r} is not a short string without NUL")
    tables = {t: _rows(v) for t, v in dump.tables.items()}
    _check_ids(dump, tables, refuse)
    _check_sealed_types({**tables, _ARTIFACTS: _rows(dump.artifacts)}, refuse)
    dump.opened_secrets = _open_secrets(dump, url, serde, refuse)
    ledger = tables.get("durable_ledger", [])
    keep = any(str(r.get("key", "")).startswith(_TOOL) for r in ledger)
    contents = _check_artifacts(dump, url, limits, serde, unverified, refuse, keep)
    dump.dropped_keys = _check_ledger(dump.thread_id, ledger, lambda: _tool_call_ids(tables, contents, serde), refuse)


# The Python type each kind of sealed column decodes to from an archive's msgpack
# (bytea: bytes; text: str; jsonb: what the column holds), None always allowed.
_SEALED_TYPES: dict[str, tuple[type, ...]] = {
    "serde": (bytes,), "artifact": (bytes,), "sealed": (bytes,), "text": (str,),
    "metadata": (dict,), "serde_json": (list,), "json": (dict, list, str, int, float, bool),
}


def _check_sealed_types(tables: dict[str, list[dict[str, Any]]], refuse: Callable[..., ArchiveRejectedError]) -> None:
    """Every sealed column (and its type column) of the file holds a value of its
    column's type: a hostile file's int where bytes belong reached ``bytes(n)`` in the
    re-seal (an allocation of n bytes) or a TypeError (review32)."""
    for col in SEALED:
        for row in tables.get(col.table, ()):
            value = row.get(col.column)
            if value is not None and not isinstance(value, _SEALED_TYPES[col.kind]):
                raise refuse("value_type", f"{col.name} holds a {type(value).__name__}")
            tag = row.get(col.type_column) if col.type_column else None
            if tag is not None and not isinstance(tag, str):
                raise refuse("value_type", f"{col.table}.{col.type_column} holds a {type(tag).__name__}")


def _open_secrets(dump: ThreadDump, url: str, serde: Any, refuse: Callable[..., ArchiveRejectedError]) -> list[bytes]:
    """The source database's digest secrets the file carries (restore27), opened with
    the restoring saver's keys. Sealed under a key the saver has, but not opening (its
    bytes changed), or not a 32-byte secret: refused. Sealed under a key the saver does
    not have: ``DecryptionError`` (configure the source's key, as for its artifacts).
    Without a keyring (no encryption, or ``verify`` without a saver): not opened."""
    ring = _sealing.keyring_of(serde)
    if ring is None:
        return []
    out = []
    for n, entry in enumerate(dump.secrets):
        sealed = entry["sealed"]
        if sealed[:3] != SEALED_PREFIX or len(sealed) < 13:
            raise refuse("digest_secret", f"its digest secret {n} is not in a sealed form")
        try:
            secret = ring.open(sealed, thread_id=dump.thread_id, where=f"digest secret {n} of archive {url}")
        except _sealing.DecryptionError as exc:
            if not ring.keys or sealed[4:12] not in ring.ids:
                raise  # not sealed under a key this saver has: a missing or wrong key
            raise refuse("digest_secret", f"its digest secret {n} is sealed under key {sealed[4:12].hex()} and does not open with it (its bytes were changed)") from exc
        if len(secret) != 32 or entry.get("id") != _sealing.secret_id(secret):
            raise refuse("digest_secret", f"its digest secret {n} is not the 32-byte secret its id names")
        out.append(secret)
    return out


_ID_COLUMNS = ("checkpoint_ns", "checkpoint_id", "parent_checkpoint_id", "task_id", "channel", "key")
_MAX_ID = 1024


def _is_id(v: object) -> bool:
    return isinstance(v, str) and 0 < len(v) <= _MAX_ID and "\x00" not in v


def _check_ids(dump: ThreadDump, tables: dict[str, list[dict[str, Any]]], refuse: Callable[..., ArchiveRejectedError]) -> None:
    for table, rows in tables.items():
        for r in rows:
            for col in _ID_COLUMNS:
                v = r.get(col)
                if v is None or (v == "" and col != "key"):
                    continue
                if not _is_id(v):
                    raise refuse("bad_id", f"table {table} has a {col} {str(v)[:80]!r} that is not a short string without NUL", table=table)
    cps = tables.get("checkpoints", [])
    for c in cps:
        body = c.get("checkpoint")
        if isinstance(body, dict) and body.get("id") not in (None, c.get("checkpoint_id")):
            raise refuse("bad_checkpoint", f"checkpoint {c.get('checkpoint_id')!r} says its id is {body.get('id')!r}")
    root = [c["checkpoint_id"] for c in cps if c.get("checkpoint_ns") == ""] or [c["checkpoint_id"] for c in cps]
    if dump.head_checkpoint_id != (max(root) if root else None):
        raise refuse("bad_head", f"its head checkpoint {dump.head_checkpoint_id!r} is not the newest of its rows")
    if len(tables.get("durable_threads", [])) > 1:
        raise refuse("bad_rows", "it holds more than one durable_threads row")


def _check_artifacts(
    dump: ThreadDump,
    url: str,
    limits: ArchiveLimits,
    serde: Any,
    unverified: list[bytes] | None,
    refuse: Callable[..., ArchiveRejectedError],
    keep: bool,
) -> list[bytes]:
    """Verify each artifact as a read does (content hashes to the digest, in its
    cipher's namespace), with decompression bounded; the plaintext contents of the
    ones that hold a serialized value are returned for the tool-key check."""
    _, cipher = _split_serde(serde) if serde is not None else (None, None)
    dict_data = _zstd_dict()
    contents: list[bytes] = []
    for row in _rows(dump.artifacts):
        digest, data = row.get("digest"), row.get("data")
        if not isinstance(digest, bytes) or len(digest) != 32 or not isinstance(data, bytes):
            raise refuse("bad_artifact", "an artifact row has no 32-byte digest or no data")
        shown = digest.hex()
        space = b""
        if data[:1] == _SEALED:
            if cipher is None:
                if unverified is not None:
                    unverified.append(digest)
                    continue
                raise refuse("unverifiable_artifact", f"artifact {shown} is encrypted and the saver has no cipher to verify it", digest=shown)
            name, _, ciphertext = data[1:].partition(b"\x00")
            try:
                data = cipher.decrypt(name.decode(), ciphertext)
            except (ValueError, _sealing.DecryptionError) as exc:  # the tag check failed: a wrong key (issue 27)
                raise _sealing.DecryptionError(
                    thread_id=dump.thread_id, where=f"artifact {shown[:16]} of archive {url}",
                    reason=getattr(exc, "reason", None) or f"{type(exc).__name__}: {exc}",
                ) from exc
            except Exception:
                raise refuse("bad_artifact", f"artifact {shown} does not decrypt", digest=shown) from None
            space = _space(name.decode())
        try:
            if zstandard.frame_content_size(data) < 0:
                # The right content in a frame the saver's reader refuses (it needs the
                # declared size, as the saver writes it): planted under a digest a later
                # thread deduplicates onto, that thread's value is unreadable (review23).
                raise refuse("bad_artifact", f"artifact {shown} is a zstd frame without its content size, which the saver cannot read", digest=shown)
            content = _bounded_zstd(data, limits.max_value_bytes, dict_data)
        except _TooLarge as exc:
            raise ArchiveTooLargeError(
                f"archive {url} (thread {dump.thread_id!r}): artifact {shown} decompresses to more "
                f"than {exc.limit} bytes (ArchiveLimits.max_value_bytes); refused",
                url=url, thread_id=dump.thread_id, reason="value_too_large", limit=exc.limit, digest=shown,
            ) from None
        except zstandard.ZstdError:
            raise refuse("bad_artifact", f"artifact {shown} does not decompress", digest=shown) from None
        ring = _sealing.keyring_of(serde) if space else None
        # Keyed digests (issue 27): the database's stored secret, or a key-derived one
        # of the code before it (digest27); plain sha256 for rows from before either.
        # And the source database's secrets the file carries (restore27).
        keys = (*dump.opened_secrets, *ring.verify_keys(), None) if ring is not None else (None,)
        if all(_digest(content, space, k) != digest for k in keys):
            raise refuse("artifact_digest", f"artifact {shown}'s content does not hash to its digest", digest=shown)
        if row.get("size") is not None and row.get("size") != len(content):
            raise refuse("bad_artifact", f"artifact {shown} says it is {row.get('size')} bytes, its content is {len(content)}", digest=shown)
        if keep:
            contents.append(content)
    return contents


# Ledger keys (idempotency/call.py, journal.py). Every row an archive can hold has the
# thread's id (rows of key= calls have none, so they are never archived), and every
# key such a row can have is a hash over that thread id, directly or through its
# parent call's key: a row whose key is not, is a planted one. A restored row with the
# key of another workflow's key= call, or of another thread's call, would make that
# call replay the planted result and skip its effect (issue 23).
_CALL, _TOOL, _LLM = "call:", "tool:", "llm:"
_KEY_SHAPE = re.compile(r"(call|tool|llm):[0-9a-f]{40}")
# Call indices are counted per task (and per parent call) from 0; a forgotten key
# leaves a gap. The scan stops this many indices past the last one found.
_INDEX_GAP = 64


def _key(prefix: str, *parts_and_index: Any, last: str | None = None) -> str:
    """``prefix`` + the key digest of the parts, the call index last (or before
    ``last``: a nested journal key ends with its fingerprint)."""
    *parts, index = parts_and_index
    tail = (str(index),) if last is None else (str(index), last)
    return prefix + _key_digest(*parts, *tail)


def _scan(make: Callable[[int], str], wanted: set[str]) -> set[str]:
    """Keys ``make(0), make(1), ...`` that are in ``wanted``, up to ``_INDEX_GAP``
    indices past the last one found."""
    found: set[str] = set()
    i = last = 0
    while i - last < _INDEX_GAP and wanted - found:
        k = make(i)
        if k in wanted:
            found.add(k)
            last = i + 1
        i += 1
    return found


def _check_ledger(
    tid: str,
    rows: list[dict[str, Any]],
    tool_ids: Callable[[], set[str]],
    refuse: Callable[..., ArchiveRejectedError],
) -> set[str]:
    """Every ledger row's key derives from this thread (see ``_KEY_SHAPE``'s comment),
    else the file is refused. Returns the keys of rows that are left out of a restore
    instead: tool calls whose ``tool_call_id`` the thread no longer stores anywhere
    (its messages were removed and the checkpoints holding them trimmed), and calls
    nested in them. No run of this thread can make those keys again (a tool key needs
    the AI message that asked for the call), so the rows are dead; and a planted row
    among them is then never inserted."""
    if not rows:
        return set()
    for r in rows:
        key = r.get("key")
        if not isinstance(key, str) or len(key) > MAX_KEY_LENGTH or not _KEY_SHAPE.fullmatch(key):
            raise refuse("foreign_ledger_key", f"ledger key {str(key)[:80]!r} is not a key this thread's calls derive (a key= key is never archived)", key=str(key)[:MAX_KEY_LENGTH])
    pending = {r["key"]: r for r in rows}
    proven = _task_keys(tid, rows, set(pending))
    tools = {k for k in pending if k.startswith(_TOOL)} - proven
    if tools:
        ids = tool_ids()
        for k in tools:
            ns, task = str(pending[k].get("checkpoint_ns") or ""), str(pending[k].get("task_id") or "")
            if any(k in (_TOOL + _key_digest("tool-task", tid, ns, task, c), _TOOL + _key_digest("tool", tid, c)) for c in ids):
                proven.add(k)
    proven = _with_nested(proven, pending)
    dead = _with_nested({k for k in tools if k not in proven}, {k: v for k, v in pending.items() if k not in proven})
    foreign = sorted(set(pending) - proven - dead)
    if foreign:
        raise refuse("foreign_ledger_key", f"ledger key {foreign[0]!r} is not derived from this thread's calls (a planted key could pre-complete another workflow's call)", key=foreign[0])
    return dead


def _with_nested(parents: set[str], pending: dict[str, dict[str, Any]]) -> set[str]:
    """``parents`` and the keys of ``pending`` nested in them, at any depth."""
    out = set(parents)
    frontier = set(parents)
    while frontier and set(pending) - out:
        new: set[str] = set()
        left = set(pending) - out
        for parent in frontier:
            new |= _scan(partial(_key, _CALL, "nested", parent), left)
            for k in left:
                if k.startswith(_LLM):
                    fp = str(pending[k].get("fingerprint") or "")
                    new |= _scan(partial(_key, _LLM, "journal-nested", parent, last=fp), {k})
        out |= new
        frontier = new
    return out


def _task_keys(tid: str, rows: list[dict[str, Any]], wanted: set[str]) -> set[str]:
    """The keys of calls made directly in one of the rows' tasks (by call index)."""
    proven: set[str] = set()
    groups: dict[tuple[str, str], set[str]] = {}
    for r in rows:
        groups.setdefault((str(r.get("checkpoint_ns") or ""), str(r.get("task_id") or "")), set()).add(r["key"])
    for (ns, task), keys in groups.items():
        calls = {k for k in keys if k.startswith(_CALL)}
        proven |= _scan(partial(_key, _CALL, "task", tid, ns, task), calls)
        for r in rows:
            k = r["key"]
            if k in keys and k.startswith(_LLM):
                fp = str(r.get("fingerprint") or "")
                proven |= _scan(partial(_key, _LLM, "journal", tid, ns, task, fp), {k})
    return proven & wanted


def _tool_call_ids(tables: dict[str, list[dict[str, Any]]], contents: list[bytes], serde: Any) -> set[str]:
    """Every ``id`` / ``tool_call_id`` string in the thread's stored values (a tool
    key hashes the model's tool_call_id, which the ledger row does not keep): the
    AI messages that asked for the calls and the tool messages that answered them,
    wherever a resumed run would read them (blobs, writes, artifacts, inline items of
    envelopes; decrypted with ``serde``'s cipher)."""
    _, cipher = _split_serde(serde) if serde is not None else (None, None)
    found: set[str] = set()
    for table in ("checkpoint_blobs", "checkpoint_writes"):
        for r in tables.get(table, []):
            blob = r.get("blob")
            if isinstance(blob, bytes):
                _ids_in(_plain(str(r.get("type") or ""), blob, cipher), found, cipher, 0)
    for content in contents:
        _ids_in(content[1:] if content[:1] == b"C" else content.partition(b"\x00")[2], found, cipher, 0)
    # Recorded results too (a journaled model's answer holds its tool calls). Any
    # source is safe: a candidate only counts if it hashes, with this thread's id, to
    # the row's key.
    for r in tables.get("durable_ledger", []):
        if isinstance(r.get("result"), bytes):
            _ids_in(_plain(str(r.get("result_type") or ""), r["result"], cipher), found, cipher, 0)
    return found


def _plain(tag: str, data: bytes, cipher: Any) -> bytes:
    """``data`` of type ``tag`` decrypted when an EncryptedSerializer wrote it."""
    if cipher is None or "+" not in tag or tag == REF_TYPE:
        return data
    try:
        return bytes(cipher.decrypt(tag.split("+", 1)[1], data))
    except Exception:
        return data


def _ids_in(value: Any, found: set[str], cipher: Any, depth: int) -> None:
    """Walk msgpack (ext types and bytes that are msgpack themselves included)."""
    if depth > 24:
        return
    if isinstance(value, bytes | memoryview):
        try:
            value = ormsgpack.unpackb(value, ext_hook=lambda _code, data: _Ext(data))
        except (ormsgpack.MsgpackDecodeError, ValueError, TypeError):
            return
    if isinstance(value, _Ext):
        _ids_in(value.data, found, cipher, depth + 1)
    elif isinstance(value, dict):
        for k, v in value.items():
            if k in ("id", "tool_call_id") and isinstance(v, str) and len(v) <= MAX_KEY_LENGTH:
                found.add(v)
            _ids_in(v, found, cipher, depth + 1)
    elif isinstance(value, list | tuple):
        if len(value) == 3 and isinstance(value[1], str) and isinstance(value[2], bytes):
            # An envelope's inline item [kind, tag, data]: encrypted like a blob.
            _ids_in(_plain(value[1], value[2], cipher), found, cipher, depth + 1)
            return
        for v in value:
            _ids_in(v, found, cipher, depth + 1)


@dataclass
class _Ext:
    data: bytes


# --------------------------------------------------------------------------- storage


class Store:
    """A directory: local (``/path``, ``file://``) or any fsspec URL."""

    def __init__(self, url: str, limits: ArchiveLimits | None = None, serde: Any = None) -> None:
        if not isinstance(url, str) or not url:
            raise ConfigurationError(f"archive URL must be a non-empty string, not {redact_url(url)!r}", url=redact_url(url))
        self.limits = limits or DEFAULT_LIMITS
        self.serde = serde  # the saver's: its cipher verifies encrypted artifacts on read-back
        # What errors, reports, logs and the audit trail show: never the credentials.
        self.url = redact_url(url.rstrip("/") if len(url) > 1 else url)
        self.local: str | None = None
        self.fs: Any = None
        if "://" not in url or url.startswith("file://"):
            self.local = url[len("file://") :] if url.startswith("file://") else url
            self.root = self.local.rstrip("/") or "/"
        else:
            try:
                from fsspec.core import url_to_fs
            except ImportError as exc:
                raise ConfigurationError(
                    f"archive URL {self.url!r} needs fsspec: pip install 'langgraph-durable[archive]'",
                    url=self.url,
                ) from exc
            self.fs, self.root = url_to_fs(url)
            self.root = self.root.rstrip("/")

    def _path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def url_of(self, name: str) -> str:
        return f"{self.url}/{name}"

    def write(self, name: str, data: bytes) -> None:
        """Write ``name`` whole or not at all: a temporary name, then a rename."""
        tmp = self._path(f".{name}.tmp-{uuid.uuid4().hex[:12]}")
        final = self._path(name)
        if self.local is not None:
            os.makedirs(self.root, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            _pause("written")
            os.replace(tmp, final)
            # The rename itself must survive a power loss before the rows are deleted.
            fd = os.open(self.root, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        else:
            self.fs.makedirs(self.root, exist_ok=True)
            self.fs.pipe_file(tmp, data)
            _pause("written")
            self.fs.mv(tmp, final)

    def read(self, name: str) -> bytes:
        """The file, refused unread (``ArchiveTooLargeError``) over ``max_file_bytes``."""
        limit = self.limits.max_file_bytes
        if self.local is not None:
            with open(self._path(name), "rb") as f:
                # read(n) allocates n bytes up front: ask for the file's size only.
                size = os.fstat(f.fileno()).st_size
                over = size > limit
                data = b"" if over else f.read()
        else:
            size = self.fs.size(self._path(name))
            over = size is not None and size > limit
            data = b"" if over else bytes(self.fs.cat_file(self._path(name)))
        if over or len(data) > limit:
            raise ArchiveTooLargeError(
                f"archive {self.url_of(name)} is over the limit of {limit} bytes "
                "(ArchiveLimits.max_file_bytes); nothing was read from it",
                url=self.url_of(name), thread_id=None, reason="file_too_large", limit=limit,
            )
        return data

    def names(self) -> list[str]:
        if self.local is not None:
            try:
                found = os.listdir(self.root)
            except FileNotFoundError:
                return []
        else:
            if not self.fs.exists(self.root):
                return []
            found = [p.rsplit("/", 1)[-1] for p in self.fs.ls(self.root, detail=False)]
        return sorted(n for n in found if n.endswith(SUFFIX) and not n.startswith("."))


def _pause(point: str) -> None:
    """Test seam: the crash test replaces this to widen the windows it kills in."""


def _store_verified(store: Store, dump: ThreadDump) -> dict[str, Any]:
    """Write the thread's file, read it back and verify it; the manifest."""
    name = file_name(dump.thread_id, dump.head_checkpoint_id)
    try:
        data = encode(dump)
    except ArchiveError as exc:
        exc.fields["url"] = exc.url = store.url_of(name)  # type: ignore[attr-defined]
        raise
    try:
        store.write(name, data)
        back = store.read(name)
    except OSError as exc:
        raise ArchiveError(
            f"cannot write archive {store.url_of(name)} of thread {dump.thread_id!r}: {redact_text(str(exc))}",
            url=store.url_of(name),
            thread_id=dump.thread_id,
        ) from None
    # Read back as restore will read it (same checks, same limits): a thread whose file
    # restore would refuse is never deleted.
    manifest, check = decode(back, store.url_of(name), limits=store.limits, serde=store.serde)
    # Not a byte comparison: two retention runs archiving the same thread write the same
    # rows under the same name (only created_at differs), and either file is good.
    if (
        check.thread_id != dump.thread_id
        or check.fingerprint != dump.fingerprint
        or check.counts() != dump.counts()
    ):
        raise ArchiveIntegrityError(
            f"archive {store.url_of(name)} read back differs from what was written",
            url=store.url_of(name),
            thread_id=dump.thread_id,
        )
    _pause("verified")
    manifest["url"] = store.url_of(name)
    return manifest


def _call(aio: bool, fn: Callable[..., Any], *args: Any) -> Any:
    """File I/O from a flow's Hook: in a thread for the async saver (the event loop
    keeps serving other runs), inline for the sync one."""
    if aio:
        return asyncio.to_thread(fn, *args)
    return fn(*args)


def op_archive_batch(
    saver: SaverView, store: Store, ids: list[str], aio: bool
) -> Flow[tuple[dict[str, dict[str, Any]], dict[str, ArchiveError]]]:
    """Flow fragment of retention: archive ``ids``. Returns thread id -> verified
    manifest, and thread id -> the ``ArchiveError`` of each thread whose file could not
    be written or verified: those are not deleted, and the others still are (one
    thread's bad file, an odd id or a full disk for one file, must not stop retention
    of every other thread on every run)."""
    out: dict[str, dict[str, Any]] = {}
    failed: dict[str, ArchiveError] = {}
    # One thread at a time: a batch of large threads is never all in memory at once.
    for tid in ids:
        dumps: list[ThreadDump] = yield Tx(partial(_op_dump, saver, [tid]))
        for d in dumps:
            try:
                out[d.thread_id] = yield Hook(_call, (aio, _store_verified, store, d))
            except ArchiveError as exc:
                failed[d.thread_id] = exc
    return out, failed


# --------------------------------------------------------------------------- restore


@dataclass
class RestoreReport:
    """What :func:`restore` loaded: threads, rows per table, artifacts inserted (new
    rows) and artifacts already present (shared with what the database held)."""

    threads_restored: int = 0
    thread_ids: list[str] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)
    artifacts_inserted: int = 0
    artifacts_present: int = 0
    files: list[str] = field(default_factory=list)
    superseded: list[str] = field(default_factory=list)
    # Dead ledger rows left out (tool calls whose tool_call_id the thread no longer
    # stores; see archive._check_ledger).
    ledger_rows_dropped: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _files(url: str, limits: ArchiveLimits | None = None) -> tuple[Store, list[str]]:
    """The store and file names ``url`` names: one archive file, or every file under a
    directory (or fsspec URL)."""
    if url.endswith(SUFFIX):
        parent, _, name = url.rpartition("/")
        return Store(parent or ".", limits), [name]
    store = Store(url, limits)
    return store, store.names()


def _read(store: Store, name: str) -> bytes:
    try:
        return store.read(name)
    except OSError as exc:
        raise ArchiveError(
            f"cannot read archive {store.url_of(name)}: {redact_text(str(exc))}", url=store.url_of(name)
        ) from None


def _load(
    url: str, thread_ids: Sequence[str] | None, serde: Any, limits: ArchiveLimits | None
) -> tuple[list[tuple[str, ThreadDump]], list[str]]:
    """Read and verify the files to restore: a single file, or the newest archive of
    each thread under a directory. (url, dump) pairs, and the older files skipped."""
    store, names = _files(url, limits)
    if not url.endswith(SUFFIX) and thread_ids is not None:
        # Only the files named after the requested threads are read.
        prefixes = tuple(file_name(t, None).rsplit("--", 1)[0] + "--" for t in thread_ids)
        names = [n for n in names if n.startswith(prefixes)]
    newest: dict[str, tuple[tuple[str, str], str, ThreadDump]] = {}
    superseded: list[str] = []
    for name in names:
        data = _read(store, name)
        manifest, dump = decode(data, store.url_of(name), limits=store.limits, serde=serde)
        if thread_ids is not None and dump.thread_id not in thread_ids:
            continue
        rank = (dump.head_checkpoint_id or "", str(manifest.get("created_at")))
        prev = newest.get(dump.thread_id)
        if prev is None or rank > prev[0]:
            if prev is not None:
                superseded.append(prev[1])
            newest[dump.thread_id] = (rank, store.url_of(name), dump)
        else:
            superseded.append(store.url_of(name))
    if thread_ids is not None:
        absent = [t for t in thread_ids if t not in newest]
        if absent:
            raise ArchiveError(
                f"thread(s) {absent} not found in archive {store.url}", url=store.url, thread_id=absent[0]
            )
    return [(u, d) for _, u, d in sorted(newest.values(), key=lambda x: x[2].thread_id)], superseded


def _restore_order(tables: Sequence[str]) -> list[str]:
    # Thread rows first (what a run's lease locks), checkpoints before their blobs and
    # writes, then the package's tables (reference rows after their artifacts).
    head = ["durable_threads", *reversed(STOCK_THREAD_TABLES)]
    return [t for t in head if t in tables] + [t for t in tables if t not in head]


def _json_rows(cols: list[list[Any]], rows: list[list[Any]], keep: list[str]) -> list[dict[str, Any]]:
    names = [c[0] for c in cols]
    out = []
    for row in rows:
        rec = {}
        for name, v in zip(names, row, strict=True):
            if name in keep:
                rec[name] = "\\x" + v.hex() if isinstance(v, bytes) else v
        out.append(rec)
    return out


def _resealed(ring: Keyring | None, table: str, cols: list[list[Any]], rows: list[list[Any]]) -> list[list[Any]]:
    """``rows`` with their sealed values under the saver's current key (rekey's rule,
    ``ops.rekey._recrypt_row``; values already current, or plaintext, kept as they are).
    An archive written before a rotation holds values only the old key opens: restored
    as they were after a finished rekey, the operator who then dropped the old key had
    threads that no longer read (review27). A value under a key the saver lacks raises
    ``DecryptionError`` here, before anything is written, with one key as with several:
    a value of an old key restored under a one-key ring would be a thread that no
    longer reads (review32)."""
    sealed = [c for c in SEALED if c.table == table]
    if ring is None or not sealed:
        return rows
    names = [c[0] for c in cols]
    out = []
    for row in rows:
        rec = dict(zip(names, row, strict=True))
        for col in sealed:
            if col.column not in rec:
                continue
            new = _recrypt_row(ring, col, rec)
            if new is not None:
                rec[col.column] = json.loads(new) if col.kind in ("json", "metadata", "serde_json") else new
        out.append([rec[n] for n in names])
    return out


def _insert_stmts(
    dump: ThreadDump, current: dict[str, list[list[Any]]], ring: Keyring | None = None
) -> tuple[list[Stmt], list[str]]:
    """One thread's inserts, artifacts first then its tables in restore order, and the
    table each statement fills (sealed values re-sealed with the current key: _resealed)."""
    stmts = []
    plan: list[str] = []
    for table, part in [(_ARTIFACTS, dump.artifacts)] + [
        (t, dump.tables[t]) for t in _restore_order(list(dump.tables))
    ]:
        if not part["rows"]:
            continue
        have = {c[0]: c for c in current[table]}
        # Columns this database has and fills itself (a sequence) are left to it.
        keep = [c[0] for c in part["columns"] if c[0] in have and not have[c[0]][2]]
        rows = _json_rows(part["columns"], _resealed(ring, table, part["columns"], part["rows"]), keep)
        if table == "durable_ledger" and dump.dropped_keys:
            rows = [r for r in rows if r.get("key") not in dump.dropped_keys]
            if not rows:
                continue
        ignore = table == _ARTIFACTS or table in _ADDITIVE
        stmts.append(
            Stmt(
                sql.Composed([insert_rows_sql(table, keep, ignore=ignore), sql.SQL(" RETURNING 1")]),
                (Jsonb(rows),),
                fetch=True,
                prepare=False,
            )
        )
        plan.append(table)
    return stmts, plan


@_audit.audited("storage.restore", _audit.describe_restore)
def _op_restore(saver: SaverView, items: list[tuple[str, ThreadDump]]) -> Op[RestoreReport]:

    ids = [d.thread_id for _, d in items]
    # Each thread's exclusive artifact lock (what deletes take), so a concurrent delete
    # or restore of the same thread waits; then refuse threads that exist.
    yield Batch([artifact_lock(t) for t in ids])
    meta, exists = yield Batch(
        [
            Stmt(TABLE_COLUMNS_SQL, (list((*TABLES, _ARTIFACTS)),), fetch=True, prepare=False),
            Stmt(thread_exists_sql([t for t in TABLES if t not in _ADDITIVE]), {"ids": ids}, fetch=True, prepare=False),
        ]
    )
    if exists:
        found = sorted({r["thread_id"] for r in exists})
        url = next(u for u, d in items if d.thread_id == found[0])
        raise ArchiveConflictError(
            f"thread {found[0]!r} already exists in the database (restoring {url}); delete "
            "it first or restore other threads with --thread. Nothing was restored.",
            url=url,
            thread_id=found[0],
            existing=found,
        )
    current = _columns(meta)
    report = RestoreReport()
    carried = [s for _, d in items for s in d.opened_secrets]
    ring = _sealing.keyring_of(saver.serde)
    if carried and ring is not None:
        # The source databases' secrets (restore27), before the rows: adopted as this
        # database's own when it has none in use yet, else kept as accepted ones
        # (digest.<id>), so the threads' artifacts verify and their calls match here.
        own, stored = yield from _sealing.op_adopt_digest_secrets(ring, carried)
        yield AfterCommit(partial(_accept_secrets, saver, own, stored))
    for url, dump in items:
        unknown = [t for t in dump.tables if t not in current]
        if unknown:
            raise ArchiveVersionError(
                f"archive {url} holds table(s) {unknown} this database lacks: upgrade the "
                "package and run setup()",
                url=url,
                thread_id=dump.thread_id,
            )
        try:
            stmts, plan = _insert_stmts(dump, current, ring)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:  # binascii.Error is a ValueError
            # A sealed value the re-seal cannot read (not base64, a damaged envelope):
            # damaged or hostile, refused typed, before anything of the thread is sent.
            raise ArchiveRejectedError(
                f"archive {url} (thread {dump.thread_id!r}) is refused, a sealed value does "
                f"not read ({type(exc).__name__}: {exc}); nothing was restored",
                url=url, thread_id=dump.thread_id, reason="sealed_value",
            ) from exc
        try:
            out = yield Batch(stmts)
            # has_root came from the archive: kept only if the root checkpoint came too.
            yield Batch([Stmt(RESTORED_ROOT_CHECK_SQL, (dump.thread_id,))])
        except psycopg.errors.UniqueViolation as exc:
            raise ArchiveConflictError(
                f"thread {dump.thread_id!r} conflicts with rows in the database ({exc}); "
                "nothing was restored",
                url=url,
                thread_id=dump.thread_id,
            ) from exc
        except (psycopg.errors.IntegrityError, psycopg.errors.DataError) as exc:
            # Rows the database itself refuses (a reference to an artifact neither the
            # file nor the database has, a value of the wrong type): the transaction
            # is rolled back, so nothing was restored.
            raise ArchiveRejectedError(
                f"archive {url} (thread {dump.thread_id!r}) is refused, the database "
                f"rejects its rows ({type(exc).__name__}: {str(exc).splitlines()[0]}); "
                "nothing was restored",
                url=url,
                thread_id=dump.thread_id,
                reason="rows_rejected",
            ) from exc
        for table, rows in zip(plan, out, strict=True):
            if table == _ARTIFACTS:
                report.artifacts_inserted += len(rows)
                report.artifacts_present += len(dump.artifacts["rows"]) - len(rows)
            else:
                report.rows[table] = report.rows.get(table, 0) + len(rows)
        report.threads_restored += 1
        report.ledger_rows_dropped += len(dump.dropped_keys)
        report.thread_ids.append(dump.thread_id)
        report.files.append(url)
        yield AfterCommit(partial(saver._known_refs.forget_thread, dump.thread_id))
    return report


def _accept_secrets(saver: SaverView, own: bytes, stored: list[bytes]) -> None:
    """After a restore committed: this saver (its clones and reader: one codec) keys new
    values with the database's own secret and accepts the others at once; other
    processes read them at their next setup()."""
    ring = _sealing.keyring_of(saver.serde)
    if ring is None:
        return
    for s in (own, *stored):
        ring.remember_secret(s)
    slot = saver.codec.digest
    if slot.error is None:
        slot.set(own)


def _flow_restore(
    saver: SaverView, url: str, thread_ids: Sequence[str] | None, aio: bool, limits: ArchiveLimits | None
) -> Flow[RestoreReport]:
    items, superseded = yield Hook(_call, (aio, _load, url, thread_ids, saver.serde, limits))
    if not items:
        return RestoreReport(superseded=superseded)
    report: RestoreReport = yield Tx(partial(_op_restore, saver, items))
    report.superseded = superseded
    return report


def _check(url: str, thread_ids: Sequence[str] | None) -> list[str] | None:
    Store(url.rpartition("/")[0] or "." if url.endswith(SUFFIX) else url)
    if isinstance(thread_ids, str):
        return [thread_ids]
    return None if thread_ids is None else list(thread_ids)


def restore(
    saver: SaverView,
    url: str,
    thread_ids: Sequence[str] | None = None,
    *,
    limits: ArchiveLimits | None = None,
) -> RestoreReport:
    """Load archived threads back (all under ``url``, or ``thread_ids``), in one
    transaction: every file is verified first, as untrusted input (:func:`decode`), and
    a file that fails, or a thread that already exists (``ArchiveConflictError``),
    refuses the whole restore. ``url``: a directory or fsspec URL (the newest archive
    of each thread), or one ``.lgda.zst`` file. ``limits``: ``ArchiveLimits``."""
    ids = _check(url, thread_ids)
    return saver.run_flow(_flow_restore(saver, url, ids, False, limits))


async def arestore(
    saver: SaverView,
    url: str,
    thread_ids: Sequence[str] | None = None,
    *,
    limits: ArchiveLimits | None = None,
) -> RestoreReport:
    ids = _check(url, thread_ids)
    return await saver.arun_flow(_flow_restore(saver, url, ids, True, limits))


def verify(url: str, *, serde: Any = None, limits: ArchiveLimits | None = None) -> list[dict[str, Any]]:
    """Verify every archive file under ``url`` (or one file) with the checks restore
    makes; their manifests. ``serde``: the saver's serializer, whose cipher verifies
    encrypted artifacts; without one they are counted in ``unverified_artifacts``."""
    store, names = _files(url, limits)
    out = []
    for name in names:
        unverified: list[bytes] = []
        manifest, dump = decode(
            _read(store, name), store.url_of(name), limits=store.limits, serde=serde,
            unverified=unverified if serde is None else None,
        )
        manifest["url"] = store.url_of(name)
        manifest["unverified_artifacts"] = len(unverified)
        manifest["ledger_rows_dropped"] = len(dump.dropped_keys)
        out.append(manifest)
    return out


__all__ = [
    "DEFAULT_LIMITS",
    "FORMAT",
    "VERSION",
    "ArchiveLimits",
    "RestoreReport",
    "ThreadDump",
    "arestore",
    "check_dump",
    "decode",
    "encode",
    "file_name",
    "fingerprint_stmt",
    "read_manifest",
    "restore",
    "verify",
]
