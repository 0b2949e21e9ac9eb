"""Test children behind the test PgBouncer: their *own* raw psycopg connections (the
tests' recorders, not the package's, which set prepare_threshold explicitly and are
checked in test_pgbouncer.py::test_package_connections_never_prepare) must not prepare
statements either, as any application's own code behind a transaction pooler."""

import os

if os.environ.get("LANGGRAPH_DURABLE_POOLER") == "transaction":
    import psycopg._preparing

    psycopg._preparing.PrepareManager.prepare_threshold = None
