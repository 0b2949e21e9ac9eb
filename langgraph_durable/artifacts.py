"""Artifact-by-reference compaction: the codec between the serializer and the tables.

Shape borrowed from Temporal's external storage (a size threshold and a reference
marker) and from LangGraph's ``EncryptedSerializer`` (a tagged wrapper whose untagged
data passes through untouched):

* A value whose serialized form is under ``threshold`` bytes is stored exactly as the
  stock saver stores it (same type tag, same bytes).
* A larger value is replaced by a small *envelope* (type tag ``durable+ref``) that lists
  references to content-addressed artifacts. ``list`` and ``dict`` values are split per
  element (and a list or dict inside them once more, so ``{"docs": [...]}`` given as
  graph input shares its documents with the ``docs`` channel), so a growing list stores
  each element once; full runs of ``chunk_size`` list elements become a chunk artifact
  of their own, so the envelope of an append-only list stays short too (the list is a
  rope of immutable chunks plus a short tail).
* An artifact's digest is sha256 of its uncompressed content, which embeds the element's
  type tag: the same value written by a channel blob and by a pending write is one row.
  Content is zstd-compressed at rest and checked against the digest on every read.
* With an ``EncryptedSerializer`` the split and the digests work on the plaintext
  serialization (random nonces would otherwise make every copy of a value unique, and
  the list quadratic again); artifact content is compressed, then encrypted with the
  serializer's cipher, and values kept inline in envelopes are encrypted as usual.

Everything here is pure CPU; the saver does the I/O (batched, in its own transaction).

Envelope: ``msgpack([kind, payload])``. Kinds: ``_SINGLE`` (payload ``[item]``),
``_LIST`` (payload: items, chunk refs first), ``_DICT`` (payload ``[[key, item], ...]``),
``_DELTA`` (a ``DeltaChannel`` snapshot; payload ``[inner_kind, inner_payload]``).
Items: ``[_INLINE, tag, data]``, ``[_ELEMENT_REF, digest]``, ``[_CHUNK_REF, digest]``
(lists only) and ``[_NESTED, kind, payload]`` (a split list or dict inside a list/dict).
Artifact content: ``b"E" + tag + b"\\0" + data`` (an element) or ``b"C" +
msgpack(items)`` (a chunk). Use :func:`envelope_refs` / :func:`chunk_refs` /
:meth:`ArtifactCodec.unseal` rather than parsing these by hand.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import ormsgpack
import zstandard
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.types import _DeltaSnapshot

from langgraph_durable import _sealing
from langgraph_durable.errors import (
    ArtifactIntegrityError,
    ArtifactNotFoundError,
    ConfigurationError,
    SerializationError,
)
from langgraph_durable.keyring import decryption_error

REF_TYPE = "durable+ref"
# Measured (bench/bench_storage.py, docs/storage.md): 16 keeps the envelope of a
# 200-message list at ~20 references while the tail (rewritten every step) stays short.
CHUNK = 16

# Envelope kinds.
_SINGLE, _LIST, _DICT, _DELTA = 0, 1, 2, 3
# Item kinds inside envelopes and chunks.
_INLINE, _ELEMENT_REF, _CHUNK_REF, _NESTED = 0, 1, 2, 3
# First byte of an artifact's content.
_ELEMENT, _CHUNKED = b"E", b"C"
# First byte of stored artifact data that is encrypted (zstd frames start with 0x28).
_SEALED = b"\x00"
# zstd *raw-content dictionary* (a fixed prefix that every artifact's compression may
# refer back to): the serialization boilerplate of LangChain messages and documents
# (module and class names, field names, empty defaults). A 1.5 KB message carries
# ~170 bytes of it, which zstd alone stores as literals in every frame: with the prefix
# it costs a few back-references (measured: -130 bytes per message artifact, ~10%).
# PART OF THE STORED FORMAT: every artifact is compressed with it, so never edit these
# bytes; a new dictionary needs a new first byte (stored data starting with the zstd
# magic 0x28 means "zstd with this dictionary", 0x00 means encrypted, see _SEALED).
_ZSTD_PREFIX = b"".join(
    (
        b'\x88\xabtoken_usage\x80\xaamodel_name\xa0\xadfinish_reason\xa4stop\xacinput_tokens\x00\xadoutput_tokens\x00\xactotal_tokens\x00\xb3input_token_details\x80\xb4output_token_details\x80',
        b'Emsgpack\x00\xc7g\x05\x94\xbdlangchain_core.documents.base\xa8Document\x84\xa2id\xc0\xa8metadata\x80\xacpage_content\xa0\xa4type\xa8Document\xb3model_validate_json',
        b'Emsgpack\x00\xc7\x88\x05\x94\xbelangchain_core.messages.system\xadSystemMessage\x86\xa7content\xa0\xb1additional_kwargs\x80\xb1response_metadata\x80\xa4type\xa6system\xa4name\xc0\xa2id\xc0\xb3model_validate_json',
        b'Emsgpack\x00\xc7\xa9\x05\x94\xbclangchain_core.messages.tool\xabToolMessage\x89\xa7content\xa0\xb1additional_kwargs\x80\xb1response_metadata\x80\xa4type\xa4tool\xa4name\xc0\xa2id\xa0\xactool_call_id\xa0\xa8artifact\xc0\xa6status\xa7success\xb3model_validate_json',
        b'Emsgpack\x00\xc7\xcc\x05\x94\xbalangchain_core.messages.ai\xa9AIMessage\x89\xa7content\xa0\xb1additional_kwargs\x80\xb1response_metadata\x80\xa4type\xa2ai\xa4name\xc0\xa2id\xa0\xaatool_calls\x91\x84\xa4name\xa0\xa4args\x80\xa2id\xa0\xa4type\xa9tool_call\xb2invalid_tool_calls\x90\xaeusage_metadata\xc0\xb3model_validate_json',
        b'Emsgpack\x00\xc7\x85\x05\x94\xbdlangchain_core.messages.human\xacHumanMessage\x86\xa7content\xa0\xb1additional_kwargs\x80\xb1response_metadata\x80\xa4type\xa5human\xa4name\xc0\xa2id\xa0\xb3model_validate_json',
        b'Emsgpack\x00\xc7\xac\x05\x94\xbalangchain_core.messages.ai\xa9AIMessage\x89\xa7content\xa0\xb1additional_kwargs\x80\xb1response_metadata\x80\xa4type\xa2ai\xa4name\xc0\xa2id\xa0\xaatool_calls\x90\xb2invalid_tool_calls\x90\xaeusage_metadata\xc0\xb3model_validate_json',
    )
)
# How deep containers are split: the top-level list/dict and the lists/dicts in it.
_MAX_DEPTH = 1


class _WrongKey(Exception):
    """The cipher refused an artifact's tag (a wrong key): ``accept`` raises the typed
    ``DecryptionError`` naming the checkpoint, never an integrity error (a wrong key is
    not damaged bytes and must not quarantine the thread)."""


@dataclass(frozen=True)
class ArtifactConfig:
    """Tuning of artifact offloading.

    ``threshold``: serialized size (bytes) from which a value is offloaded; ``None``
    disables offloading. ``compression_level``: zstd level of artifact content.
    ``cache_bytes``: bound of the in-process cache of decoded artifact content.
    ``chunk_size``: list elements per chunk artifact.
    """

    threshold: int | None = 1024
    compression_level: int = 3
    cache_bytes: int = 64 * 1024 * 1024
    chunk_size: int = CHUNK

    def __post_init__(self) -> None:
        if self.threshold is not None and (not isinstance(self.threshold, int) or self.threshold < 0):
            raise ConfigurationError(
                f"artifact_threshold must be None or an int >= 0, not {self.threshold!r}",
                threshold=self.threshold,
            )
        if not isinstance(self.compression_level, int) or not -7 <= self.compression_level <= 22:
            raise ConfigurationError(
                f"compression_level must be an int in -7..22 (zstd), not {self.compression_level!r}",
                compression_level=self.compression_level,
            )
        if not isinstance(self.cache_bytes, int) or self.cache_bytes < 0:
            raise ConfigurationError(
                f"artifact_cache_bytes must be an int >= 0, not {self.cache_bytes!r}",
                cache_bytes=self.cache_bytes,
            )
        if not isinstance(self.chunk_size, int) or self.chunk_size < 2:
            raise ConfigurationError(
                f"chunk_size must be an int >= 2, not {self.chunk_size!r}", chunk_size=self.chunk_size
            )


@dataclass
class Encoded:
    type: str
    data: bytes
    artifacts: dict[bytes, bytes] = field(default_factory=dict)  # digest -> content


def _element_content(tag: str, data: bytes) -> bytes:
    return _ELEMENT + tag.encode() + b"\x00" + data


def _digest(content: bytes, space: bytes = b"", key: bytes | None = None) -> bytes:
    """sha256 of the content in its namespace; keyed (HMAC-SHA256 with the keyring's
    digest key, issue 27) when encrypting, so a guessed value cannot be confirmed."""
    if key is not None:
        return hmac.new(key, space + content, hashlib.sha256).digest()
    return hashlib.sha256(space + content).digest()


def _digest_keys(codec: ArtifactCodec, serde: Any) -> tuple[bytes | None, ...]:
    """Every secret an encrypted artifact's digest may be keyed with: the database's
    stored secret first (``_sealing.DigestSecret``), then the key-derived ones the code
    before digest27 wrote with (``Keyring.digest_keys()``, while their keys are
    configured), then none (plain sha256: written before keyed digests). Nothing else
    verifies: a row holding another artifact's data, however well encrypted, does not
    (tests/test_digest_secret.py)."""
    ring = _sealing.keyring_of(serde)
    out: list[bytes | None] = []
    if codec.digest.loaded and codec.digest.secret is not None:
        out.append(codec.digest.secret)
    if ring is not None:
        out.extend(k for k in ring.verify_keys() if k not in out)
    out.append(None)
    return tuple(out)


def _write_key(codec: ArtifactCodec, serde: Any) -> bytes | None:
    """The secret new encrypted artifacts are keyed with: the database's (loaded by the
    saver at setup() or its first operation; digest27)."""
    if not codec.digest.loaded:
        raise ConfigurationError(
            "the database's digest secret is not loaded: run the saver's setup() first",
            setting="serde",
        )
    return codec.digest.check()


def _space(cipher_name: str | None) -> bytes:
    """Digest namespace: encrypted artifacts never share a row with plaintext ones (a
    plaintext saver could not read the row, an encrypting one would find its value
    stored in the clear), nor with another cipher's."""
    return b"" if cipher_name is None else b"S" + cipher_name.encode() + b"\x00"


