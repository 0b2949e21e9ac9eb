"""durable_threads SQL of the operator modules (migrations, export): to be folded into
sql/threads.py, the one module for that table's statements."""

# Outside a run (CLI, batch): lock the thread row so no run can take the lease (and
# read the checkpoint) until this transaction commits; the lease columns say whether
# a live run holds it now.
LOCK_THREAD_LEASE_SQL = """
SELECT lease_owner, EXTRACT(EPOCH FROM (lease_expires_at - now()))::float8 AS expires_in
FROM durable_threads WHERE thread_id = %s FOR UPDATE
"""


# A migration (or its undo) moves the thread's recorded version with its checkpoint.
SET_THREAD_VERSION_SQL = "UPDATE durable_threads SET graph_version = %s WHERE thread_id = %s"

# Retention deletes the rows of the threads it deleted (the ones it created to lock them too).
DELETE_THREAD_ROWS_SQL = "DELETE FROM durable_threads WHERE thread_id = ANY(%s)"
