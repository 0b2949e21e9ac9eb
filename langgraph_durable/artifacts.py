"""Artifact-by-reference compaction: the codec between the serializer and the tables.

Shape borrowed from Temporal's external storage (a size threshold and a reference
marker) and from LangGraph's ``EncryptedSerializer`` (a tagged wrapper whose untagged
data passes through untouched):

* A value whose serialized form is under ``threshold`` bytes is stored exactly as the
  stock saver stores it (same type tag, same bytes).
* A larger value is replaced by a small *envelope* (type tag ``durable+ref``) that lists
  references to content-addressed artifacts. ``list`` and ``dict`` values are split per
  element, so a growing list stores each element once; full runs of ``CHUNK`` list
  elements become a chunk artifact of their own, so the envelope of an append-only list
  stays short too (the list is a rope of immutable chunks plus a short tail).
* An artifact's digest is sha256 of its uncompressed content, which embeds the element's
  type tag: the same value written by a channel blob and by a pending write is one row.
  Content is zstd-compressed at rest and checked against the digest on every read.

Everything here is pure CPU; the saver does the I/O (batched, in its own transaction).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import ormsgpack
import zstandard

from langgraph_durable.errors import (
    ArtifactIntegrityError,
    ArtifactNotFoundError,
    SerializationError,
)

REF_TYPE = "durable+ref"
CHUNK = 16

# Envelope kinds.
_SINGLE, _LIST, _DICT = 0, 1, 2
# Item kinds inside envelopes and chunks.
_INLINE, _ELEMENT_REF, _CHUNK_REF = 0, 1, 2
# First byte of an artifact's content.
_ELEMENT, _CHUNKED = b"E", b"C"


@dataclass(frozen=True)
class ArtifactConfig:
    """Tuning of artifact offloading.

    ``threshold``: serialized size (bytes) from which a value is offloaded; ``None``
    disables offloading. ``compression_level``: zstd level of artifact content.
    ``cache_bytes``: bound of the in-process cache of decoded artifact content.
    """

    threshold: int | None = 1024
    compression_level: int = 3
    cache_bytes: int = 64 * 1024 * 1024


@dataclass
class Encoded:
    type: str
    data: bytes
    artifacts: dict[bytes, bytes] = field(default_factory=dict)  # digest -> content


def _element_content(tag: str, data: bytes) -> bytes:
    return _ELEMENT + tag.encode() + b"\x00" + data


def _digest(content: bytes) -> bytes:
    return hashlib.sha256(content).digest()


class ArtifactCodec:
    """Encodes values into envelopes + artifacts and back. Thread-safe."""

    def __init__(self, config: ArtifactConfig | None = None) -> None:
        self.config = config or ArtifactConfig()
        self.cache = ArtifactCache(self.config.cache_bytes)
        self._local = threading.local()

    # -- compression (zstd contexts are not thread-safe: one per thread) --------------
    def compress(self, content: bytes) -> bytes:
        c = getattr(self._local, "c", None)
        if c is None:
            c = self._local.c = zstandard.ZstdCompressor(level=self.config.compression_level)
        return c.compress(content)

    def decompress(self, data: bytes) -> bytes:
        d = getattr(self._local, "d", None)
        if d is None:
            d = self._local.d = zstandard.ZstdDecompressor()
        return d.decompress(data)

    # -- encoding ---------------------------------------------------------------------
    def encode(self, serde: Any, value: Any) -> Encoded:
        threshold = self.config.threshold
        try:
            if threshold is None:
                tag, data = serde.dumps_typed(value)
                return Encoded(tag, data)
            if type(value) is list and value:
                return self._encode_list(serde, value, threshold)
            if type(value) is dict and value and all(type(k) is str for k in value):
                return self._encode_dict(serde, value, threshold)
            tag, data = serde.dumps_typed(value)
        except SerializationError:
            raise
        except Exception as exc:  # the serializer's own errors vary by type
            raise SerializationError(
                f"cannot serialize value of type {type(value).__name__}: {exc}",
                value_type=type(value).__name__,
            ) from exc
        if len(data) < threshold:
            return Encoded(tag, data)
        artifacts: dict[bytes, bytes] = {}
        item = self._offload(tag, data, artifacts)
        return Encoded(REF_TYPE, ormsgpack.packb([_SINGLE, [item]]), artifacts)

    def _offload(self, tag: str, data: bytes, artifacts: dict[bytes, bytes]) -> list[Any]:
        content = _element_content(tag, data)
        digest = _digest(content)
        artifacts[digest] = content
        return [_ELEMENT_REF, digest]

    def _item(self, serde: Any, value: Any, threshold: int, artifacts: dict[bytes, bytes]) -> list[Any]:
        tag, data = serde.dumps_typed(value)
        if len(data) >= threshold:
            return self._offload(tag, data, artifacts)
        return [_INLINE, tag, data]

    def _encode_list(self, serde: Any, value: list[Any], threshold: int) -> Encoded:
        artifacts: dict[bytes, bytes] = {}
        items = [self._item(serde, v, threshold, artifacts) for v in value]
        if not artifacts and _inline_size(items) < threshold:
            tag, data = serde.dumps_typed(value)  # small: stored exactly like the stock saver
            return Encoded(tag, data)
        full = len(items) - len(items) % CHUNK
        top: list[Any] = []
        for start in range(0, full, CHUNK):
            content = _CHUNKED + ormsgpack.packb(items[start : start + CHUNK])
            digest = _digest(content)
            artifacts[digest] = content
            top.append([_CHUNK_REF, digest])
        top.extend(items[full:])
        return Encoded(REF_TYPE, ormsgpack.packb([_LIST, top]), artifacts)

    def _encode_dict(self, serde: Any, value: dict[str, Any], threshold: int) -> Encoded:
        artifacts: dict[bytes, bytes] = {}
        items = [[k, self._item(serde, v, threshold, artifacts)] for k, v in value.items()]
        if not artifacts and _inline_size(item for _, item in items) < threshold:
            tag, data = serde.dumps_typed(value)
            return Encoded(tag, data)
        return Encoded(REF_TYPE, ormsgpack.packb([_DICT, items]), artifacts)

    # -- decoding ---------------------------------------------------------------------
    @staticmethod
    def is_ref(tag: str) -> bool:
        return tag == REF_TYPE

    def missing(self, refs: Iterable[tuple[str, bytes]]) -> set[bytes]:
        """Digests needed to decode these (type, data) pairs that are not cached yet.

        Chunks are resolved through the cache, so call again after fetching: the
        saver loops until nothing is missing (two rounds at most: chunks, elements).
        """
        need: set[bytes] = set()
        for tag, data in refs:
            if tag != REF_TYPE:
                continue
            kind, items = ormsgpack.unpackb(data)
            for item in (i for _, i in items) if kind == _DICT else items:
                self._walk(item, need)
        return need

    def _walk(self, item: list[Any], need: set[bytes]) -> None:
        if item[0] == _INLINE:
            return
        digest = bytes(item[1])
        content = self.cache.get(digest)
        if content is None:
            need.add(digest)
        elif item[0] == _CHUNK_REF:
            for sub in ormsgpack.unpackb(content[1:]):
                self._walk(sub, need)

    def accept(
        self,
        rows: Iterable[tuple[bytes, bytes]],
        *,
        thread_id: str = "",
        checkpoint_ns: str = "",
        checkpoint_id: str | None = None,
    ) -> None:
        """Verify fetched (digest, compressed) rows and put them in the cache."""
        for digest, data in rows:
            digest = bytes(digest)
            try:
                content = self.decompress(bytes(data))
            except zstandard.ZstdError:
                raise ArtifactIntegrityError(
                    digest.hex(), actual="undecodable", thread_id=thread_id,
                    checkpoint_ns=checkpoint_ns, checkpoint_id=checkpoint_id,
                ) from None
            actual = _digest(content)
            if actual != digest:
                raise ArtifactIntegrityError(
                    digest.hex(), actual=actual.hex(), thread_id=thread_id,
                    checkpoint_ns=checkpoint_ns, checkpoint_id=checkpoint_id,
                )
            self.cache.put(digest, content)

    def decode(
        self,
        serde: Any,
        tag: str,
        data: bytes,
        *,
        thread_id: str = "",
        checkpoint_ns: str = "",
        checkpoint_id: str | None = None,
    ) -> Any:
        if tag != REF_TYPE:
            return serde.loads_typed((tag, data))
        where = {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns, "checkpoint_id": checkpoint_id}
        kind, items = ormsgpack.unpackb(data)
        if kind == _DICT:
            return {k: self._value(serde, i, where) for k, i in items}
        values: list[Any] = []
        for item in items:
            if item[0] == _CHUNK_REF:
                values.extend(self._value(serde, sub, where) for sub in self._chunk(item[1], where))
            else:
                values.append(self._value(serde, item, where))
        return values[0] if kind == _SINGLE else values

    def _content(self, digest: bytes, where: dict[str, Any]) -> bytes:
        content = self.cache.get(bytes(digest))
        if content is None:
            raise ArtifactNotFoundError(bytes(digest).hex(), **where)
        return content

    def _chunk(self, digest: bytes, where: dict[str, Any]) -> list[Any]:
        return list(ormsgpack.unpackb(self._content(digest, where)[1:]))

    def _value(self, serde: Any, item: list[Any], where: dict[str, Any]) -> Any:
        if item[0] == _INLINE:
            return serde.loads_typed((item[1], bytes(item[2])))
        content = self._content(item[1], where)
        tag, _, data = content[1:].partition(b"\x00")
        return serde.loads_typed((tag.decode(), data))

    @staticmethod
    def digests_in(tag: str, data: bytes, chunk_contents: Mapping[bytes, bytes] | None = None) -> set[bytes]:
        """Top-level digests referenced by an envelope (chunks not expanded)."""
        if tag != REF_TYPE:
            return set()
        kind, items = ormsgpack.unpackb(data)
        out: set[bytes] = set()
        for item in (i for _, i in items) if kind == _DICT else items:
            if item[0] != _INLINE:
                out.add(bytes(item[1]))
        return out


def chunk_children(content: bytes) -> set[bytes]:
    """Digests a chunk artifact refers to (for GC's reference walk)."""
    if not content.startswith(_CHUNKED):
        return set()
    return {bytes(i[1]) for i in ormsgpack.unpackb(content[1:]) if i[0] != _INLINE}


def _inline_size(items: Iterable[Any]) -> int:
    return sum(len(i[2]) + 8 for i in items if i[0] == _INLINE)


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


class KnownRefs:
    """(thread, digest) pairs this process has recorded recently, so a growing list
    does not re-upsert every element at every step. Entries expire well inside GC's
    grace period: a thread deleted elsewhere is re-referenced safely after that."""

    def __init__(self, ttl: float = 600.0, max_entries: int = 200_000) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._data: OrderedDict[tuple[str, bytes], float] = OrderedDict()
        self._lock = threading.Lock()

    def unknown(self, thread_id: str, digests: Iterable[bytes]) -> list[bytes]:
        now = time.monotonic()
        out = []
        with self._lock:
            for d in digests:
                seen = self._data.get((thread_id, d))
                if seen is None or now - seen > self.ttl:
                    out.append(d)
        return out

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
