"""Issue 27: the sealed forms of what the package stores outside the serializer
(``langgraph_durable._sealing``), over generated values.

* with a key, every form round-trips, and a sealed metadata keeps only the clear keys
  beside the sealed one; another key raises ``DecryptionError`` naming the thread;
* without a key nothing changes: every function returns its input, including values
  that look like a sealed form (a user metadata key named ``lgd:sealed``, a text with the
  prefix);
* the client-side filter on sealed metadata keys (``_sealing.matches``) agrees with
  PostgreSQL's ``jsonb @>`` on the same documents (what the filter would have been in SQL).
"""

from __future__ import annotations

from typing import Any

import orjson
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

from langgraph_durable import _sealing

RING = _sealing.keyring_of(EncryptedSerializer.from_pycryptodome_aes(key=b"k" * 32))
OTHER = _sealing.keyring_of(EncryptedSerializer.from_pycryptodome_aes(key=b"o" * 32))

# JSON PostgreSQL accepts (no NUL, no lone surrogate), small.
text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
scalar = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | text
json_value = st.recursive(
    scalar,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)
keys = st.sampled_from(["source", "step", "run_id", "customer", "lgd:sealed", "tags", "a", "b"]) | text
metadata = st.dictionaries(keys, json_value, max_size=6)


@given(metadata)
@settings(max_examples=80, deadline=None)
def test_sealed_metadata_round_trips_and_keeps_only_the_clear_keys(md: dict[str, Any]) -> None:
    stored = _sealing.seal_metadata(RING, md)
    assert set(stored) - {_sealing.SEALED_METADATA_KEY} <= _sealing.CLEAR_METADATA
    for k, v in stored.items():
        if k != _sealing.SEALED_METADATA_KEY:
            assert md[k] == v
    assert _sealing.open_metadata(RING, stored, thread_id="t", checkpoint_id="c") == md
    if any(k not in _sealing.CLEAR_METADATA for k in md):
        with pytest.raises(_sealing.DecryptionError) as err:
            _sealing.open_metadata(OTHER, stored, thread_id="t", checkpoint_id="c")
        assert err.value.thread_id == "t" and err.value.checkpoint_id == "c"


@given(text, json_value, st.frozensets(keys, max_size=3))
@settings(max_examples=80, deadline=None)
def test_sealed_texts_and_json_round_trip(t: str, value: Any, keep: frozenset[str]) -> None:
    sealed = _sealing.seal_text(RING, t)
    assert sealed is not None and sealed.startswith(_sealing.TEXT_PREFIX) and _sealing.is_sealed(sealed)
    assert _sealing.seal_text(RING, sealed) == sealed  # idempotent: written on as it is
    assert _sealing.open_text(RING, sealed, thread_id="t", where="w") == t
    assert _sealing.open_text(None, sealed, thread_id="t", where="w", strict=False) == _sealing.ENCRYPTED
    with pytest.raises(_sealing.DecryptionError):
        _sealing.open_text(OTHER, sealed, thread_id="t", where="w")
    doc = _sealing.seal_json(RING, value, keep)
    if value is not None:
        assert _sealing.is_sealed(doc) or (isinstance(value, dict) and set(value) <= keep)
    assert _sealing.open_json(RING, doc, thread_id="t", where="w") == value


@given(metadata, text, json_value)
@settings(max_examples=80, deadline=None)
def test_without_a_key_nothing_changes(md: dict[str, Any], t: str, value: Any) -> None:
    looks_sealed = {**md, _sealing.SEALED_METADATA_KEY: t}
    prefixed = _sealing.TEXT_PREFIX + t
    assert _sealing.seal_metadata(None, md) is md
    assert _sealing.seal_text(None, t) is t and _sealing.seal_json(None, value) is value
    assert _sealing.open_metadata(None, looks_sealed, thread_id="t", checkpoint_id=None) == looks_sealed
    assert _sealing.open_text(None, prefixed, thread_id="t", where="w") == prefixed
    plain = {_sealing.JSON_KEY: t}
    assert _sealing.open_json(None, plain, thread_id="t", where="w") == plain
    # With a key too, a plaintext row of that shape (written before encryption) reads as is.
    assert _sealing.open_metadata(RING, looks_sealed, thread_id="t", checkpoint_id=None) == looks_sealed


@pytest.fixture(scope="module")
def conn(dsn: str) -> Any:
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c


@given(st.dictionaries(keys, json_value, max_size=5), st.dictionaries(keys, json_value, max_size=3), st.data())
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_client_side_filter_is_jsonb_containment(conn: Any, doc: dict[str, Any], flt: dict[str, Any], data: Any) -> None:
    if doc and data.draw(st.booleans()):
        # Half the time, a filter built from the document (so matches are common).
        picked = data.draw(st.lists(st.sampled_from(sorted(doc)), max_size=3, unique=True))
        flt = {k: doc[k] for k in picked}
    row = conn.execute("SELECT %s::jsonb @> %s::jsonb", (orjson.dumps(doc).decode(), orjson.dumps(flt).decode())).fetchone()
    assert _sealing.matches(doc, flt) is row[0], (doc, flt)
