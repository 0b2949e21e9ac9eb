"""``DurableEncryptedSerializer`` (see ``keyring.py``), apart because it subclasses
LangGraph's ``EncryptedSerializer``: importing LangGraph's serializers costs ~1 s, which
the keyring module itself must not (the CLI's ``--help`` reaches it)."""

from __future__ import annotations

from collections.abc import Iterable

from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from .keyring import RotatingAesCipher, _key_bytes

__all__ = ["DurableEncryptedSerializer"]


class DurableEncryptedSerializer(EncryptedSerializer):
    """``EncryptedSerializer`` with key rotation: writes with ``current``, reads values
    written with ``current`` or any of ``old`` (LangGraph's ``from_pycryptodome_aes``
    form, so a database written with LangGraph's serializer moves to it as it is).

    ``digest_from``: the secret artifact digests are keyed from (HMAC-SHA256), default
    the oldest key given (the last of ``old``, else ``current``), so a rotation keeps
    deduplicating. Pin it (the first key a database was encrypted with, or any fixed
    secret) before dropping that key from ``old``; it is never used to encrypt.
    """

    def __init__(
        self,
        current: bytes | str,
        old: Iterable[bytes | str] = (),
        *,
        serde: SerializerProtocol | None = None,
        digest_from: bytes | str | None = None,
    ) -> None:
        keys = [_key_bytes(current, "current")] + [_key_bytes(k, "old") for k in old]
        super().__init__(RotatingAesCipher(keys), serde if serde is not None else JsonPlusSerializer())
        self.digest_from = None if digest_from is None else (
            digest_from.encode() if isinstance(digest_from, str) else bytes(digest_from)
        )

    @property
    def current_key_id(self) -> str:
        return self.cipher.ids[0].hex()  # type: ignore[attr-defined]