def _split_serde(serde: Any) -> tuple[Any, Any]:
    """(serializer for artifact content, cipher or None)."""
    if isinstance(serde, EncryptedSerializer):
        return serde.serde, serde.cipher
    return serde, None


def _zstd_dict() -> zstandard.ZstdCompressionDict:
    """The raw-content dictionary (a new object per call: zstd contexts, and the
    dictionary's precomputed tables, are per thread)."""
    return zstandard.ZstdCompressionDict(_ZSTD_PREFIX, dict_type=zstandard.DICT_TYPE_RAWCONTENT)


class _Encoder:
    """One value's encoding: plaintext items, their artifacts, then sealing."""

    def __init__(self, codec: ArtifactCodec, serde: Any, threshold: int) -> None:
        self.serde = serde
        self.plain, self.cipher = _split_serde(serde)
        self.space = _space(codec.cipher_name(self.cipher))
        self.key = _write_key(codec, serde) if self.cipher is not None else None
        self.threshold = threshold
        self.chunk = codec.config.chunk_size
        self.artifacts: dict[bytes, bytes] = {}

    def dumps(self, value: Any) -> tuple[str, bytes]:
        return self.plain.dumps_typed(value)

    def offload(self, tag: str, data: bytes) -> list[Any]:
        content = _element_content(tag, data)
        digest = _digest(content, self.space, self.key)
        self.artifacts[digest] = content
        return [_ELEMENT_REF, digest]

    def item(self, value: Any, depth: int) -> list[Any]:
        tag, data = self.dumps(value)
        if len(data) < self.threshold:
            return [_INLINE, tag, data]
        if depth < _MAX_DEPTH:
            split = self.container(value, depth + 1)
            if split is not None:
                return [_NESTED, *split]
        return self.offload(tag, data)

    def container(self, value: Any, depth: int) -> tuple[int, list[Any]] | None:
        """(kind, payload) of a split list/dict, or None when it is better kept whole:
        not a plain list/str-keyed dict, or splitting would offload nothing (a dict
        of small values; a short list of small values)."""
        if type(value) is list and value:
            before = len(self.artifacts)
            items = [self.item(v, depth) for v in value]
            if len(self.artifacts) == before and (
                len(items) < self.chunk or _inline_size(items) < self.threshold
            ):
                return None
            full = len(items) - len(items) % self.chunk
            top: list[Any] = []
            for start in range(0, full, self.chunk):
                content = _CHUNKED + ormsgpack.packb(items[start : start + self.chunk])
                digest = _digest(content, self.space)
                self.artifacts[digest] = content
                top.append([_CHUNK_REF, digest])
            top.extend(items[full:])
            return _LIST, top
        if type(value) is dict and value and all(type(k) is str for k in value):
            before = len(self.artifacts)
            pairs = [[k, self.item(v, depth)] for k, v in value.items()]
            if len(self.artifacts) == before:
                return None
            return _DICT, pairs
        return None

    def seal_items(self, items: list[Any]) -> list[Any]:
        """Encrypt the inline items an envelope carries (chunk artifacts are
        encrypted whole at rest, so their items stay plaintext and dedup)."""
        if self.cipher is None:
            return items
        out = []
        for item in items:
            if item[0] == _INLINE:
                name, ciphertext = self.cipher.encrypt(bytes(item[2]))
                item = [_INLINE, f"{item[1]}+{name}", ciphertext]
            elif item[0] == _NESTED:
                item = [_NESTED, item[1], self.seal_payload(item[1], item[2])]
            out.append(item)
        return out

    def seal_payload(self, kind: int, payload: list[Any]) -> list[Any]:
        if kind == _DICT:
            return [[k, i] for k, i in zip((p[0] for p in payload), self.seal_items([p[1] for p in payload]), strict=True)]
        return self.seal_items(payload)


