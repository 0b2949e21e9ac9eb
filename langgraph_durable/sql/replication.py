"""Replication state of the server behind ``read_dsn`` and of the primary: the replay
lag an operator is shown when reads go to a streaming standby (core/reader.py).

No table: these read PostgreSQL's own functions, executable by every role
(``pg_is_in_recovery``, ``pg_last_wal_replay_lsn``, ``pg_last_xact_replay_timestamp``,
``pg_is_wal_replay_paused``, ``pg_current_wal_lsn``).
"""

from __future__ import annotations

# On the primary: where its WAL ends now. Read BEFORE the standby's position, so a
# standby at or past it has replayed every commit made before the look began.
PRIMARY_WAL_LSN_SQL = "SELECT pg_current_wal_lsn()::text AS lsn"

# On the read server. in_recovery false: not a standby (a primary, or a promoted one).
# behind_bytes: WAL bytes between the primary's position (%(primary_lsn)s, NULL when
# the primary did not answer) and what the standby has replayed. since_replay: seconds
# since the last transaction the standby replayed was committed on the primary (NULL
# when none was replayed since the standby started).
STANDBY_LAG_SQL = """
SELECT pg_is_in_recovery() AS in_recovery,
       CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()::text END AS replay_lsn,
       CASE WHEN pg_is_in_recovery() THEN pg_is_wal_replay_paused() ELSE false END AS paused,
       CASE WHEN pg_is_in_recovery() AND %(primary_lsn)s::pg_lsn IS NOT NULL
            THEN pg_wal_lsn_diff(%(primary_lsn)s::pg_lsn, pg_last_wal_replay_lsn())::bigint END
         AS behind_bytes,
       CASE WHEN pg_is_in_recovery()
            THEN extract(epoch FROM clock_timestamp() - pg_last_xact_replay_timestamp())::float8 END
         AS since_replay
"""

# A session of the read pool refuses writes even where read_dsn is a primary.
READ_ONLY_SESSION_SQL = "SET default_transaction_read_only = on"
