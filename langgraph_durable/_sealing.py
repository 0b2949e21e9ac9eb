"""Encryption at rest of what the package stores outside ``serde`` (issue 27).

With an encrypting serializer (``EncryptedSerializer``), every column that can hold what a
user or a model supplied is sealed with the keyring (``Keyring.seal``: authenticated
encryption with a key id), in a form that says it is sealed, so a reader without the key
shows "encrypted" and one with the wrong key raises ``DecryptionError`` naming the thread:

* text columns (``last_error``, ``args_preview``): ``lgd:sealed:v1:`` + base64;
* JSON columns (``last_failure``, audit ``detail``): ``{"lgd:sealed": base64}``;
* run metadata: the keys in ``CLEAR_METADATA`` stay as they are (LangGraph and the package
  query them), the rest go sealed under ``SEALED_METADATA_KEY``.

Without an encrypting serializer every function here returns its input unchanged: the
stored format is byte-for-byte the one before issue 27. ``sql.sealed.SEALED`` lists the
columns so ``langgraph-durable rekey`` can walk them.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import hmac
import os
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from typing import Any

import orjson

from langgraph_durable.errors import DecryptionError
from langgraph_durable.keyring import SEALED_PREFIX, Keyring, decryption_error, is_encrypting

__all__ = [
    "CLEAR_METADATA",
    "SEALED_METADATA_KEY",
    "DecryptionError",
    "Keyring",
    "is_encrypting",
    "is_sealed",
    "keyring_of",
    "open_json",
    "open_metadata",
    "open_text",
    "seal_json",
    "seal_metadata",
    "seal_text",
    "sealed_filter_keys",
]

TEXT_PREFIX = "lgd:sealed:v1:"
JSON_KEY = "lgd:sealed"
SEALED_METADATA_KEY = "lgd:sealed"
ENCRYPTED = "<encrypted>"
NO_KEY = "it is encrypted and this saver has no key (configure its encrypting serializer)"

# Run-metadata keys kept in the clear: LangGraph's own (source, step, parents), the
# package's graph-version stamp and migration marks (queried in SQL by the version gate,
# `versions` and undo), run_id (delete_for_runs' index) and thread_id (copy_thread).
# Ids, counters and version names: never a value a user or a model supplied.
CLEAR_METADATA = frozenset(
    {"source", "step", "parents", "graph_version", "migrated_from", "migration_id", "run_id", "thread_id"}
)

_CACHE: dict[int, tuple[Any, Keyring | None]] = {}

# The keyring of the saver running the current operator op (set by ``run_op`` and its
# twins): what the audit trail seals its details with, the ops being plain functions.
RING: ContextVar[Keyring | None] = ContextVar("langgraph_durable_ring", default=None)


def keyring_of(serde: Any) -> Keyring | None:
    """The keyring of a saver's serializer, or None when it does not encrypt. Cached per
    serializer object (the saver's ``serde`` is fixed once built)."""
    if serde is None:
        return None
    hit = _CACHE.get(id(serde))
    if hit is not None and hit[0] is serde:
        return hit[1]
    ring = Keyring.from_serde(serde) if is_encrypting(serde) else None
    if len(_CACHE) > 256:
        _CACHE.clear()
    _CACHE[id(serde)] = (serde, ring)
    return ring


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _payload(encoded: Any) -> bytes | None:
    """The sealed bytes base64 ``encoded`` holds, or None when it is not a sealed form
    (a user's own value that happens to look like one is then kept as it is)."""
    if not isinstance(encoded, str):
        return None
    try:
        raw = base64.b64decode(encoded, validate=True)
    except ValueError:
        return None
    return raw if raw[:3] == SEALED_PREFIX else None


def is_sealed(value: Any) -> bool:
    """Whether a stored text, JSON value or metadata holds sealed data."""
    if isinstance(value, str):
        return value.startswith(TEXT_PREFIX) and _payload(value[len(TEXT_PREFIX):]) is not None
    if isinstance(value, Mapping):
        return _payload(value.get(JSON_KEY)) is not None
    return False


def seal_text(ring: Keyring | None, text: str | None) -> str | None:
    if ring is None or text is None or is_sealed(text):
        return text  # sealed already: an error text read back and written on (quarantine)
    return TEXT_PREFIX + _b64(ring.seal(text.encode("utf-8", "surrogatepass")))


def open_text(
    ring: Keyring | None, value: str | None, *, thread_id: str | None, where: str,
    checkpoint_id: str | None = None, strict: bool = True, lenient: bool = False,
) -> str | None:
    """A stored text back in the clear. Sealed and no key: ``DecryptionError`` when
    ``strict``, else ``"<encrypted>"`` (what views show). A key that does not open it:
    ``DecryptionError``, unless ``lenient`` (an operator listing: one row under another
    key must not make the page unreadable), then ``"<encrypted>"`` too."""
    if not isinstance(value, str) or not value.startswith(TEXT_PREFIX):
        return value
    payload = _payload(value[len(TEXT_PREFIX):])
    if payload is None:
        return value
    if ring is None:
        if strict:
            raise DecryptionError(
                thread_id=thread_id, where=where, reason=NO_KEY, checkpoint_id=checkpoint_id
            )
        return ENCRYPTED
    try:
        raw = ring.open(payload, thread_id=thread_id, where=where, checkpoint_id=checkpoint_id)
    except DecryptionError:
        if not lenient:
            raise
        return ENCRYPTED  # a view: a key that does not open it is no key for it
    return raw.decode("utf-8", "surrogatepass")


def seal_json(ring: Keyring | None, value: Any, keep: frozenset[str] = frozenset()) -> Any:
    """A JSON-able value sealed into ``{"lgd:sealed": ...}`` (None stays None). For a
    mapping, the keys in ``keep`` stay beside it in the clear (ids, types, counts)."""
    if ring is None or value is None or is_sealed(value):
        return value
    if isinstance(value, Mapping) and keep:
        rest = {k: v for k, v in value.items() if k not in keep}
        out = {k: v for k, v in value.items() if k in keep}
        if rest:
            out[JSON_KEY] = _b64(ring.seal(orjson.dumps(rest, default=str)))
        return out
    return {JSON_KEY: _b64(ring.seal(orjson.dumps(value, default=str)))}


def open_json(
    ring: Keyring | None, value: Any, *, thread_id: str | None, where: str,
    checkpoint_id: str | None = None, strict: bool = True, lenient: bool = False,
) -> Any:
    payload = _payload(value.get(JSON_KEY)) if isinstance(value, Mapping) else None
    if payload is None:
        return value
    clear = {k: v for k, v in value.items() if k != JSON_KEY}
    if ring is None:
        if strict:
            raise DecryptionError(
                thread_id=thread_id, where=where, reason=NO_KEY, checkpoint_id=checkpoint_id
            )
        return {**clear, "encrypted": True}
    try:
        raw = ring.open(payload, thread_id=thread_id, where=where, checkpoint_id=checkpoint_id)
    except DecryptionError:
        if not lenient:
            raise
        return {**clear, "encrypted": True}  # a view: as no key
    opened = orjson.loads(raw)
    return {**clear, **opened} if clear else opened


def seal_metadata(ring: Keyring | None, md: dict[str, Any]) -> dict[str, Any]:
    """The metadata as stored: clear keys as they are, the rest sealed under one key."""
    if ring is None:
        return md
    rest = {k: v for k, v in md.items() if k not in CLEAR_METADATA}
    if not rest:
        return md
    out = {k: v for k, v in md.items() if k in CLEAR_METADATA}
    out[SEALED_METADATA_KEY] = _b64(ring.seal(orjson.dumps(rest)))
    return out


def open_metadata(
    ring: Keyring | None, md: Any, *, thread_id: str | None, checkpoint_id: str | None,
) -> Any:
    """The metadata as LangGraph gave it (``seal_metadata`` undone)."""
    payload = _payload(md.get(SEALED_METADATA_KEY)) if isinstance(md, Mapping) else None
    if payload is None:
        return md  # not sealed (a user key of that name, in a row written without a key)
    out = {k: v for k, v in md.items() if k != SEALED_METADATA_KEY}
    if ring is None:
        raise DecryptionError(thread_id=thread_id, where="metadata", reason=NO_KEY, checkpoint_id=checkpoint_id)
    raw = ring.open(payload, thread_id=thread_id, where="metadata", checkpoint_id=checkpoint_id)
    out.update(orjson.loads(raw))
    return out


def sealed_filter_keys(ring: Keyring | None, filter: Mapping[str, Any] | None) -> dict[str, Any]:
    """The part of a ``list(filter=...)`` on sealed metadata keys (checked client-side)."""
    if ring is None or not filter:
        return {}
    return {k: v for k, v in filter.items() if k not in CLEAR_METADATA}


def matches(md: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """``metadata @> wanted`` for the decrypted metadata (JSONB containment, top level
    by key, nested values by containment)."""
    return all(k in md and _contains(md[k], v) for k, v in wanted.items())


def _contains(have: Any, want: Any) -> bool:
    if isinstance(want, Mapping):
        return isinstance(have, Mapping) and all(k in have and _contains(have[k], v) for k, v in want.items())
    if isinstance(want, list):
        if not isinstance(have, list):
            return False
        return all(any(_contains(h, w) for h in have) for w in want)
    if isinstance(want, bool) or isinstance(have, bool):
        return type(want) is type(have) and want == have
    return bool(have == want)


_FP_LABEL = b"langgraph-durable fingerprint\x00"


class DigestSecret:
    """The database's digest secret as one saver holds it (shared by its ``bind()``
    clones and its reader, through the codec): the HMAC-SHA256 secret of artifact
    digests and call fingerprints. A random 32 bytes generated once per database and
    stored sealed in ``durable_secrets`` (``op_digest_secret``), so it does not depend
    on which keys are configured: dropping a key after ``rekey`` keeps every digest and
    every fingerprint (digest27). ``None`` once loaded: the serializer does not encrypt
    (plain sha256, as before issue 27)."""

    __slots__ = ("error", "loaded", "secret")

    def __init__(self) -> None:
        self.loaded = False
        self.secret: bytes | None = None
        # The refusal when no configured key opens the stored secret (a wrong key): kept
        # so reads still refuse typed, naming the thread, where they meet encrypted
        # values, and raised by whatever needs the secret (a write, a call's fingerprint).
        self.error: DecryptionError | None = None

    def set(self, secret: bytes | None, error: DecryptionError | None = None) -> None:
        self.secret = secret
        self.error = error
        self.loaded = True

    def check(self) -> bytes | None:
        """The secret, or the kept refusal raised (a fresh copy each time)."""
        if self.error is not None:
            raise copy.copy(self.error).with_traceback(None)
        return self.secret


def op_digest_secret(ring: Keyring, *, writable: bool = True) -> Any:
    """The op reading the database's digest secret (opened with any configured key),
    creating it first when there is none: ``INSERT ... ON CONFLICT DO NOTHING`` then
    read, so concurrent first savers all end with the one that won. A database that
    already holds ledger rows or artifacts (written before this table, keyed with the
    secret derived from the oldest key: ``Keyring.digest_key()``) adopts that derived
    secret, so those rows keep matching once that key is dropped; an empty one gets a
    random secret. ``writable=False`` (a reader on a standby): never creates; None when
    there is none yet."""
    from langgraph_durable._io import Batch, Stmt
    from langgraph_durable.sql.secrets import (
        DIGEST_SECRET,
        EXTRA_SECRET_PREFIX,
        HAS_KEYED_ROWS_SQL,
        INSERT_SECRET_SQL,
        READ_EXTRA_SECRETS_SQL,
        READ_SECRET_SQL,
    )

    read = Stmt(READ_SECRET_SQL, (DIGEST_SECRET,), fetch=True, name="secret")
    extra = Stmt(READ_EXTRA_SECRETS_SQL, (EXTRA_SECRET_PREFIX,), fetch=True, name="extra")
    rows = yield Batch([read, extra])
    # The accepted secrets of restored archives (restore27): verification and
    # fingerprint matching offer them (Keyring.verify_keys, legacy_fingerprints).
    for r in rows["extra"]:
        ring.remember_secret(ring.open(bytes(r["sealed"]), thread_id=None, where=f"durable_secrets.{r['name']}"))
    if not rows["secret"]:
        if not writable:
            return None
        found = yield Batch([Stmt(HAS_KEYED_ROWS_SQL, fetch=True)])
        legacy = ring.digest_key() if found[0][0]["found"] else None
        secret = legacy if legacy is not None else os.urandom(32)
        rows = yield Batch([Stmt(INSERT_SECRET_SQL, (DIGEST_SECRET, ring.seal(secret))), read])
    return ring.open(bytes(rows["secret"][0]["sealed"]), thread_id=None, where="durable_secrets.digest")


def op_adopt_digest_secrets(ring: Keyring, secrets: Sequence[bytes]) -> Any:
    """Store the digest secrets a restored archive carries (restore27), in the restore's
    transaction, before its rows. The first (the source database's own) becomes this
    database's own when it has none, or has one that nothing is keyed by yet (no ledger
    row, no artifact: a fresh database whose saver's setup() made one); the replaced one
    is kept as an accepted secret, so whatever a running saver still keys with it keeps
    verifying. Every archive secret that is not then the database's own is kept as an
    accepted secret (row ``digest.<id>``). The primary row is locked (``FOR UPDATE``),
    or created ``ON CONFLICT DO NOTHING`` and read back, so concurrent savers and
    restores agree. Returns (the database's own secret, every secret stored)."""
    from langgraph_durable._io import Batch, Stmt
    from langgraph_durable.sql.secrets import (
        DIGEST_SECRET,
        EXTRA_SECRET_PREFIX,
        HAS_KEYED_ROWS_SQL,
        INSERT_SECRET_SQL,
        LOCK_SECRET_SQL,
        UPDATE_SECRET_SQL,
    )

    lock = Stmt(LOCK_SECRET_SQL, (DIGEST_SECRET,), fetch=True, name="secret")
    rows = yield Batch([lock])
    if not rows["secret"]:
        rows = yield Batch([Stmt(INSERT_SECRET_SQL, (DIGEST_SECRET, ring.seal(secrets[0]))), lock])
    own = ring.open(bytes(rows["secret"][0]["sealed"]), thread_id=None, where="durable_secrets.digest")
    keep = list(dict.fromkeys(secrets))
    if own != secrets[0]:
        found = yield Batch([Stmt(HAS_KEYED_ROWS_SQL, fetch=True)])
        if not found[0][0]["found"]:
            keep.append(own)  # kept accepted: a running saver may still key with it
            yield Batch([Stmt(UPDATE_SECRET_SQL, (ring.seal(secrets[0]), DIGEST_SECRET))])
            own = secrets[0]
    extra = [Stmt(INSERT_SECRET_SQL, (EXTRA_SECRET_PREFIX + secret_id(s), ring.seal(s))) for s in keep if s != own]
    if extra:
        yield Batch(extra)
    return own, keep


def secret_id(secret: bytes) -> str:
    """The public id of a digest secret (restore27: ``durable_secrets`` row names and
    archive manifests): 16 hex digits of an HMAC under it, not reversible."""
    return hmac.new(secret, b"langgraph-durable secret id", hashlib.sha256).hexdigest()[:16]


def digest_secret(holder: Any) -> bytes | None:
    """The loaded digest secret of a saver (or of anything with its ``codec``), loading
    it first through the saver when it is not (a sync call; an async saver's loop loads
    it at setup() or its first operation)."""
    slot: DigestSecret = holder.codec.digest
    if not slot.loaded:
        if keyring_of(holder.serde) is None:
            return None
        ensure = getattr(holder, "_ensure_digest_secret", None)
        if ensure is None or not ensure():
            raise DecryptionError(
                thread_id=None, where="durable_secrets.digest",
                reason="the digest secret is not loaded yet: call setup() (await saver.setup()) first",
            )
    return slot.check()


def keyed_fingerprint(secret: bytes | None, plain: str) -> str:
    """A call's fingerprint as stored (``durable_ledger.fingerprint``, and inside journal
    keys): with an encrypting serializer HMAC-SHA256 of the plain one under the
    database's digest secret, so guessed arguments cannot be confirmed by hashing them (a
    card number has few enough candidates); equal arguments still give equal
    fingerprints. Without a key the plain sha256, as before."""
    if secret is None:
        return plain
    return hmac.new(secret, _FP_LABEL + plain.encode(), hashlib.sha256).hexdigest()


def legacy_fingerprints(serde: Any, plain: str, current: str) -> tuple[str, ...]:
    """Fingerprints a stored call may carry besides ``current``: the plain sha256
    (written before encryption), the forms keyed by each other stored secret (the
    accepted secrets of restored archives, restore27) and by each key-derived secret the
    code before digest27 used (``Keyring.digest_keys()``), while those keys are configured."""
    ring = keyring_of(serde)
    if ring is None:
        return ()
    out = [plain] if plain != current else []
    # The accepted secrets of restored archives (restore27) and the key-derived ones.
    for key in (*ring.stored_secrets, *ring.digest_keys()):
        fp = hmac.new(key, _FP_LABEL + plain.encode(), hashlib.sha256).hexdigest()
        if fp != current and fp not in out:
            out.append(fp)
    return tuple(out)


def decrypt_failure(
    serde: Any, tag: str, exc: BaseException, *, thread_id: str | None, where: str,
    checkpoint_id: str | None = None,
) -> DecryptionError | None:
    """The typed error for serializer output the key cannot open (the cipher's tag check
    failed: a wrong key), or None for any other decode failure. LangGraph's
    ``EncryptedSerializer`` tags its output ``<type>+<cipher>`` and pycryptodome raises
    ``ValueError("MAC check failed")``."""
    if isinstance(exc, DecryptionError):
        if getattr(exc, "thread_id", None) is not None:
            return exc
        reason = str(getattr(exc, "reason", exc))  # raised by the cipher, which does not know the row
    elif "+" in tag and is_encrypting(serde) and isinstance(exc, ValueError | KeyError | AssertionError):
        reason = f"{type(exc).__name__}: {exc}"
    else:  # an encrypted value and no key (rekey27: the operators say "encrypted")
        return decryption_error(exc, thread_id=thread_id, where=where, checkpoint_id=checkpoint_id)
    return DecryptionError(thread_id=thread_id, where=where, reason=reason, checkpoint_id=checkpoint_id)