class ArtifactCodec:
    """Encodes values into envelopes + artifacts and back. Thread-safe."""

    def __init__(self, config: ArtifactConfig | None = None) -> None:
        self.config = config or ArtifactConfig()
        self.cache = ArtifactCache(self.config.cache_bytes)
        self._local = threading.local()
        self._cipher_names: dict[int, tuple[Any, str]] = {}
        self._last_serde: tuple[Any, bool] | None = None
        # The database's digest secret (shared by the saver's clones, which share the codec).
        self.digest = _sealing.DigestSecret()

    # -- compression (zstd contexts are not thread-safe: one per thread) --------------
    def compress(self, content: bytes) -> bytes:
        c = getattr(self._local, "c", None)
        if c is None:
            c = self._local.c = zstandard.ZstdCompressor(
                level=self.config.compression_level, dict_data=_zstd_dict(), write_dict_id=False
            )
        return c.compress(content)

    def decompress(self, data: bytes) -> bytes:
        d = getattr(self._local, "d", None)
        if d is None:
            d = self._local.d = zstandard.ZstdDecompressor(dict_data=_zstd_dict())
        return d.decompress(data)

    def seal(self, content: bytes, serde: Any) -> bytes:
        """Stored form of an artifact: zstd, then encrypted when ``serde`` encrypts."""
        data = self.compress(content)
        _, cipher = _split_serde(serde)
        if cipher is None:
            return data
        name, ciphertext = cipher.encrypt(data)
        return _SEALED + name.encode() + b"\x00" + ciphertext

    def cipher_name(self, cipher: Any) -> str | None:
        """The name a cipher tags its output with (probed once per cipher object)."""
        if cipher is None:
            return None
        names = self._cipher_names
        name = names.get(id(cipher))
        if name is None or name[0] is not cipher:
            name = names[id(cipher)] = (cipher, cipher.encrypt(b"")[0])
        return str(name[1])

    def unseal(self, data: bytes, serde: Any) -> bytes:
        """Content of a stored artifact (decrypted, decompressed, NOT verified)."""
        return self._unseal(data, serde)[0]

    def _unseal(self, data: bytes, serde: Any) -> tuple[bytes, bytes]:
        """(content, digest namespace) of a stored artifact."""
        if data[:1] == _SEALED:
            _, cipher = _split_serde(serde)
            if cipher is None:
                raise ValueError("artifact is encrypted but the saver's serializer has no cipher")
            name, _, ciphertext = data[1:].partition(b"\x00")
            try:
                data = cipher.decrypt(name.decode(), ciphertext)
            except (ValueError, _sealing.DecryptionError) as exc:  # pycryptodome: "MAC check failed"
                raise _WrongKey() from exc
            return self.decompress(data), _space(name.decode())
        return self.decompress(data), b""

    # -- encoding ---------------------------------------------------------------------
    def _encrypts(self, serde: Any) -> bool:
        """Whether ``serde`` is an ``EncryptedSerializer``, remembered for the last serde
        asked about: isinstance against it goes through typing's Protocol check (a few
        microseconds, twice per write otherwise). A tuple swap, safe across threads."""
        last = self._last_serde
        if last is not None and last[0] is serde:
            return last[1]
        encrypts = isinstance(serde, EncryptedSerializer)
        self._last_serde = (serde, encrypts)
        return encrypts

    def encode(self, serde: Any, value: Any) -> Encoded:
        threshold = self.config.threshold
        try:
            if threshold is None:
                tag, data = serde.dumps_typed(value)
                return Encoded(tag, data)
            last = self._last_serde  # _encrypts' memo, read inline (once per value)
            if (
                type(value) is not list
                and type(value) is not dict
                and not isinstance(value, _DeltaSnapshot)
                and not (last[1] if last is not None and last[0] is serde else self._encrypts(serde))
            ):
                # The common case (issue 14: nearly every channel value and pending
                # write): a value container() keeps whole, no cipher. Serialized once;
                # an encoder only when it is large enough to offload.
                tag, data = serde.dumps_typed(value)
                if len(data) < threshold:
                    return Encoded(tag, data)
                enc = _Encoder(self, serde, threshold)
                item = enc.offload(tag, data)
                return Encoded(REF_TYPE, ormsgpack.packb([_SINGLE, [item]]), enc.artifacts)
            enc = _Encoder(self, serde, threshold)
            if isinstance(value, _DeltaSnapshot):
                split = enc.container(value.value, 0)
                if split is not None:
                    kind, payload = split
                    envelope = [_DELTA, [kind, enc.seal_payload(kind, payload)]]
                    return Encoded(REF_TYPE, ormsgpack.packb(envelope), enc.artifacts)
            else:
                split = enc.container(value, 0)
                if split is not None:
                    kind, payload = split
                    envelope = [kind, enc.seal_payload(kind, payload)]
                    return Encoded(REF_TYPE, ormsgpack.packb(envelope), enc.artifacts)
            if enc.cipher is None:
                tag, data = serde.dumps_typed(value)
                if len(data) < threshold:
                    return Encoded(tag, data)
            else:
                tag, data = enc.dumps(value)
                if len(data) < threshold:
                    # Small: exactly what the encrypting serializer stores.
                    tag, data = serde.dumps_typed(value)
                    return Encoded(tag, data)
            item = enc.offload(tag, data)
        except SerializationError:
            raise
        except Exception as exc:  # the serializer's own errors vary by type
            raise SerializationError(
                f"cannot serialize value of type {type(value).__name__}: {exc}",
                value_type=type(value).__name__,
            ) from exc
        return Encoded(REF_TYPE, ormsgpack.packb([_SINGLE, [item]]), enc.artifacts)

    # -- decoding ---------------------------------------------------------------------
    @staticmethod
    def is_ref(tag: str) -> bool:
        return tag == REF_TYPE

    def _get(self, digest: bytes, local: Mapping[bytes, bytes] | None) -> bytes | None:
        if local is not None:
            content = local.get(digest)
            if content is not None:
                return content
        return self.cache.get(digest)

    def missing(
        self, refs: Iterable[tuple[str, bytes]], local: Mapping[bytes, bytes] | None = None
    ) -> set[bytes]:
        """Digests needed to decode these (type, data) pairs that are neither in
        ``local`` (what this load already fetched) nor cached.

        Chunks are resolved through what is at hand, so call again after fetching: the
        saver loops until nothing is missing (two rounds at most: chunks, elements).
        """
        need: set[bytes] = set()
        for tag, data in refs:
            if tag != REF_TYPE:
                continue
            for item in _envelope_items(data):
                self._walk(item, need, None, local)
        return need

    def referenced(
        self, refs: Iterable[tuple[str, bytes]], local: Mapping[bytes, bytes] | None = None
    ) -> tuple[set[bytes], set[bytes]]:
        """(every digest these envelopes reference, through the chunks at hand; the
        chunks not at hand, whose children are therefore not listed yet)."""
        seen: set[bytes] = set()
        need: set[bytes] = set()
        for tag, data in refs:
            if tag != REF_TYPE:
                continue
            for item in _envelope_items(data):
                self._walk(item, need, seen, local)
        return seen, need

    def _walk(
        self,
        item: list[Any],
        need: set[bytes],
        seen: set[bytes] | None,
        local: Mapping[bytes, bytes] | None,
    ) -> None:
        kind = item[0]
        if kind == _INLINE:
            return
        if kind == _NESTED:
            for sub in _payload_items(item[1], item[2]):
                self._walk(sub, need, seen, local)
            return
        digest = bytes(item[1])
        if seen is not None:
            if kind != _CHUNK_REF:
                seen.add(digest)
                return
            if digest in seen:
                return
            seen.add(digest)
        content = self._get(digest, local)
        if content is None:
            need.add(digest)
        elif kind == _CHUNK_REF:
            for sub in ormsgpack.unpackb(content[1:]):
                self._walk(sub, need, seen, local)

    def accept(
        self,
        rows: Iterable[tuple[bytes, bytes]],
        *,
        serde: Any = None,
        local: dict[bytes, bytes] | None = None,
        thread_id: str = "",
        checkpoint_ns: str = "",
        checkpoint_id: str | None = None,
        locate: Any = None,
    ) -> None:
        """Verify fetched (digest, stored data) rows and put them in the cache (and in
        ``local``, which keeps them for this load whatever the cache evicts).

        ``locate(digest)`` may return the thread_id/checkpoint_ns/checkpoint_id mapping
        of the checkpoint that needs it, for a precise error when several are loaded."""
        for digest, data in rows:
            digest = bytes(digest)
            where: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id}
            try:
                content, space = self._unseal(bytes(data), serde)
            except _WrongKey as exc:  # the tag check failed: not this saver's key
                if locate is not None:
                    where = dict(locate(digest) or where)
                cause = exc.__cause__
                raise _sealing.DecryptionError(
                    thread_id=where.get("thread_id"), where=f"artifact {digest.hex()[:16]}",
                    reason=getattr(cause, "reason", None) or f"{type(cause).__name__}: {cause}",
                    checkpoint_id=where.get("checkpoint_id"),
                ) from cause
            except Exception as exc:  # zstd or cipher failure: the bytes are not ours
                if locate is not None:
                    where = dict(locate(digest) or where)
                key_error = decryption_error(
                    exc, thread_id=where.get("thread_id"), where=f"artifact {digest.hex()}",
                    checkpoint_id=where.get("checkpoint_id"),
                )
                if key_error is not None:  # the key, not damage: refused, not quarantined
                    raise key_error from exc
                raise ArtifactIntegrityError(
                    digest.hex(), actual=f"undecodable ({type(exc).__name__})", **where
                ) from None
            keys: tuple[bytes | None, ...] = _digest_keys(self, serde) if space else (None,)
            actual = _digest(content, space, keys[0])
            if actual != digest and not any(_digest(content, space, k) == digest for k in keys[1:]):
                if locate is not None:
                    where = dict(locate(digest) or where)
                raise ArtifactIntegrityError(digest.hex(), actual=actual.hex(), **where)
            self.cache.put(digest, content)
            if local is not None:
                local[digest] = content

    def decode(
        self,
        serde: Any,
        tag: str,
        data: bytes,
        *,
        local: Mapping[bytes, bytes] | None = None,
        thread_id: str = "",
        checkpoint_ns: str = "",
        checkpoint_id: str | None = None,
    ) -> Any:
        if tag != REF_TYPE:
            return serde.loads_typed((tag, data))
        ctx = _Ctx(
            {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id},
            local,
        )
        kind, payload = ormsgpack.unpackb(data)
        if kind == _SINGLE:
            return self._value(serde, payload[0], ctx)
        if kind == _DELTA:
            return _DeltaSnapshot(self._container(serde, payload[0], payload[1], ctx))
        return self._container(serde, kind, payload, ctx)

    def _container(self, serde: Any, kind: int, payload: list[Any], ctx: _Ctx) -> Any:
        if kind == _DICT:
            return {k: self._value(serde, i, ctx) for k, i in payload}
        values: list[Any] = []
        for item in payload:
            if item[0] == _CHUNK_REF:
                chunk = ormsgpack.unpackb(self._content(item[1], ctx)[1:])
                values.extend(self._value(serde, sub, ctx) for sub in chunk)
            else:
                values.append(self._value(serde, item, ctx))
        return values

    def _content(self, digest: bytes, ctx: _Ctx) -> bytes:
        content = self._get(bytes(digest), ctx.local)
        if content is None:
            raise ArtifactNotFoundError(bytes(digest).hex(), **ctx.where)
        return content

    def _value(self, serde: Any, item: list[Any], ctx: _Ctx) -> Any:
        if item[0] == _INLINE:
            return serde.loads_typed((item[1], bytes(item[2])))
        if item[0] == _NESTED:
            return self._container(serde, item[1], item[2], ctx)
        content = self._content(item[1], ctx)
        tag, _, data = content[1:].partition(b"\x00")
        return serde.loads_typed((tag.decode(), data))

    @staticmethod
    def digests_in(tag: str, data: bytes, chunk_contents: Mapping[bytes, bytes] | None = None) -> set[bytes]:
        """Digests an envelope references directly (chunks not expanded)."""
        if tag != REF_TYPE:
            return set()
        elements, chunks = envelope_refs(data)
        return elements | chunks


