"""Key material for encryption at rest: keys with ids, rotation, sealing raw bytes.

Two user-facing forms configure it, both a LangGraph ``EncryptedSerializer`` passed as
``serde=``:

* LangGraph's own ``EncryptedSerializer.from_pycryptodome_aes(key=...)`` (one key);
* ``DurableEncryptedSerializer(current=key, old=[older, ...])``: the same stored form
  (``<type>+aes``: AES-EAX, ``nonce(16) + tag(16) + ciphertext``, so LangGraph's
  serializer with the current key reads what it writes), plus rotation: it writes with
  ``current`` and reads with ``current`` then each ``old`` key in turn.

``Keyring.from_serde(serde)`` turns either into the keyring the package's own sealed
columns use: ``seal(data)`` / ``open(data, thread_id=..., where=...)`` (AES-EAX with the
current key, the key's id in the sealed form so an old key is found without trying
each), ``recrypt`` (what ``langgraph-durable rekey`` does to one value) and the
key-derived digest secrets of the code before digest27 (``digest_keys()``: what
verification still accepts; the digest secret itself is the database's, random and
stored sealed: ``_sealing.op_digest_secret``). A wrong or missing key is a typed
``DecryptionError`` naming the thread and the column, never garbage or ``None``.

Sealed form (``Keyring.seal``)::

    b"LGK" 0x01 | key id (8) | nonce (16) | tag (16) | ciphertext      (a known AES key)
    b"LGK" 0x02 | cipher name | 0x00 | cipher output                    (another cipher)

A key id is the first 8 bytes of HMAC-SHA256(key, "langgraph-durable key id"): it names
the key without revealing it. pycryptodome does the AES (the library LangGraph's
``from_pycryptodome_aes`` uses; ``pip install langgraph-durable[encryption]``).
"""

from __future__ import annotations

import hashlib
import hmac
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .errors import ConfigurationError, DecryptionError

if TYPE_CHECKING:
    from ._keyring_serde import DurableEncryptedSerializer


def __getattr__(name: str) -> Any:
    # The serializer subclasses LangGraph's, which imports langchain_core (~1 s): kept out
    # of this module's import so the CLI's --help (which reaches here through the audit
    # trail) stays light (tests/test_cli_startup.py).
    if name == "DurableEncryptedSerializer":
        from ._keyring_serde import DurableEncryptedSerializer

        return DurableEncryptedSerializer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "CIPHER_NAME",
    "SEALED_PREFIX",
    "DurableEncryptedSerializer",
    "Keyring",
    "RotatingAesCipher",
    "is_encrypting",
    "is_sealed",
    "key_id",
]

CIPHER_NAME = "aes"
SEALED_PREFIX = b"LGK"
_AES_FORM, _CIPHER_FORM = 1, 2
_KID_LABEL = b"langgraph-durable key id"
_DIGEST_LABEL = b"langgraph-durable artifact digest"
_NONCE = _TAG = 16
_KID = 8


def _aes() -> Any:
    try:
        from Crypto.Cipher import AES
    except ImportError:  # pragma: no cover - the [encryption] extra is missing
        raise ConfigurationError(
            "encryption needs pycryptodome: pip install 'langgraph-durable[encryption]'",
            setting="serde",
        ) from None
    return AES


def _key_bytes(key: bytes | str, what: str) -> bytes:
    raw = key.encode() if isinstance(key, str) else bytes(key)
    if len(raw) not in (16, 24, 32):
        raise ConfigurationError(
            f"{what} must be 16, 24 or 32 bytes long (AES-128/192/256), got {len(raw)}",
            setting=what,
        )
    return raw


def key_id(key: bytes) -> bytes:
    """The 8-byte id of ``key`` stored beside what it seals (not the key, not reversible)."""
    return hmac.new(key, _KID_LABEL, hashlib.sha256).digest()[:_KID]


def _eax_seal(key: bytes, data: bytes) -> bytes:
    cipher = _aes().new(key, _aes().MODE_EAX)
    ciphertext, tag = cipher.encrypt_and_digest(data)
    return bytes(cipher.nonce) + tag + ciphertext


