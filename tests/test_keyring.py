"""keyring.py: sealing with key ids, rotation, LangGraph's ``+aes`` form both ways,
typed refusals (no database: pure functions)."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from langgraph_durable.errors import ConfigurationError, DecryptionError
from langgraph_durable.keyring import (
    DurableEncryptedSerializer,
    Keyring,
    is_encrypting,
    is_sealed,
    key_id,
)

OLD = b"o" * 32
NEW = b"n" * 32


def _ring(current: bytes, *old: bytes) -> Keyring:
    ring = Keyring.from_serde(DurableEncryptedSerializer(current, old=old))
    assert ring is not None
    return ring


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=4096))
def test_seal_open_round_trip_any_bytes(data: bytes) -> None:
    ring = _ring(NEW)
    sealed = ring.seal(data)
    assert is_sealed(sealed)
    assert data not in sealed[4 + 8 + 32 :] or len(data) < 4  # ciphertext, not the data
    assert ring.open(sealed, thread_id="t", where="x") == data


def test_sealed_form_names_the_key_and_rotation_reads_old() -> None:
    sealed_old = _ring(OLD).seal(b"secret")
    assert sealed_old[4:12] == key_id(OLD)
    rotated = _ring(NEW, OLD)
    assert rotated.open(sealed_old, thread_id="t", where="x") == b"secret"
    resealed = rotated.recrypt_sealed(sealed_old, thread_id="t", where="x")
    assert resealed is not None and resealed[4:12] == key_id(NEW)
    assert rotated.recrypt_sealed(resealed, thread_id="t", where="x") is None  # never twice
    assert _ring(NEW).open(resealed, thread_id="t", where="x") == b"secret"


def test_wrong_key_is_typed_and_names_the_thread() -> None:
    sealed = _ring(OLD).seal(b"secret")
    with pytest.raises(DecryptionError) as info:
        _ring(NEW).open(sealed, thread_id="thread-7", where="durable_ledger.result", checkpoint_id="c1")
    err = info.value
    assert err.thread_id == "thread-7" and err.checkpoint_id == "c1"
    assert err.where == "durable_ledger.result" and err.key_id == key_id(OLD).hex()
    assert "thread-7" in str(err)
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is DecryptionError and again.thread_id == "thread-7"


def test_tampered_bytes_fail_authentication() -> None:
    ring = _ring(NEW)
    sealed = bytearray(ring.seal(b"secret value"))
    sealed[-1] ^= 1
    with pytest.raises(DecryptionError, match="authentication failed"):
        ring.open(bytes(sealed), thread_id="t", where="x")
    with pytest.raises(DecryptionError, match="not in the sealed form"):
        ring.open(b"plain", thread_id="t", where="x")


def test_langgraph_serializer_and_ours_read_each_other() -> None:
    stock = EncryptedSerializer.from_pycryptodome_aes(key=OLD)
    ours = DurableEncryptedSerializer(NEW, old=[OLD])
    value = {"card": "4111 1111 1111 1111", "n": [1, 2.5, None]}
    assert ours.loads_typed(stock.dumps_typed(value)) == value  # old key, LangGraph's form
    assert EncryptedSerializer.from_pycryptodome_aes(key=NEW).loads_typed(ours.dumps_typed(value)) == value
    typ, _ = ours.dumps_typed(value)
    assert typ.endswith("+aes")
    with pytest.raises(DecryptionError):
        DurableEncryptedSerializer(NEW).loads_typed(stock.dumps_typed(value))


def test_keyring_from_langgraph_serializer_knows_its_key() -> None:
    stock = EncryptedSerializer.from_pycryptodome_aes(key=OLD)
    ring = Keyring.from_serde(stock)
    assert ring is not None and ring.current_id == key_id(OLD).hex()
    assert _ring(NEW, OLD).open(ring.seal(b"x"), thread_id="t", where="w") == b"x"
    assert ring.digest_key() == _ring(OLD).digest_key()
    typ, ct = stock.dumps_typed("v")
    assert ring.recrypt_serde(ct, thread_id="t", where="w") is None
    moved = _ring(NEW, OLD).recrypt_serde(ct, thread_id="t", where="w")
    assert moved is not None and moved != ct
    assert DurableEncryptedSerializer(NEW).loads_typed((typ, moved)) == "v"
    assert Keyring.from_serde(JsonPlusSerializer()) is None
    assert not is_encrypting(JsonPlusSerializer()) and is_encrypting(stock)


def test_digest_key_is_secret_and_survives_rotation() -> None:
    assert _ring(NEW).digest_key() != _ring(OLD).digest_key()
    assert NEW not in (_ring(NEW).digest_key() or b"")
    # Rotating to NEW with OLD still listed keeps OLD's digests (dedup goes on) ...
    assert _ring(NEW, OLD).digest_key() == _ring(OLD).digest_key()
    # ... and pinned, it outlives dropping OLD.
    pinned = Keyring.from_serde(DurableEncryptedSerializer(NEW, digest_from=OLD))
    assert pinned is not None and pinned.digest_key() == _ring(OLD).digest_key()
    # Verification accepts each configured key's digest secret.
    assert set(_ring(NEW, OLD).digest_keys()) == {_ring(OLD).digest_key(), _ring(NEW).digest_key()}


def test_custom_cipher_seals_through_the_cipher() -> None:
    class Rot13:
        def encrypt(self, plaintext: bytes) -> tuple[str, bytes]:
            return "rev", plaintext[::-1]

        def decrypt(self, ciphername: str, ciphertext: bytes) -> bytes:
            assert ciphername == "rev"
            return ciphertext[::-1]

    ring = Keyring.from_serde(EncryptedSerializer(Rot13()))
    assert ring is not None and ring.digest_key() is None and ring.current_id == ""
    assert ring.open(ring.seal(b"abc"), thread_id="t", where="w") == b"abc"


def test_bad_key_lengths_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError):
        DurableEncryptedSerializer(b"short")
    with pytest.raises(ConfigurationError):
        DurableEncryptedSerializer(NEW, old=[b"x" * 31])