@dataclass(frozen=True)
class _Ctx:
    where: dict[str, Any]
    local: Mapping[bytes, bytes] | None


def _payload_items(kind: int, payload: list[Any]) -> Iterator[list[Any]]:
    if kind == _DICT:
        for _, item in payload:
            yield item
    else:
        yield from payload


def _envelope_items(data: bytes) -> Iterator[list[Any]]:
    kind, payload = ormsgpack.unpackb(data)
    if kind == _DELTA:
        kind, payload = payload
    if kind == _SINGLE:
        yield from payload
    else:
        yield from _payload_items(kind, payload)


def _collect(items: Iterable[list[Any]], elements: set[bytes], chunks: set[bytes]) -> None:
    for item in items:
        if item[0] == _ELEMENT_REF:
            elements.add(bytes(item[1]))
        elif item[0] == _CHUNK_REF:
            chunks.add(bytes(item[1]))
        elif item[0] == _NESTED:
            _collect(_payload_items(item[1], item[2]), elements, chunks)


def envelope_refs(data: bytes) -> tuple[set[bytes], set[bytes]]:
    """(element digests, chunk digests) an envelope references directly."""
    elements: set[bytes] = set()
    chunks: set[bytes] = set()
    _collect(_envelope_items(data), elements, chunks)
    return elements, chunks


