"""Test children behind the test PgBouncer: their *own* raw psycopg connections (the
tests' recorders, not the package's, which pass prepare_threshold explicitly, checked
by test_pgbouncer.py::test_package_connections_never_prepare) must not prepare
statements either, as any application's own code behind a transaction pooler."""

import os

if os.environ.get("LANGGRAPH_DURABLE_POOLER") == "transaction":
    import functools

    import psycopg

    for _cls in (psycopg.Connection, psycopg.AsyncConnection):
        _orig = _cls.connect.__func__  # type: ignore[attr-defined]

        def _connect(cls, *args, __orig=_orig, **kwargs):  # type: ignore[no-untyped-def]
            kwargs.setdefault("prepare_threshold", None)
            return __orig(cls, *args, **kwargs)

        _cls.connect = classmethod(functools.wraps(_orig)(_connect))  # type: ignore[method-assign]

    psycopg.connect = psycopg.Connection.connect  # type: ignore[assignment]  # the module alias
