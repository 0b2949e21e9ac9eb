"""``durable_secrets``: the database's own secrets, sealed (digest27, issue 27).

One row per secret, ``sealed`` in ``Keyring.seal``'s form under the key current when it
was written (``langgraph-durable rekey`` re-seals it, ``sql.sealed.SEALED``). The only
one is ``digest``: the random 32-byte HMAC secret of artifact digests and call
fingerprints (``_sealing.DigestSecret``), generated once per database by the first
encrypting saver that needs it, so it outlives every key rotation.

Beside it, ``digest.<key id>`` rows (restore27): the digest secrets of other databases
whose archives were restored here (``archive.restore``). They are only *accepted*:
artifacts and call fingerprints keyed by them verify and match; new ones are keyed by
``digest``. Rekey re-seals them like ``digest`` (every row of the table).
"""

from __future__ import annotations

__all__ = [
    "CREATE_SECRETS_SQL",
    "DIGEST_SECRET",
    "EXTRA_SECRET_PREFIX",
    "HAS_KEYED_ROWS_SQL",
    "INSERT_SECRET_SQL",
    "LOCK_SECRET_SQL",
    "READ_EXTRA_SECRETS_SQL",
    "READ_SECRET_SQL",
    "UPDATE_SECRET_SQL",
]

DIGEST_SECRET = "digest"
# The accepted secrets of restored archives: "digest." + hex of the secret's own id.
EXTRA_SECRET_PREFIX = "digest."

# The migration (sql.schema.MIGRATIONS).
CREATE_SECRETS_SQL = """CREATE TABLE IF NOT EXISTS durable_secrets (
        name TEXT PRIMARY KEY,
        sealed BYTEA NOT NULL,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now()
    )"""

READ_SECRET_SQL = "SELECT sealed FROM durable_secrets WHERE name = %s"
READ_EXTRA_SECRETS_SQL = "SELECT name, sealed FROM durable_secrets WHERE starts_with(name, %s) ORDER BY name"
# Concurrent first savers: each offers its own, one wins, all read the winner's.
INSERT_SECRET_SQL = "INSERT INTO durable_secrets (name, sealed) VALUES (%s, %s) ON CONFLICT (name) DO NOTHING"
# Whether rows keyed by the secret main derived from a key may exist (written before
# this table): then that derived secret is adopted instead of a random one, so those rows
# keep matching after the key they came from is dropped.
HAS_KEYED_ROWS_SQL = """SELECT EXISTS (SELECT 1 FROM durable_ledger)
        OR EXISTS (SELECT 1 FROM durable_artifacts) AS found"""
# A restore adopting an archive's secret (restore27): the primary row locked, replaced
# only while nothing is keyed by it (HAS_KEYED_ROWS_SQL, same transaction).
LOCK_SECRET_SQL = "SELECT sealed FROM durable_secrets WHERE name = %s FOR UPDATE"
UPDATE_SECRET_SQL = "UPDATE durable_secrets SET sealed = %s WHERE name = %s"