def _eax_open(key: bytes, data: bytes) -> bytes | None:
    """Plaintext, or None when the tag fails (not this key, or tampered bytes)."""
    if len(data) < _NONCE + _TAG:
        return None
    cipher = _aes().new(key, _aes().MODE_EAX, nonce=data[:_NONCE])
    try:
        return bytes(cipher.decrypt_and_verify(data[_NONCE + _TAG :], data[_NONCE : _NONCE + _TAG]))
    except ValueError:
        return None


class RotatingAesCipher:
    """LangGraph's ``aes`` cipher form (AES-EAX, ``nonce + tag + ciphertext``) over a
    list of keys: encrypts with the first, decrypts with the first that authenticates."""

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys:
            raise ConfigurationError("an encrypting serializer needs at least one key", setting="serde")
        self.keys: tuple[bytes, ...] = tuple(keys)
        self.ids: tuple[bytes, ...] = tuple(key_id(k) for k in self.keys)

    def encrypt(self, plaintext: bytes) -> tuple[str, bytes]:
        return CIPHER_NAME, _eax_seal(self.keys[0], plaintext)

    def open_with(self, ciphertext: bytes) -> tuple[int, bytes] | None:
        """(index of the key that opened it, plaintext), or None when none does."""
        for index, key in enumerate(self.keys):
            plain = _eax_open(key, ciphertext)
            if plain is not None:
                return index, plain
        return None

    def decrypt(self, ciphername: str, ciphertext: bytes) -> bytes:
        if ciphername != CIPHER_NAME:
            raise DecryptionError(thread_id=None, where="a serialized value",
                                  reason=f"unsupported cipher {ciphername!r}")
        opened = self.open_with(ciphertext)
        if opened is None:
            raise DecryptionError(
                thread_id=None, where="a serialized value",
                reason=f"none of the {len(self.keys)} configured key(s) authenticates it "
                "(a wrong key, or the bytes were altered)",
            )
        return opened[1]


def is_encrypting(serde: Any) -> bool:
    """Whether ``serde`` encrypts (LangGraph's ``EncryptedSerializer`` or a subclass)."""
    if serde is None or "langgraph.checkpoint.serde.encrypted" not in sys.modules:
        return False  # nothing can be one before LangGraph's module is imported
    from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

    return isinstance(serde, EncryptedSerializer)


def is_sealed(data: bytes | memoryview | None) -> bool:
    """Whether stored bytes are in ``Keyring.seal``'s form."""
    return data is not None and bytes(data[:3]) == SEALED_PREFIX


def _pycryptodome_key(cipher: Any) -> bytes | None:
    """The key of LangGraph's ``from_pycryptodome_aes`` cipher in its default EAX mode
    (read from the method's closure), or None for any other cipher."""
    encrypt: Any = getattr(type(cipher), "encrypt", None)
    if encrypt is None or getattr(encrypt, "__qualname__", "") != (
        "EncryptedSerializer.from_pycryptodome_aes.<locals>.PycryptodomeAesCipher.encrypt"
    ):
        return None
    cells = dict(zip(encrypt.__code__.co_freevars, encrypt.__closure__ or (), strict=True))
    try:
        key, kwargs = cells["key"].cell_contents, cells["kwargs"].cell_contents
    except (KeyError, ValueError):
        return None
    if set(kwargs) != {"mode"} or kwargs["mode"] != _aes().MODE_EAX or not isinstance(key, bytes):
        return None
    return key


