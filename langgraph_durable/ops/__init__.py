"""Operator APIs: what an operator (or the CLI) runs against a database.

Each takes a saver (a ``SaverView``) and comes as a sync function and its ``a*`` twin.
This layer sits above the saver's components (core, leases, lifecycle, idempotency) and
below the facade and the CLI; nothing below imports it.
"""
