"""``DurableEncryptedSerializer`` (see ``keyring.py``), apart because it subclasses
LangGraph's ``EncryptedSerializer``: importing LangGraph's serializers costs ~1 s, which
the keyring module itself must not (the CLI's ``--help`` reaches it)."""

from __future__ import annotations

import warnings
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

    ``digest_from`` is deprecated (digest27): artifact digests and call fingerprints are
    keyed by the database's own random secret (``durable_secrets``, sealed under the
    current key and re-sealed by ``rekey``), so any key may be dropped after a ``rekey``.
    It is still read, for rows written by 0.x releases that keyed them with a secret
    derived from it: they keep matching while it is given, and a database holding such
    rows adopts that derived secret as its stored one on first use. It never encrypts.
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
        if digest_from is not None:
            warnings.warn(
                "DurableEncryptedSerializer(digest_from=...) is deprecated: the digest secret "
                "is stored in the database (durable_secrets) and survives key rotation; "
                "digest_from only matches rows written before it (docs/encryption.md)",
                DeprecationWarning, stacklevel=2,
            )
        self.digest_from = None if digest_from is None else (
            digest_from.encode() if isinstance(digest_from, str) else bytes(digest_from)
        )

    @property
    def current_key_id(self) -> str:
        return self.cipher.ids[0].hex()  # type: ignore[attr-defined]