class Keyring:
    """The keys of an encrypting serializer, for the package's own sealed columns.

    Built by ``from_serde`` (None when the serde does not encrypt). ``keys[0]`` seals;
    every key opens. A cipher that is neither LangGraph's AES nor ours (a custom
    ``CipherProtocol``) still seals and opens, through the cipher, without key ids."""

    def __init__(self, keys: Sequence[bytes] = (), *, cipher: Any = None,
                 digest_from: bytes | None = None) -> None:
        self.keys = tuple(keys)
        self.ids = tuple(key_id(k) for k in self.keys)
        self._by_id = dict(zip(self.ids, self.keys, strict=True))
        self.cipher = cipher if cipher is not None else RotatingAesCipher(self.keys)
        # The key-derived digest secret of the code before digest27 (the OLDEST key given,
        # or ``digest_from``): only matched against rows written by it, and adopted as a
        # database's stored secret when such rows exist and none is stored yet.
        self._digest_from = digest_from if digest_from is not None else (self.keys[-1] if self.keys else None)
        self.stored_secrets: list[bytes] = []

    @classmethod
    def from_serde(cls, serde: Any) -> Keyring | None:
        if not is_encrypting(serde):
            return None
        cipher = serde.cipher
        if isinstance(cipher, RotatingAesCipher):
            return cls(cipher.keys, cipher=cipher, digest_from=getattr(serde, "digest_from", None))
        key = _pycryptodome_key(cipher)
        if key is not None:
            return cls((key,))
        return cls((), cipher=cipher)

    @property
    def current_id(self) -> str:
        """Hex id of the sealing key ("" for a custom cipher)."""
        return self.ids[0].hex() if self.ids else ""

    # -- the package's own columns -----------------------------------------------------
    def seal(self, data: bytes) -> bytes:
        if self.keys:
            return SEALED_PREFIX + bytes([_AES_FORM]) + self.ids[0] + _eax_seal(self.keys[0], data)
        name, out = self.cipher.encrypt(data)
        return SEALED_PREFIX + bytes([_CIPHER_FORM]) + name.encode() + b"\x00" + out

    def open(self, data: bytes, *, thread_id: str | None, where: str,
             checkpoint_id: str | None = None) -> bytes:
        """Plaintext of ``seal``'s output; ``DecryptionError`` when no key opens it."""
        return self._open(bytes(data), thread_id, where, checkpoint_id)[1]

    def _open(self, data: bytes, thread_id: str | None, where: str,
              checkpoint_id: str | None) -> tuple[bool, bytes]:
        """(sealed with the current key, plaintext)."""
        def fail(reason: str, kid: str = "") -> DecryptionError:
            return DecryptionError(thread_id=thread_id, where=where, reason=reason,
                                   checkpoint_id=checkpoint_id, key_id=kid)

        if data[:3] != SEALED_PREFIX or len(data) < 4:
            raise fail("the bytes are not in the sealed form")
        if data[3] == _AES_FORM:
            kid, body = data[4 : 4 + _KID], data[4 + _KID :]
            key = self._by_id.get(kid)
            if key is None:
                raise fail(f"it was sealed with key id {kid.hex()}, which is not configured", kid.hex())
            plain = _eax_open(key, body)
            if plain is None:
                raise fail(f"authentication failed under key id {kid.hex()} (the bytes were altered)", kid.hex())
            return kid == self.ids[0], plain
        if data[3] == _CIPHER_FORM:
            name, _, body = data[4:].partition(b"\x00")
            try:
                return not self.keys, bytes(self.cipher.decrypt(name.decode(), body))
            except DecryptionError as exc:
                raise fail(str(exc.fields.get("reason", exc))) from exc
            except Exception as exc:
                raise fail(f"the cipher refused it ({type(exc).__name__})") from exc
        raise fail(f"unknown sealed form {data[3]}")

    def digest_key(self) -> bytes | None:
        """The key-derived digest secret the code before digest27 keyed new digests and
        fingerprints with (from ``digest_from``, default the oldest key given); None for
        a custom cipher whose key the package cannot see. New ones use the database's
        stored secret; this is what rows written before it carry."""
        if self._digest_from is None:
            return None
        return hmac.new(self._digest_from, _DIGEST_LABEL, hashlib.sha256).digest()

    @property
    def digest_source_id(self) -> str:
        """Key id of the key the digest secret is derived from ("" when there is none)."""
        return key_id(self._digest_from).hex() if self._digest_from is not None else ""

    def digest_keys(self) -> tuple[bytes, ...]:
        """Every key-derived secret a row written before digest27 may be keyed with
        (``digest_key()`` first, then each configured key's): verification accepts them
        beside the stored secret, while their keys are configured."""
        first = self.digest_key()
        out = [] if first is None else [first]
        for key in self.keys:
            derived = hmac.new(key, _DIGEST_LABEL, hashlib.sha256).digest()
            if derived not in out:
                out.append(derived)
        return tuple(out)

    def remember_secret(self, secret: bytes) -> None:
        """Note a database's stored digest secret, read by a saver of this serializer
        (``_sealing.op_digest_secret``): what ``verify_keys`` offers first."""
        if secret not in self.stored_secrets:
            self.stored_secrets.append(secret)

    def verify_keys(self) -> tuple[bytes, ...]:
        """Every secret an encrypted artifact's digest (or a call's fingerprint) may be
        keyed with: the stored digest secrets read through this serializer, then the
        key-derived ones of the code before them (``digest_keys()``)."""
        out = list(self.stored_secrets)
        out.extend(k for k in self.digest_keys() if k not in out)
        return tuple(out)

    # -- rekey -------------------------------------------------------------------------
    def open_serde(self, ciphertext: bytes, *, thread_id: str | None, where: str,
                   checkpoint_id: str | None = None) -> tuple[bool, bytes]:
        """(under the current key, plaintext) of a serde cipher's output (LangGraph's
        ``+aes`` form, no key id: each key is tried, the current one first)."""
        if isinstance(self.cipher, RotatingAesCipher):
            opened = self.cipher.open_with(ciphertext)
            if opened is None:
                raise DecryptionError(
                    thread_id=thread_id, where=where, checkpoint_id=checkpoint_id,
                    reason=f"none of the {len(self.keys)} configured key(s) authenticates it",
                )
            return opened[0] == 0, opened[1]
        try:
            return True, bytes(self.cipher.decrypt(CIPHER_NAME, ciphertext))
        except Exception as exc:
            raise DecryptionError(thread_id=thread_id, where=where, checkpoint_id=checkpoint_id,
                                  reason=f"the cipher refused it ({type(exc).__name__})") from exc

    def recrypt_serde(self, ciphertext: bytes, *, thread_id: str | None, where: str,
                      checkpoint_id: str | None = None) -> bytes | None:
        """``ciphertext`` re-encrypted with the current key, or None when it already is."""
        current, plain = self.open_serde(ciphertext, thread_id=thread_id, where=where,
                                         checkpoint_id=checkpoint_id)
        return None if current else self.cipher.encrypt(plain)[1]

    def recrypt_sealed(self, data: bytes, *, thread_id: str | None, where: str,
                       checkpoint_id: str | None = None) -> bytes | None:
        """``seal`` output re-sealed with the current key, or None when it already is."""
        current, plain = self._open(bytes(data), thread_id, where, checkpoint_id)
        return None if current else self.seal(plain)


def decryption_error(exc: BaseException, *, thread_id: str | None, where: str,
                     checkpoint_id: str | None = None) -> DecryptionError | None:
    """``exc`` (raised while decoding a stored value) as the typed refusal naming the
    thread, when it is a key problem: our cipher's ``DecryptionError`` (re-aimed),
    pycryptodome's failed tag (LangGraph's cipher with a wrong key), or an encrypted
    value met by a serializer without a key. None for anything else (damage)."""
    if isinstance(exc, DecryptionError):
        reason = str(exc.fields.get("reason", exc))
    elif isinstance(exc, ValueError) and "MAC check failed" in str(exc):
        reason = "the key does not authenticate it (a wrong key, or the bytes were altered)"
    elif (isinstance(exc, NotImplementedError) and "serialization type" in str(exc) and "+" in str(exc)) or (
        isinstance(exc, ValueError) and "encrypted but the saver's serializer has no cipher" in str(exc)
    ):
        reason = "it is encrypted and no key was given (serde without a key; --key-file for the CLI)"
    else:
        return None
    return DecryptionError(thread_id=thread_id, where=where, reason=reason, checkpoint_id=checkpoint_id,
                           key_id=str(getattr(exc, "fields", {}).get("key_id", "")))
