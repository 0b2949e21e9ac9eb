"""Replication state of the server behind ``read_dsn`` and of the primary: the replay
lag an operator is shown when reads go to a streaming standby (core/reader.py).

No table: these read PostgreSQL's own functions, executable by every role
(``pg_is_in_recovery``, ``pg_last_wal_replay_lsn``, ``pg_last_xact_replay_timestamp``,
``pg_is_wal_replay_paused``, ``pg_current_wal_lsn``, ``pg_postmaster_start_time``;
``pg_control_system`` where granted).
"""

from __future__ import annotations

# On the primary: where its WAL ends now, its clock, and who it is. Read BEFORE the
# standby's position, so a standby at or past it has replayed every commit made before
# the look began. ``now``: the lag is measured on the primary's clock (the commit times
# a standby replays are the primary's; a standby host whose clock is behind would
# shorten every lag). ``sysid``/``dbname``/``started``: the read server must be a
# replica of this cluster and database (a standby has the primary's system identifier),
# or this very server (its postmaster start time too); pg_control_system() is asked
# only where the role may run it (some managed services revoke it).
PRIMARY_WAL_LSN_SQL = """
SELECT pg_current_wal_lsn()::text AS lsn, clock_timestamp() AS now,
       current_database() AS dbname, pg_postmaster_start_time() AS started,
       CASE WHEN has_function_privilege('pg_control_system()', 'EXECUTE')
            THEN (pg_control_system()).system_identifier::text END AS sysid
"""

# On the read server. in_recovery false: not a standby (a primary, or a promoted one).
# behind_bytes: WAL bytes between the primary's position (%(primary_lsn)s, NULL when
# the primary did not answer) and what the standby has replayed. since_replay: seconds
# since the last transaction the standby replayed was committed on the primary, on the
# primary's clock (%(primary_now)s; the standby's own when the primary did not answer)
# (NULL when none was replayed since the standby started). sysid, dbname, started: as
# the primary's above, to tell a replica of another cluster or database.
STANDBY_LAG_SQL = """
SELECT pg_is_in_recovery() AS in_recovery,
       CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()::text END AS replay_lsn,
       CASE WHEN pg_is_in_recovery() THEN pg_is_wal_replay_paused() ELSE false END AS paused,
       CASE WHEN pg_is_in_recovery() AND %(primary_lsn)s::pg_lsn IS NOT NULL
            THEN pg_wal_lsn_diff(%(primary_lsn)s::pg_lsn, pg_last_wal_replay_lsn())::bigint END
         AS behind_bytes,
       CASE WHEN pg_is_in_recovery()
            THEN extract(epoch FROM coalesce(%(primary_now)s::timestamptz, clock_timestamp())
                                    - pg_last_xact_replay_timestamp())::float8 END
         AS since_replay,
       current_database() AS dbname, pg_postmaster_start_time() AS started,
       CASE WHEN has_function_privilege('pg_control_system()', 'EXECUTE')
            THEN (pg_control_system()).system_identifier::text END AS sysid
"""

def standby_params(primary: dict[str, object] | None) -> dict[str, object]:
    """STANDBY_LAG_SQL's parameters from the primary's row (None: it did not answer)."""
    primary = primary or {}
    return {"primary_lsn": primary.get("lsn"), "primary_now": primary.get("now")}


# A session of the read pool refuses writes even where read_dsn is a primary.
READ_ONLY_SESSION_SQL = "SET default_transaction_read_only = on"
# Behind a transaction pooler a session SET would leak to the pooler's other clients:
# each read of the read pool runs in a transaction that refuses writes instead.
READ_ONLY_TX_SQL = "SET TRANSACTION READ ONLY"