def chunk_refs(content: bytes) -> tuple[set[bytes], set[bytes]]:
    """(element digests, chunk digests) a chunk artifact's content references."""
    elements: set[bytes] = set()
    chunks: set[bytes] = set()
    if content.startswith(_CHUNKED):
        _collect(ormsgpack.unpackb(content[1:]), elements, chunks)
    return elements, chunks


def _inline_size(items: Iterable[list[Any]]) -> int:
    total = 0
    for i in items:
        if i[0] == _INLINE:
            total += len(i[2]) + 8
        elif i[0] == _NESTED:
            total += _inline_size(_payload_items(i[1], i[2]))
    return total


class ArtifactCache:
    """Bounded LRU of verified artifact content, by total bytes. Artifacts are
    immutable (content-addressed), so entries never go stale."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._data: OrderedDict[bytes, bytes] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, digest: bytes) -> bytes | None:
        with self._lock:
            content = self._data.get(digest)
            if content is None:
                self.misses += 1
                return None
            self.hits += 1
            self._data.move_to_end(digest)
            return content

    def put(self, digest: bytes, content: bytes) -> None:
        if len(content) > self.max_bytes:
            return
        with self._lock:
            if digest in self._data:
                self._data.move_to_end(digest)
                return
            self._data[digest] = content
            self._size += len(content)
            while self._size > self.max_bytes:
                _, old = self._data.popitem(last=False)
                self._size -= len(old)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._size = 0

    @property
    def size(self) -> int:
        return self._size


class ArtifactsInFlight(Exception):
    """Raised by an op before it sends anything: another write of this process is storing
    some of the same (thread, digest) pairs right now. The write wrapper waits for
    ``futures`` outside any connection, then runs the op again (see ``WriteSession``)."""

    def __init__(self, futures: list[Future[bool]]) -> None:
        super().__init__(f"{len(futures)} artifact insert(s) in flight")
        self.futures = futures


class WriteSession:
    """The (thread, digest) pairs one put/put_writes call is storing, while it stores
    them. LangGraph runs a step's ``put_writes`` and ``put`` concurrently, and both
    carry the same large value: without this both compressed it and sent it (and the
    loser's TOASTed copy stayed behind as a dead tuple, doubling the table).

    The first write to reach ``KnownRefs.reserve`` owns a pair until its call ends; a
    concurrent write that needs the pair waits for that end (``ArtifactsInFlight``),
    then runs again: on commit the pair is known and only its reference row is sent;
    on rollback the pair was released, so the second write claims and sends it itself.
    A reservation is all or nothing and a waiting session first releases what it
    holds, so two writes never wait for each other."""

    def __init__(self, known: KnownRefs) -> None:
        self.known = known
        self.owned: dict[tuple[str, bytes], Future[bool]] = {}
        # A wait timed out: take pairs regardless of who else holds them.
        self.force = False

    def finish(self, committed: bool) -> None:
        """End the call: resolve and drop every pair it owns (``committed``: they are
        stored, else anyone waiting sends them itself)."""
        if not self.owned:  # the usual write: no new artifacts (nothing reserved)
            return
        owned, self.owned = self.owned, {}
        self.known._release(owned, committed)


class KnownRefs:
    """(thread, digest) pairs this process has stored recently, so a growing list does
    not re-compress and re-send every element at every step.

    Only the artifact *data* is skipped for known pairs; the reference rows are always
    written, and a foreign key from ``durable_artifact_refs`` to ``durable_artifacts``
    makes a reference to a collected artifact fail loudly: the saver then forgets
    what it knew and writes again with the data (see ``_DurableBase._write``).
    Pairs being stored right now are tracked too (``reserve``, ``WriteSession``)."""

    def __init__(self, ttl: float = 600.0, max_entries: int = 200_000) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._data: OrderedDict[tuple[str, bytes], float] = OrderedDict()
        self._inflight: dict[tuple[str, bytes], tuple[WriteSession, Future[bool]]] = {}
        self._lock = threading.Lock()

    def _fresh(self, key: tuple[str, bytes], now: float) -> bool:
        seen = self._data.get(key)
        return seen is not None and now - seen <= self.ttl

    def unknown(self, thread_id: str, digests: Iterable[bytes]) -> list[bytes]:
        now = time.monotonic()
        with self._lock:
            return [d for d in digests if not self._fresh((thread_id, d), now)]

    def reserve(
        self, session: WriteSession, thread_id: str, digests: Iterable[bytes], *, wait: bool = True
    ) -> list[bytes]:
        """The digests ``session`` must send (unknown, now owned by it). Raises
        ``ArtifactsInFlight`` (owning nothing new) when another session is storing some
        of them; ``wait=False`` (after a wait timed out) takes them regardless."""
        now = time.monotonic()
        new: list[bytes] = []
        waits: list[Future[bool]] = []
        with self._lock:
            for d in digests:
                key = (thread_id, d)
                if self._fresh(key, now):
                    continue
                holder = self._inflight.get(key)
                if holder is not None and holder[0] is not session and wait:
                    waits.append(holder[1])
                else:
                    new.append(d)
            if waits:
                raise ArtifactsInFlight(waits)
            for d in new:
                key = (thread_id, d)
                if key not in session.owned:
                    future: Future[bool] = Future()
                    session.owned[key] = future
                    self._inflight[key] = (session, future)
        return new

    def _release(self, owned: dict[tuple[str, bytes], Future[bool]], committed: bool) -> None:
        with self._lock:
            for key, future in owned.items():
                holder = self._inflight.get(key)
                if holder is not None and holder[1] is future:
                    del self._inflight[key]
        for future in owned.values():
            future.set_result(committed)

    def add(self, thread_id: str, digests: Iterable[bytes]) -> None:
        now = time.monotonic()
        with self._lock:
            for d in digests:
                self._data[(thread_id, d)] = now
                self._data.move_to_end((thread_id, d))
            while len(self._data) > self.max_entries:
                self._data.popitem(last=False)

    def forget_thread(self, thread_id: str) -> None:
        with self._lock:
            for key in [k for k in self._data if k[0] == thread_id]:
                del self._data[key]

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


# -- rekey (ops/rekey.py): the stored forms re-encrypted, the plaintext never rebuilt ---

def _recrypt_items(items: list[Any], recrypt: Any) -> bool:
    """Re-encrypt an envelope's inline encrypted items in place; whether any changed."""
    changed = False
    for item in items:
        if item[0] == _INLINE and "+" in item[1]:
            new = recrypt(bytes(item[2]))
            if new is not None:
                item[2] = new
                changed = True
        elif item[0] == _NESTED:
            changed = _recrypt_payload(item[1], item[2], recrypt) or changed
    return changed


def _recrypt_payload(kind: int, payload: list[Any], recrypt: Any) -> bool:
    if kind == _DICT:
        return _recrypt_items([p[1] for p in payload], recrypt)
    return _recrypt_items(payload, recrypt)


def recrypt_envelope(data: bytes, recrypt: Any) -> bytes | None:
    """An envelope (``REF_TYPE``) with its inline encrypted items passed through
    ``recrypt(ciphertext) -> new ciphertext | None`` (None: already current); None when
    nothing changed. Artifact references are untouched (artifacts are re-encrypted whole,
    and their digests are of the plaintext content)."""
    kind, payload = ormsgpack.unpackb(data)
    if kind == _SINGLE:
        changed = _recrypt_items(payload, recrypt)
    elif kind == _DELTA:
        changed = _recrypt_payload(payload[0], payload[1], recrypt)
    else:
        changed = _recrypt_payload(kind, payload, recrypt)
    return ormsgpack.packb([kind, payload]) if changed else None


def recrypt_stored_artifact(data: bytes, recrypt: Any) -> bytes | None:
    """An artifact's stored form re-encrypted (None: plaintext, or already current)."""
    if data[:1] != _SEALED:
        return None
    name, _, ciphertext = data[1:].partition(b"\x00")
    new = recrypt(ciphertext)
    return None if new is None else _SEALED + name + b"\x00" + new
