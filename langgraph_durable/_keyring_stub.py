"""PROVISIONAL stand-in for ``langgraph_durable.keyring`` (owned by rekey27, issue 27).

seal27 builds the stores against the contract's API (``is_encrypting``, ``Keyring.seal``,
``Keyring.open``, ``Keyring.digest_key``, ``DecryptionError``) before rekey27's module
lands; ``_sealing`` imports from here in ONE place, switched to ``keyring`` on merge.
This stub seals with the serializer's own cipher (``EncryptedSerializer.cipher``), so
the current key only (no rotation).
"""

from __future__ import annotations

import hashlib
from typing import Any

from langgraph_durable.errors import DurableError

_MAGIC = b"LGS1"


class DecryptionError(DurableError):
    """Provisional: sealed data that the configured key(s) cannot open."""

    def __init__(self, thread_id: str | None, where: str, reason: str, checkpoint_id: str | None = None) -> None:
        at = f"thread {thread_id!r}" + (f", checkpoint {checkpoint_id!r}" if checkpoint_id else "")
        super().__init__(
            f"cannot decrypt {where} of {at}: {reason} (is the saver configured with the key "
            "that encrypted it?)",
            thread_id=thread_id, checkpoint_id=checkpoint_id, where=where, reason=reason,
        )


def is_encrypting(serde: Any) -> bool:
    return getattr(serde, "cipher", None) is not None and hasattr(serde.cipher, "encrypt")


class Keyring:
    def __init__(self, cipher: Any) -> None:
        self._cipher = cipher
        self._digest_key = _closure_key(cipher)

    @classmethod
    def from_serde(cls, serde: Any) -> Keyring | None:
        return cls(serde.cipher) if is_encrypting(serde) else None

    def seal(self, data: bytes) -> bytes:
        name, ct = self._cipher.encrypt(data)
        tag = name.encode()
        return _MAGIC + bytes([len(tag)]) + tag + ct

    def open(self, data: bytes, *, thread_id: str | None, where: str, checkpoint_id: str | None = None) -> bytes:
        data = bytes(data)
        if not data.startswith(_MAGIC) or len(data) < 6:
            raise DecryptionError(thread_id, where, "not a sealed value", checkpoint_id)
        n = data[4]
        name, ct = data[5 : 5 + n].decode(), data[5 + n :]
        try:
            return bytes(self._cipher.decrypt(name, ct))
        except Exception as exc:
            raise DecryptionError(thread_id, where, f"{type(exc).__name__}: {exc}", checkpoint_id) from exc

    def digest_key(self) -> bytes | None:
        return self._digest_key


def _closure_key(cipher: Any) -> bytes:
    """The stub's digest secret: derived from the AES key in the cipher's closure
    (``from_pycryptodome_aes``), else from the cipher's type name (stable, weak)."""
    for fn in (getattr(cipher, "encrypt", None),):
        func = getattr(fn, "__func__", fn)
        for cell in getattr(func, "__closure__", None) or ():
            value = cell.cell_contents
            if isinstance(value, bytes | bytearray) and len(value) in (16, 24, 32):
                return hashlib.sha256(b"langgraph-durable digest key\x00" + bytes(value)).digest()
    return hashlib.sha256(b"langgraph-durable digest key\x00" + type(cipher).__qualname__.encode()).digest()
