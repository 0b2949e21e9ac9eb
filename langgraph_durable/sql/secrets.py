"""``durable_secrets``: the database's own secrets, sealed (digest27, issue 27).

One row per secret, ``sealed`` in ``Keyring.seal``'s form under the key current when it
was written (``langgraph-durable rekey`` re-seals it, ``sql.sealed.SEALED``). The only
one is ``digest``: the random 32-byte HMAC secret of artifact digests and call
fingerprints (``_sealing.DigestSecret``), generated once per database by the first
encrypting saver that needs it, so it outlives every key rotation.
"""

from __future__ import annotations

__all__ = [
    "CREATE_SECRETS_SQL",
    "DIGEST_SECRET",
    "HAS_KEYED_ROWS_SQL",
    "INSERT_SECRET_SQL",
    "READ_SECRET_SQL",
]

DIGEST_SECRET = "digest"

# The migration (sql.schema.MIGRATIONS).
CREATE_SECRETS_SQL = """CREATE TABLE IF NOT EXISTS durable_secrets (
        name TEXT PRIMARY KEY,
        sealed BYTEA NOT NULL,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now()
    )"""

READ_SECRET_SQL = "SELECT sealed FROM durable_secrets WHERE name = %s"
# Concurrent first savers: each offers its own, one wins, all read the winner's.
INSERT_SECRET_SQL = "INSERT INTO durable_secrets (name, sealed) VALUES (%s, %s) ON CONFLICT (name) DO NOTHING"
# Whether rows keyed by the secret main derived from a key may exist (written before
# this table): then that derived secret is adopted instead of a random one, so those rows
# keep matching after the key they came from is dropped.
HAS_KEYED_ROWS_SQL = """SELECT EXISTS (SELECT 1 FROM durable_ledger)
        OR EXISTS (SELECT 1 FROM durable_artifacts) AS found"""
